// The op schemas (written once, here) and their CPU reference implementations.
//
// The references *define* each op: dequantize exactly, accumulate in fp32, round once to
// out_dtype. They are deliberately plain ATen so that a reader can check them by eye; the
// CUDA kernels are tested against them (and against float64) on the GPU.
#include <torch/autograd.h>
#include <torch/library.h>

#include <ATen/ATen.h>

#include "checks.h"
#include "dispatch.h"
#include "reference.h"
#include "text.h"
#include "persistent_gemm/layout/mx_blocked.hpp"

namespace persistent_gemm {
namespace {

// A blocked scale's bytes as 5-D, in the order sf_byte (layout/mx_blocked.hpp) lays them out:
// (band, atom column, row in group, group, block in atom), the plain code of row
// band * 128 + group * 32 + row in group and block atom column * 4 + block in atom.
std::vector<int64_t> atom_view(int64_t rows, int64_t blocks) {
  using namespace mx_blocked;
  return {padded_rows(rows) / kAtomRows, atoms_k(blocks), kRowGroup, kRowGroups, kAtomBlocks};
}

// A blocked-layout scale (scale_layout.py) back to plain (rows, blocks).
at::Tensor plain_scale(at::Tensor const& scale, int64_t rows, int64_t blocks, ScaleLayout layout) {
  if (layout == ScaleLayout::Plain) return scale;
  auto const tiles = scale.view(at::kByte).reshape(atom_view(rows, blocks));
  return tiles.permute({0, 3, 2, 1, 4}).reshape({mx_blocked::padded_rows(rows), mx_blocked::padded_blocks(blocks)})
      .narrow(0, 0, rows).narrow(1, 0, blocks).view(at::kFloat8_e8m0fnu);
}

}  // namespace

// plain_scale's inverse: plain (rows, blocks) codes in the blocked layout, padding zero (the
// self-check feeds the kernels blocked scales; pg.to_blocked is the Python twin).
at::Tensor blocked_scale(at::Tensor const& plain) {
  int64_t const rows = plain.size(0), blocks = plain.size(1);
  auto codes = at::zeros({mx_blocked::padded_rows(rows), mx_blocked::padded_blocks(blocks)},
                         plain.options().dtype(at::kByte));
  codes.narrow(0, 0, rows).narrow(1, 0, blocks).copy_(plain.view(at::kByte));
  // Plain (band, group, row in group, atom column, block) -> atom_view's order.
  auto const v = atom_view(rows, blocks);
  return codes.view({v[0], v[3], v[2], v[1], v[4]}).permute({0, 3, 2, 1, 4}).reshape({-1})
      .view(at::kFloat8_e8m0fnu);
}

// The (rows, K) fp32 factor each element of an MX operand is multiplied by: e8m0 code c is
// exactly 2^(c-127), code 255 NaN (torch's cast is exact), repeated over its 1x32 block.
at::Tensor block_scale_factors(at::Tensor const& scale, int64_t rows, int64_t k, ScaleLayout layout) {
  return plain_scale(scale, rows, mx_blocks(k), layout).to(at::kFloat).repeat_interleave(kMxBlock, 1).narrow(1, 0, k);
}

// (R, K/2) packed bytes -> (R, K) float; element 2i is the low nibble of byte i. A code is
// s e1 e0 m0: magnitude m0 / 2 when e = 0, else 2^(e-1) (1 + m0 / 2). Computed on the operand's
// device, with no host table: a copy from pageable memory would break CUDA-graph capture.
at::Tensor unpack_e2m1(at::Tensor const& packed_rows) {
  auto const bytes = packed_rows.contiguous().view(at::kByte).to(at::kInt);
  auto const codes = at::stack({at::bitwise_and(bytes, 0xF), at::bitwise_right_shift(bytes, 4)}, /*dim=*/2).flatten(1);
  auto const e = at::bitwise_and(at::bitwise_right_shift(codes, 1), 3).to(at::kFloat);
  auto const m = at::bitwise_and(codes, 1).to(at::kFloat);
  auto const mag = at::where(e == 0, m * 0.5, at::exp2(e - 1) * (m * 0.5 + 1));
  return at::where(at::bitwise_right_shift(codes, 3) == 1, -mag, mag);
}

// The references are plain ATen, so they run on any device: the CPU kernels of the ops, the
// self-check's yardstick and PGEMM_FALLBACK=torch (reference.h).
at::Tensor mm_cpu(at::Tensor const& a, at::Tensor const& b, std::optional<at::ScalarType> out_dtype,
                  std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias, double alpha,
                  double beta) {
  char const* op = "persistent_gemm.mm";
  auto const c = checked_mm(op, a, b, out_dtype, config, bias, alpha, beta);
  return epilogue_reference(at::mm(a.to(at::kFloat), b.to(at::kFloat)), c.epi, c.p.out_dtype);
}

// use_fast_accum only permits a faster kernel; the reference accumulates exactly in fp32.
at::Tensor scaled_mm_cpu(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                         at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                         std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias, double alpha,
                         double beta) {
  char const* op = "persistent_gemm.scaled_mm";
  auto const c = checked_scaled_mm(op, a, b, scale_a, scale_b, out_dtype, use_fast_accum, config, bias, alpha, beta);
  auto acc = at::mm(a.to(at::kFloat), b.to(at::kFloat));
  // Scales multiply the fp32 accumulator, as the kernel's epilogue does.
  if (c.kind == ScaleKind::Tensorwise) {
    acc = acc * (scale_a.reshape({}) * scale_b.reshape({}));
  } else {
    acc = acc * scale_a * scale_b;
  }
  return epilogue_reference(acc, c.epi, c.p.out_dtype);
}

// mxfp8_mm (e2m1 = false) and fp8_fp4_mm (e2m1 = true): both operands dequantized by their
// 1x32 block scales, the e2m1 weight unpacked first.
at::Tensor mx_mm_ref(bool e2m1, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                     at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, c10::string_view scale_layout,
                     std::optional<c10::string_view> config, std::optional<c10::string_view> scale_b_layout,
                     std::optional<at::Tensor> const& bias) {
  char const* op = e2m1 ? "persistent_gemm.fp8_fp4_mm" : "persistent_gemm.mxfp8_mm";
  auto const [p, epi, kind, layout] =
      checked_mx_mm(op, e2m1, a, b, scale_a, scale_b, out_dtype, scale_layout, config, scale_b_layout, bias);
  auto const da = a.to(at::kFloat) * block_scale_factors(scale_a, p.m, p.k, layout.a);
  auto const values = e2m1 ? unpack_e2m1(b.t()) : b.t().to(at::kFloat);  // (N, K)
  auto const db = values * block_scale_factors(scale_b, p.n, p.k, layout.b);
  return epilogue_reference(at::mm(da, db.t()), epi, p.out_dtype);
}

at::Tensor weight_only_mm_ref(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                              std::optional<at::ScalarType> out_dtype, c10::string_view scale_b_layout,
                              std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias) {
  char const* op = "persistent_gemm.weight_only_mm";
  // config is checked there; the reference has nothing to force.
  auto const c = checked_weight_only_mm(op, a, b, scale_b, out_dtype, scale_b_layout, config, bias);
  auto const& p = c.p;
  bool const e2m1 = b.scalar_type() == at::kFloat4_e2m1fn_x2;
  auto const values = e2m1 ? unpack_e2m1(b.t()) : b.t().to(at::kFloat);  // (N, K)
  auto const db = values * block_scale_factors(scale_b, p.n, p.k, c.layouts.b);
  // fp32 products of a 16-bit activation and an MX weight are exact, summed in fp32. Also under
  // TF32 (a global switch a GPU's fp32 matmul may take): its operands keep 11 significant bits,
  // which hold an fp16 or bf16 activation and an MX weight value (at most 4) exactly.
  auto const acc = at::mm(a.to(at::kFloat), db.t());
  return epilogue_reference(acc, c.epi, p.out_dtype);
}

namespace {

// -- mm's autograd: dA = alpha dC B^T, dB = alpha A^T dC (through mm itself), dbias = beta sum dC
// Registered here, in C++, rather than with torch.library.register_autograd: a Python autograd
// kernel runs on every eager call, grad or not, and costs ~5 us of host time per call (measured
// on the dispatcher's CPU path), a tenth of a 2048^3 GEMM on the H200.
using MmSig = at::Tensor(at::Tensor const&, at::Tensor const&, std::optional<at::ScalarType>,
                         std::optional<c10::string_view>, std::optional<at::Tensor> const&, double, double);

at::Tensor call_mm(at::Tensor const& a, at::Tensor const& b, std::optional<at::ScalarType> out_dtype,
                   std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias = std::nullopt,
                   double alpha = 1.0, double beta = 1.0) {
  static auto const op =
      c10::Dispatcher::singleton().findSchemaOrThrow("persistent_gemm::mm", "").typed<MmSig>();
  return op.call(a, b, out_dtype, config, bias, alpha, beta);
}

class MmFunction : public torch::autograd::Function<MmFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& a, at::Tensor const& b,
                            std::optional<at::ScalarType> out_dtype, std::optional<c10::string_view> config,
                            std::optional<at::Tensor> const& bias, double alpha, double beta) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({a, b});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["beta"] = beta;
    ctx->saved_data["bias_dtype"] = bias && bias->defined() ? int64_t(bias->scalar_type()) : int64_t(-1);
    return call_mm(a, b, out_dtype, config, bias, alpha, beta);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto const saved = ctx->get_saved_variables();
    at::Tensor const& a = saved[0];
    at::Tensor const& b = saved[1];
    double const alpha = ctx->saved_data["alpha"].toDouble();
    double const beta = ctx->saved_data["beta"].toDouble();
    // Gradients come back in the input dtype, as torch.mm's do. Autograd may hand over an
    // expanded (stride-0) gradient, which mm rejects; contiguous() is a no-op otherwise.
    // `config` is not forwarded: the backward GEMMs have other shapes and layouts.
    at::Tensor const g = grads[0].to(a.scalar_type()).contiguous();
    at::Tensor da, db, dbias;
    if (ctx->needs_input_grad(0)) da = call_mm(g, b.t(), std::nullopt, std::nullopt, std::nullopt, alpha);
    if (ctx->needs_input_grad(1)) db = call_mm(a.t(), g, std::nullopt, std::nullopt, std::nullopt, alpha);
    // needs_input_grad counts tensor inputs only: a, b, then the bias when one was given.
    int64_t const bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    if (bias_dtype >= 0 && ctx->needs_input_grad(2))
      dbias = (grads[0].to(at::kFloat).sum(0) * beta).to(at::ScalarType(bias_dtype));
    return {da, db, at::Tensor(), at::Tensor(), dbias, at::Tensor(), at::Tensor()};
  }
};

