// The activation operand of the swap-AB MX kernels (GemmArgs::b, the tokens): what its bytes
// are. The decode GEMV (kernel/sm90_mx_gemv.hpp) and the bf16 route
// (kernel/sm90_mx_bf16_gemm_builder.hpp) take one as a template parameter.
#pragma once

namespace persistent_gemm::kernel {

// e4m3 with e8m0 1x32 block scales (GemmArgs::scale_b; ldb in bytes): mxfp8_mm, fp8_fp4_mm.
struct ActivationsE4m3 {};
// bf16 as the model has them, no scales (ldb in elements): weight_only_mm. Nothing quantized.
struct ActivationsBf16 {};

}  // namespace persistent_gemm::kernel
