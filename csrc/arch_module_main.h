// The Python face of an arch module (_C_sm90a, _C_sm100a, a JIT module): it only hands its
// kernel table and scheduler walks to _C, which owns the ops. Included by the generated
// csrc/generated/<arch>/module.cpp so each arch module is a distinct translation unit.
//
// Plain CPython C API, no torch or pybind11 headers: those cost this TU ~36 s of the CI
// machine's time per arch module and every JIT compile, for one function returning a capsule.
#pragma once

#include <Python.h>

#include "persistent_gemm/host/arch_module.h"

#ifndef TORCH_EXTENSION_NAME
#error "TORCH_EXTENSION_NAME (the module's name) is defined by the build: setup.py or the JIT"
#endif
#define PGEMM_PASTE_(a, b) a##b
#define PGEMM_PASTE(a, b) PGEMM_PASTE_(a, b)
#define PGEMM_STRING_(a) #a
#define PGEMM_STRING(a) PGEMM_STRING_(a)

namespace {
persistent_gemm::host::ArchExport const kExport = {&persistent_gemm::host::kKernelTable,
                                                   persistent_gemm::host::schedule_entries()};

PyObject* arch_export(PyObject*, PyObject*) {
  // The capsule's name must outlive it: kArchCapsule is a string literal.
  return PyCapsule_New(const_cast<persistent_gemm::host::ArchExport*>(&kExport),
                       persistent_gemm::host::kArchCapsule, nullptr);
}

PyMethodDef kMethods[] = {
    {"arch_export", arch_export, METH_NOARGS, "This module's kernel table, as a capsule for _C.register_arch."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, PGEMM_STRING(TORCH_EXTENSION_NAME),
    "persistent_gemm kernels for one GPU architecture; loaded by persistent_gemm._C", -1, kMethods,
};
}  // namespace

PyMODINIT_FUNC PGEMM_PASTE(PyInit_, TORCH_EXTENSION_NAME)() {
  PyObject* m = PyModule_Create(&kModule);
  if (m != nullptr && PyModule_AddStringConstant(m, "ARCH", persistent_gemm::host::kKernelTable.arch) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