at::Tensor mm_autograd(at::Tensor const& a, at::Tensor const& b, std::optional<at::ScalarType> out_dtype,
                       std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias, double alpha,
                       double beta) {
  bool const bias_grad = bias && bias->defined() && bias->requires_grad();
  // Inference calls skip the graph node entirely.
  if (!at::GradMode::is_enabled() || !(a.requires_grad() || b.requires_grad() || bias_grad)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return call_mm(a, b, out_dtype, config, bias, alpha, beta);
  }
  return MmFunction::apply(a, b, out_dtype, config, bias, alpha, beta);
}

// -- scaled_mm and the MX ops: not differentiable, said so ------------------------------------
// Their operands are quantized (FP8 / e2m1 codes and scales derived from the data), so there is
// no gradient to hand back through them. Without an Autograd kernel torch would run them and
// warn that the backward is "silently incorrect"; instead an input that requires grad (in grad
// mode) is refused, naming the op and the argument. Inference calls pay one flag test, in C++.
void refuse_grad(char const* op, std::initializer_list<std::pair<char const*, at::Tensor const*>> inputs) {
  if (!at::GradMode::is_enabled()) return;
  for (auto const& [name, t] : inputs)
    TORCH_CHECK(!t->defined() || !t->requires_grad(), op, " is not differentiable: its operands are quantized, so no gradient ",
                "flows through them, and '", name, "' requires grad. Train through persistent_gemm.mm (bf16/fp16) ",
                "and quantize for inference, or call it under torch.no_grad() / torch.inference_mode().");
}

