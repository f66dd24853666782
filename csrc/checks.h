// Input validation shared by the CPU reference and the CUDA dispatch of every op: one set of
// rules, one set of messages, each naming the argument and what was expected.
#pragma once

#include <optional>
#include <string>

#include <ATen/ATen.h>

namespace persistent_gemm {

// The problem an op call describes, after validation.
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  at::ScalarType out_dtype = at::kBFloat16;
};

enum class ScaleKind { Tensorwise, Rowwise };

// Layout of MX block scales (python/persistent_gemm/scale_layout.py): plain row-major
// (rows, ceil(K/32)), or the 128x4-tile "blocked" layout block-scaled tensor cores read.
enum class ScaleLayout { Plain, Blocked };
ScaleLayout parse_scale_layout(char const* op, c10::string_view layout, char const* arg = "scale_layout");
// The layouts of scale_a and scale_b: `scale_layout` for both unless `scale_b_layout` is given
// (a prepared weight's blocked scales beside per-call plain activation scales).
struct ScaleLayouts {
  ScaleLayout a, b;
  char const* b_arg;  // the argument b's layout came from, for messages
};
ScaleLayouts parse_scale_layouts(char const* op, c10::string_view layout, std::optional<c10::string_view> b_layout);

Problem check_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                 std::optional<at::ScalarType> out_dtype);

// Returns the problem and sets `kind` to the scale granularity.
Problem check_scaled_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                        at::Tensor const& scale_a, at::Tensor const& scale_b,
                        std::optional<at::ScalarType> out_dtype, ScaleKind& kind);

Problem check_mxfp8_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                       at::Tensor const& scale_a, at::Tensor const& scale_b,
                       std::optional<at::ScalarType> out_dtype, ScaleLayouts layout);

Problem check_fp8_fp4_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                         at::Tensor const& scale_a, at::Tensor const& scale_b,
                         std::optional<at::ScalarType> out_dtype, ScaleLayouts layout);

// Weight-only MX (issue 24): bf16/fp16 activations a (M, K) row-major, an MX weight b (K, N)
// e4m3 or (K/2, N) packed e2m1, column-major, with its e8m0 scale_b (plain or blocked); the
// output in a's dtype (default) or fp32.
Problem check_weight_only_mm(char const* op, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                             std::optional<at::ScalarType> out_dtype, ScaleLayout layout);

// `config` must name a catalogue entry of the given dtype family ("bf16"/"fp16" for mm,
// "e4m3", "mxfp8", "e4m3xe2m1"); an unknown name lists the catalogue.
void check_config(char const* op, std::optional<c10::string_view> config,
                  std::initializer_list<char const*> families);

// A forced FP8 `config` must not accumulate faster than the caller allows: a `_fastacc` config
// with use_fast_accum=False is refused (a promoting config is fine either way: it is only more
// accurate).
void check_config_accum(char const* op, std::optional<c10::string_view> config, bool use_fast_accum);

// The ops' epilogue terms: D = alpha * (A @ B, scaled) + beta * bias[n], in fp32, rounded once.
struct Epilogue {
  at::Tensor bias;  // (N,) of the output dtype; undefined: none (also when beta == 0)
  double alpha = 1.0, beta = 1.0;
  bool trivial() const { return !bias.defined() && alpha == 1.0; }
};
// bias must be a 1-D (N,) tensor of out_dtype on a's device. beta == 0 drops it, as addmm
// ignores its input then (NaN and inf included).
Epilogue check_epilogue(char const* op, at::Tensor const& a, std::optional<at::Tensor> const& bias, double alpha,
                        double beta, Problem const& p);
// The epilogue on an fp32 accumulator `acc` (M, N), rounded once to out_dtype: the references'
// definition, also what the dispatcher does for a kernel without a fused epilogue or K == 0.
at::Tensor epilogue_reference(at::Tensor acc, Epilogue const& epi, at::ScalarType out_dtype);

// torch's own spelling ("torch.float32"), as the Python side and every other message use.
std::string dtype_name(at::ScalarType t);
// out_dtype or the op's default, which must be bf16, fp16 or fp32.
at::ScalarType resolve_out(char const* op, std::optional<at::ScalarType> out_dtype, at::ScalarType fallback);
void check_scale_dtype(char const* op, char const* arg, at::Tensor const& s);
// `other` on a's device; a on the CPU or a CUDA device (the ops' device rules, naming the argument).
void check_same_device(char const* op, at::Tensor const& a, char const* other_name, at::Tensor const& other);
void check_device_kind(char const* op, at::Tensor const& a);

constexpr int64_t kMxBlock = 32;  // elements per e8m0 scale along K

// e8m0 scales per row of an MX operand with K columns (the last block may be partial).
inline int64_t mx_blocks(int64_t k) { return (k + kMxBlock - 1) / kMxBlock; }
// The ops' rule on K for packed e2m1 weights (fp8_fp4_mm, weight-only MXFP4), also asked of explain.
void check_e2m1_extent(char const* op, int64_t k);

// Each op's whole entry check, in the order its messages are tested, called by both its CPU
// (ops.cpp) and CUDA (dispatch.cpp) entries, so the two accept and refuse the same calls.
struct CheckedCall {
  Problem p;
  Epilogue epi;
  ScaleKind kind = ScaleKind::Tensorwise;  // scaled_mm's scale granularity
  ScaleLayouts layouts{ScaleLayout::Plain, ScaleLayout::Plain, "scale_b_layout"};  // the MX ops' scales
};
CheckedCall checked_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                       std::optional<at::ScalarType> out_dtype, std::optional<c10::string_view> config,
                       std::optional<at::Tensor> const& bias, double alpha, double beta);
CheckedCall checked_scaled_mm(char const* op, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                              at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                              std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias,
                              double alpha, double beta);
// mxfp8_mm (e2m1 = false) and fp8_fp4_mm (e2m1 = true).
CheckedCall checked_mx_mm(char const* op, bool e2m1, at::Tensor const& a, at::Tensor const& b,
                          at::Tensor const& scale_a, at::Tensor const& scale_b,
                          std::optional<at::ScalarType> out_dtype, c10::string_view scale_layout,
                          std::optional<c10::string_view> config, std::optional<c10::string_view> scale_b_layout,
                          std::optional<at::Tensor> const& bias);
// layouts.b: the weight's scale layout (the activations have no scales).
CheckedCall checked_weight_only_mm(char const* op, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                                   std::optional<at::ScalarType> out_dtype, c10::string_view scale_b_layout,
                                   std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias);

}  // namespace persistent_gemm
