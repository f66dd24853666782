// The op schemas (written once, here) and their CPU reference implementations.
//
// The references *define* each op: dequantize exactly, accumulate in fp32, round once to
// out_dtype. They are deliberately plain ATen so that a reader can check them by eye; the
// CUDA kernels are tested against them (and against float64) on the GPU.
#include <torch/library.h>

#include <ATen/ATen.h>

#include "checks.h"
#include "dispatch.h"

namespace persistent_gemm {
namespace {

// e8m0 code c is exactly 2^(c-127); code 255 is NaN. torch's cast is exact.
at::Tensor expand_block_scale(at::Tensor const& scale, int64_t k) {
  return scale.to(at::kFloat).repeat_interleave(kMxBlock, 1).narrow(1, 0, k);
}

// All 16 e2m1 codes: s e1 e0 m0, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
at::Tensor e2m1_lut() {
  static float const values[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                   -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return at::from_blob(const_cast<float*>(values), {16}, at::kFloat).clone();
}

// (R, K/2) packed bytes -> (R, K) float; element 2i is the low nibble of byte i.
at::Tensor unpack_e2m1(at::Tensor const& packed_rows) {
  auto const bytes = packed_rows.contiguous().view(at::kByte).to(at::kLong);
  auto const lo = at::bitwise_and(bytes, 0xF);
  auto const hi = at::bitwise_right_shift(bytes, 4);
  auto const codes = at::stack({lo, hi}, /*dim=*/2).flatten(1);
  return e2m1_lut().to(packed_rows.device()).index({codes});
}

at::Tensor mm_cpu(at::Tensor const& a, at::Tensor const& b, std::optional<at::ScalarType> out_dtype,
                  std::optional<c10::string_view> config) {
  auto const p = check_mm("persistent_gemm.mm", a, b, out_dtype);
  check_config("persistent_gemm.mm", config, {a.scalar_type() == at::kBFloat16 ? "bf16" : "fp16"});
  return at::mm(a.to(at::kFloat), b.to(at::kFloat)).to(p.out_dtype);
}

at::Tensor scaled_mm_cpu(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                         at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype,
                         std::optional<c10::string_view> config) {
  ScaleKind kind;
  auto const p = check_scaled_mm("persistent_gemm.scaled_mm", a, b, scale_a, scale_b, out_dtype, kind);
  check_config("persistent_gemm.scaled_mm", config, {"e4m3"});
  auto acc = at::mm(a.to(at::kFloat), b.to(at::kFloat));
  // Scales multiply the fp32 accumulator, as the kernel's epilogue does.
  if (kind == ScaleKind::Tensorwise) {
    acc = acc * (scale_a.reshape({}) * scale_b.reshape({}));
  } else {
    acc = acc * scale_a * scale_b;
  }
  return acc.to(p.out_dtype);
}

at::Tensor mxfp8_mm_cpu(at::Tensor const& a, at::Tensor const& a_scale, at::Tensor const& b,
                        at::Tensor const& b_scale, std::optional<at::ScalarType> out_dtype,
                        std::optional<c10::string_view> config) {
  auto const p = check_mxfp8_mm("persistent_gemm.mxfp8_mm", a, a_scale, b, b_scale, out_dtype);
  check_config("persistent_gemm.mxfp8_mm", config, {"mxfp8"});
  auto const da = a.to(at::kFloat) * expand_block_scale(a_scale, p.k);
  auto const db = b.t().to(at::kFloat) * expand_block_scale(b_scale, p.k);  // (N, K)
  return at::mm(da, db.t()).to(p.out_dtype);
}

at::Tensor fp8_fp4_mm_cpu(at::Tensor const& a, at::Tensor const& a_scale, at::Tensor const& b,
                          at::Tensor const& b_scale, std::optional<at::ScalarType> out_dtype,
                          std::optional<c10::string_view> config) {
  auto const p = check_fp8_fp4_mm("persistent_gemm.fp8_fp4_mm", a, a_scale, b, b_scale, out_dtype);
  check_config("persistent_gemm.fp8_fp4_mm", config, {"e4m3xe2m1"});
  auto const da = a.to(at::kFloat) * expand_block_scale(a_scale, p.k);
  auto const db = unpack_e2m1(b.t()) * expand_block_scale(b_scale, p.k);  // (N, K)
  return at::mm(da, db.t()).to(p.out_dtype);
}

}  // namespace

TORCH_LIBRARY(persistent_gemm, m) {
  m.def("mm(Tensor a, Tensor b, ScalarType? out_dtype=None, str? config=None) -> Tensor");
  m.def(
      "scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType? out_dtype=None, "
      "str? config=None) -> Tensor");
  m.def(
      "mxfp8_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, ScalarType? out_dtype=None, "
      "str? config=None) -> Tensor");
  m.def(
      "fp8_fp4_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, ScalarType? out_dtype=None, "
      "str? config=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(persistent_gemm, CPU, m) {
  m.impl("mm", &mm_cpu);
  m.impl("scaled_mm", &scaled_mm_cpu);
  m.impl("mxfp8_mm", &mxfp8_mm_cpu);
  m.impl("fp8_fp4_mm", &fp8_fp4_mm_cpu);
}

TORCH_LIBRARY_IMPL(persistent_gemm, CUDA, m) {
  m.impl("mm", &mm_cuda);
  m.impl("scaled_mm", &scaled_mm_cuda);
  m.impl("mxfp8_mm", &mxfp8_mm_cuda);
  m.impl("fp8_fp4_mm", &fp8_fp4_mm_cuda);
}

}  // namespace persistent_gemm
