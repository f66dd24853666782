// CUDA entry points of the ops and the kernel registry they dispatch through.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "persistent_gemm/host/arch_module.h"
#include "persistent_gemm/registry.h"

namespace persistent_gemm {

at::Tensor mm_cuda(at::Tensor const& a, at::Tensor const& b, std::optional<at::ScalarType> out_dtype,
                   std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias, double alpha,
                   double beta);
at::Tensor scaled_mm_cuda(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                          at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                          std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias,
                          double alpha, double beta);
// mxfp8_mm (e2m1 false) and fp8_fp4_mm (e2m1 true): the schema's arguments after e2m1.
at::Tensor mx_mm_cuda(bool e2m1, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                      at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype,
                      c10::string_view scale_layout, std::optional<c10::string_view> config,
                      std::optional<c10::string_view> scale_b_layout, std::optional<at::Tensor> const& bias);

// 16-bit activations x an MX weight: bf16 ones run the decode GEMV (up to its token count) or the
// bf16-route kernels (prefill); fp16 ones, and problems no built kernel fits, the exact reference.
at::Tensor weight_only_mm_cuda(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                               std::optional<at::ScalarType> out_dtype, c10::string_view scale_b_layout,
                               std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias);

// Tests only: fill each kernel's output buffer with NaN before the launch.
void set_poison_outputs(bool on);

// Registry of arch modules, filled from Python at import (persistent_gemm/__init__.py).
struct ArchModule {
  KernelTable const* table;
  host::ScheduleEntry const* schedules;
};
// A second module of an already registered arch (a JIT-compiled config) is merged into that
// arch's table; registering the same kernels again changes nothing.
void register_arch(ArchModule module);
std::deque<ArchModule> const& registered_arches();
// Bumped whenever a table changes: cached decisions of an older generation are stale.
uint64_t registry_generation();
// The module for this device, or nullptr when none is built for its compute capability.
ArchModule const* arch_for_device(int device);
// The module of `a`'s device; throws, naming the built archs, when there is none.
ArchModule const& require_arch(char const* op, at::Tensor const& a);

}  // namespace persistent_gemm
