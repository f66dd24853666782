// The ops' reference implementations (ops.cpp): dequantize exactly, accumulate in fp32, round
// once. Plain ATen on whatever device the tensors are on; the CPU kernels of the ops.
#pragma once

#include <optional>

#include <ATen/ATen.h>

#include "checks.h"  // ScaleLayout

namespace persistent_gemm {

at::Tensor mm_cpu(at::Tensor const& a, at::Tensor const& b, std::optional<at::ScalarType> out_dtype,
                  std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias = std::nullopt,
                  double alpha = 1.0, double beta = 1.0);
at::Tensor scaled_mm_cpu(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                         at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                         std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias = std::nullopt,
                         double alpha = 1.0, double beta = 1.0);
// mxfp8_mm (e2m1 false) and fp8_fp4_mm (e2m1 true): the schema's arguments after e2m1.
at::Tensor mx_mm_ref(bool e2m1, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                     at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, c10::string_view scale_layout,
                     std::optional<c10::string_view> config, std::optional<c10::string_view> scale_b_layout,
                     std::optional<at::Tensor> const& bias = std::nullopt);
// Weight-only MX (bf16/fp16 activations): the weight dequantized exactly, the products summed in
// fp32 on every device (TF32, where a GPU's fp32 matmul takes it, holds both operands exactly),
// rounded once.
at::Tensor weight_only_mm_ref(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                              std::optional<at::ScalarType> out_dtype, c10::string_view scale_b_layout,
                              std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias);

// The references' exact dequantization, for float64 yardsticks (the self-check): the (rows, K)
// fp32 factor 2^(c-127) of each element's e8m0 block scale (code 255: NaN), and packed e2m1
// (rows, K/2) bytes as (rows, K) fp32 values, low nibble first. Both exact in fp32.
at::Tensor block_scale_factors(at::Tensor const& scale, int64_t rows, int64_t k, ScaleLayout layout);
at::Tensor unpack_e2m1(at::Tensor const& packed_rows);
// Plain (rows, blocks) e8m0 codes in the blocked layout (128-row x 4-block tiles, padding zero).
at::Tensor blocked_scale(at::Tensor const& plain);

}  // namespace persistent_gemm
