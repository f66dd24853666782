// The Python face of an arch module (_C_sm90a, _C_sm100a): it only exports its kernel table
// and scheduler walks to _C, which owns the ops. Included by the generated
// csrc/generated/<arch>/module.cpp so each arch module is a distinct translation unit.
#pragma once

#include <torch/extension.h>

#include "persistent_gemm/host/arch_module.h"

namespace {
persistent_gemm::host::ArchExport const kExport = {&persistent_gemm::host::kKernelTable,
                                                   persistent_gemm::host::schedule_entries()};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "persistent_gemm kernels for one GPU architecture; loaded by persistent_gemm._C";
  m.def("arch_export", [] {
    return py::capsule(static_cast<void const*>(&kExport), persistent_gemm::host::kArchCapsule);
  });
  m.attr("ARCH") = persistent_gemm::host::kKernelTable.arch;
}
