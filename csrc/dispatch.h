// CUDA entry points of the ops and the kernel registry they dispatch through.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "checks.h"
#include "heuristics.h"
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

// Grouped GEMMs (grouped_mm, grouped.cpp): E problems whose rows are known on the device only.
// rows: int32 (E,) on a's device, torch's offs (cumulative ends; rows_ld 0) or the masked form's
// counts (group e's rows at e * rows_ld); the weight's and its blocked scales' bytes between groups.
struct Groups {
  at::Tensor rows;
  int64_t count = 0, rows_ld = 0, weight_stride = 0, scale_stride = 0;
};

// The operands of one GEMM D (M, N) = A (M, K) @ W (N, K)^T in the op's orientation: a the
// activations, w = b^T the weight (any strides for mm / scaled_mm, rows of K for the MX ops;
// grouped: the first group's (N, K) rows); scale_a / scale_b as the op took them (fp32 tensorwise
// / rowwise, or e8m0 per 1x32 block in `layouts`).
struct Operands {
  at::Tensor a, w, scale_a, scale_b;
  ScaleLayouts layouts{ScaleLayout::Plain, ScaleLayout::Plain, "scale_b_layout"};
  Groups const* groups = nullptr;
};

// Tests only: fill each kernel's output buffer with NaN before the launch.
void set_poison_outputs(bool on);
// Whether to: set by tests, or while the self-check runs.
bool poison_outputs();
// A kernel operand's element type (bf16, fp16, fp32, e4m3); any other is an internal error.
DType to_dtype(at::ScalarType t);

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

// The one launch path of every op (dispatch.cpp says what it does).
at::Tensor launch(char const* op, ArchModule const& mod, Request req, Operands in, Problem const& p,
                  Epilogue const& epi);
Request request_for(Problem const& p, DType a, DType b, ScaleMode scale, std::optional<c10::string_view> config);

}  // namespace persistent_gemm