// A bias is refused too when it requires grad: the op as a whole is inference-only.
at::Tensor const kNoTensor;
at::Tensor const& or_none(std::optional<at::Tensor> const& t) { return t ? *t : kNoTensor; }

at::Tensor scaled_mm_autograd(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                              at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                              std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias,
                              double alpha, double beta) {
  refuse_grad("persistent_gemm.scaled_mm",
              {{"a", &a}, {"b", &b}, {"scale_a", &scale_a}, {"scale_b", &scale_b}, {"bias", &or_none(bias)}});
  at::AutoDispatchBelowADInplaceOrView below;
  using Sig = at::Tensor(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&,
                         std::optional<at::ScalarType>, bool, std::optional<c10::string_view>,
                         std::optional<at::Tensor> const&, double, double);
  static auto const op = c10::Dispatcher::singleton().findSchemaOrThrow("persistent_gemm::scaled_mm", "").typed<Sig>();
  return op.call(a, b, scale_a, scale_b, out_dtype, use_fast_accum, config, bias, alpha, beta);
}

using MxSig = at::Tensor(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&,
                         std::optional<at::ScalarType>, c10::string_view, std::optional<c10::string_view>,
                         std::optional<c10::string_view>, std::optional<at::Tensor> const&);

template <char const* Name, char const* Schema>
at::Tensor mx_autograd(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a, at::Tensor const& scale_b,
                       std::optional<at::ScalarType> out_dtype, c10::string_view scale_layout,
                       std::optional<c10::string_view> config, std::optional<c10::string_view> scale_b_layout,
                       std::optional<at::Tensor> const& bias) {
  refuse_grad(Name, {{"a", &a}, {"b", &b}, {"scale_a", &scale_a}, {"scale_b", &scale_b}, {"bias", &or_none(bias)}});
  at::AutoDispatchBelowADInplaceOrView below;
  static auto const op = c10::Dispatcher::singleton().findSchemaOrThrow(Schema, "").typed<MxSig>();  // per op
  return op.call(a, b, scale_a, scale_b, out_dtype, scale_layout, config, scale_b_layout, bias);
}
at::Tensor weight_only_autograd(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                                std::optional<at::ScalarType> out_dtype, c10::string_view scale_b_layout,
                                std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias) {
  refuse_grad("persistent_gemm.weight_only_mm", {{"a", &a}, {"b", &b}, {"scale_b", &scale_b}, {"bias", &or_none(bias)}});
  at::AutoDispatchBelowADInplaceOrView below;
  using Sig = at::Tensor(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::ScalarType>,
                         c10::string_view, std::optional<c10::string_view>, std::optional<at::Tensor> const&);
  static auto const op =
      c10::Dispatcher::singleton().findSchemaOrThrow("persistent_gemm::weight_only_mm", "").typed<Sig>();
  return op.call(a, b, scale_b, out_dtype, scale_b_layout, config, bias);
}

constexpr char kMxfp8Name[] = "persistent_gemm.mxfp8_mm";
constexpr char kMxfp8Schema[] = "persistent_gemm::mxfp8_mm";
constexpr char kFp8Fp4Name[] = "persistent_gemm.fp8_fp4_mm";
constexpr char kFp8Fp4Schema[] = "persistent_gemm::fp8_fp4_mm";

}  // namespace

TORCH_LIBRARY(persistent_gemm, m) {
  // The epilogue (every op): D = alpha * (A @ B, scaled) + beta * bias, bias (N,) of out_dtype,
  // fused into the kernel's epilogue on SM90 (one rounding). addmm is mm with a bias.
  m.def(
      "mm(Tensor a, Tensor b, ScalarType? out_dtype=None, str? config=None, Tensor? bias=None, float alpha=1., "
      "float beta=1.) -> Tensor");
  // use_fast_accum: torch._scaled_mm's meaning and default. False: FP8 partial sums are promoted
  // to fp32 every K-tile; True: kernels that accumulate in the tensor core for the whole K loop
  // may be chosen (faster, error growing with K).
  m.def(
      "scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType? out_dtype=None, "
      "bool use_fast_accum=False, str? config=None, Tensor? bias=None, float alpha=1., float beta=1.) -> Tensor");
  // scale_layout: 'plain' (rows, ceil(K/32)) or 'blocked' (128x4 tiles); stated, never guessed.
  // scale_b_layout (None: scale_layout) lets a prepared weight's blocked scales meet per-call
  // plain activation scales.
  m.def(
      "mxfp8_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType? out_dtype=None, "
      "str scale_layout='plain', str? config=None, str? scale_b_layout=None, Tensor? bias=None) -> Tensor");
  m.def(
      "fp8_fp4_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType? out_dtype=None, "
      "str scale_layout='plain', str? config=None, str? scale_b_layout=None, Tensor? bias=None) -> Tensor");
  // Weight-only MX (issue 24): bf16/fp16 activations x an MXFP8 or MXFP4 weight (b's dtype says
  // which), output in a's dtype or fp32. pg.mm(a, prepared_weight) is its Python spelling.
  m.def(
      "weight_only_mm(Tensor a, Tensor b, Tensor scale_b, ScalarType? out_dtype=None, "
      "str scale_b_layout='blocked', str? config=None, Tensor? bias=None) -> Tensor");
  // The GPU kernel of persistent_gemm.quantize_mxfp8 (quant.py, which defines it and runs it on
  // the CPU): (rows, K) float -> e4m3 data and plain (rows, ceil(K/32)) e8m0 scales.
  m.def("quantize_mxfp8(Tensor x, str rule='floor') -> (Tensor, Tensor)");
  // The GPU kernel of the fp8_rowwise Linear's activation quantization (persistent_gemm.nn's
  // _rowwise_e4m3, which defines it): (rows, K) float -> e4m3 data and a (rows, 1) fp32 scale.
  m.def("quantize_rowwise_e4m3(Tensor x) -> (Tensor, Tensor)");
  // The MX dequantization to bf16 (CUDA only): the baseline "dequantize, then torch.mm" pays it.
  m.def("dequantize_mx(Tensor data, Tensor scale) -> Tensor");
  // One swapped Linear of persistent_gemm.nn in one call (its host cost): x (rows, K) bf16 / fp16
  // / fp32 quantized as `format` defines it (fp8_rowwise: e4m3 and a row scale; mxfp8, fp8_fp4:
  // MXFP8 by `rule`), times the prepared weight_q (N, K) with weight_scale (fp8_rowwise: (1, N)
  // fp32; MX: blocked e8m0), i.e. scaled_mm / mxfp8_mm / fp8_fp4_mm of the quantized x and
  // weight_q.t(). CPU: python/persistent_gemm/_ops.py, from the same definitions.
  m.def(
      "quantized_linear(Tensor x, Tensor weight_q, Tensor weight_scale, str format, ScalarType? out_dtype=None, "
      "Tensor? bias=None, str rule='floor', bool use_fast_accum=False, str? config=None) -> Tensor");
}

namespace {

// mxfp8_mm (E2M1 false) and fp8_fp4_mm (true) as the schema declares them, over the one
// implementation of both that takes e2m1 first (mx_mm_ref, mx_mm_cuda).
template <auto MxMm, bool E2M1>
at::Tensor mx_op(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a, at::Tensor const& scale_b,
                 std::optional<at::ScalarType> out_dtype, c10::string_view scale_layout,
                 std::optional<c10::string_view> config, std::optional<c10::string_view> scale_b_layout,
                 std::optional<at::Tensor> const& bias) {
  return MxMm(E2M1, a, b, scale_a, scale_b, out_dtype, scale_layout, config, scale_b_layout, bias);
}

// The GEMM ops of one dispatch key: one list, so the CPU and CUDA keys cannot drift apart.
template <auto Mm, auto ScaledMm, auto MxMm, auto WeightOnlyMm>
void impl_gemm_ops(torch::Library& m) {
  m.impl("mm", Mm);
  m.impl("scaled_mm", ScaledMm);
  m.impl("mxfp8_mm", &mx_op<MxMm, false>);
  m.impl("fp8_fp4_mm", &mx_op<MxMm, true>);
  m.impl("weight_only_mm", WeightOnlyMm);
}

}  // namespace

TORCH_LIBRARY_IMPL(persistent_gemm, CPU, m) { impl_gemm_ops<&mm_cpu, &scaled_mm_cpu, &mx_mm_ref, &weight_only_mm_ref>(m); }

TORCH_LIBRARY_IMPL(persistent_gemm, CUDA, m) {
  impl_gemm_ops<&mm_cuda, &scaled_mm_cuda, &mx_mm_cuda, &weight_only_mm_cuda>(m);
}

namespace {

// Refused like the GEMM ops' operands: x included (its quantization has no derivative), as the
// two-call path refused the scale derived from it.
at::Tensor quantized_linear_autograd(at::Tensor const& x, at::Tensor const& weight_q, at::Tensor const& weight_scale,
                                     c10::string_view format, std::optional<at::ScalarType> out_dtype,
                                     std::optional<at::Tensor> const& bias, c10::string_view rule,
                                     bool use_fast_accum, std::optional<c10::string_view> config) {
  refuse_grad("persistent_gemm.quantized_linear",
              {{"x", &x}, {"weight_q", &weight_q}, {"weight_scale", &weight_scale}, {"bias", &or_none(bias)}});
  at::AutoDispatchBelowADInplaceOrView below;
  using Sig = at::Tensor(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::string_view,
                         std::optional<at::ScalarType>, std::optional<at::Tensor> const&, c10::string_view, bool,
                         std::optional<c10::string_view>);
  static auto const op =
      c10::Dispatcher::singleton().findSchemaOrThrow("persistent_gemm::quantized_linear", "").typed<Sig>();
  return op.call(x, weight_q, weight_scale, format, out_dtype, bias, rule, use_fast_accum, config);
}

}  // namespace

TORCH_LIBRARY_IMPL(persistent_gemm, Autograd, m) {
  m.impl("quantized_linear", &quantized_linear_autograd);
  m.impl("mm", &mm_autograd);
  m.impl("scaled_mm", &scaled_mm_autograd);
  m.impl("mxfp8_mm", &mx_autograd<kMxfp8Name, kMxfp8Schema>);
  m.impl("fp8_fp4_mm", &mx_autograd<kFp8Fp4Name, kFp8Fp4Schema>);
  m.impl("weight_only_mm", &weight_only_autograd);
}

}  // namespace persistent_gemm
