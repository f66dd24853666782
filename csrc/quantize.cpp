// quantize_mxfp8 on CUDA: the arch module's kernel (host/quantize_mxfp8.cuh), launched on the
// current stream. The definition -- and the CPU path -- is python/persistent_gemm/quant.py,
// whose quantize_mxfp8 calls this op for CUDA tensors; its argument checks run there first,
// and again here in short, so a direct call of the op cannot reach the kernel with bad input.
#include <torch/library.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dispatch.h"
#include "text.h"

namespace persistent_gemm {
namespace {

// A quantizer's input element: bf16, fp16 or fp32.
DType input_dtype(char const* op, at::Tensor const& x) {
  switch (x.scalar_type()) {
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::FP16;
    case at::kFloat: return DType::FP32;
    default:
      TORCH_CHECK_TYPE(false, msg(op, ": x must be torch.bfloat16, torch.float16 or torch.float32 on CUDA, got ",
                                  x.scalar_type()));
  }
}

// The quantizers' shared body: x (rows, K) of `dtype` -> e4m3 data (rows, K) and `scale`, by the
// arch module's kernel on the current stream. `job` arrives with its kind set (the MX rule and
// ld_scale, or rowwise); the input, the data and the scale's pointer are filled here.
std::tuple<at::Tensor, at::Tensor> run_quantizer(char const* op, at::Tensor const& x, DType dtype,
                                                 at::IntArrayRef scale_shape, at::ScalarType scale_dtype,
                                                 QuantizeJob job) {
  c10::cuda::CUDAGuard guard(x.device());
  ArchModule const* mod = arch_for_device(x.get_device());
  TORCH_CHECK(mod, msg(op, ": no persistent_gemm arch module is built for this GPU"));
  int64_t const rows = x.size(0), k = x.size(1);
  at::Tensor const xs = x.stride(1) == 1 || k <= 1 ? x : x.contiguous();
  auto data = at::empty({rows, k}, x.options().dtype(at::kFloat8_e4m3fn));
  auto scale = at::empty(scale_shape, x.options().dtype(scale_dtype));
  if (rows == 0 || k == 0) return {data, scale};
  job.x = xs.data_ptr();
  job.x_dtype = dtype;
  job.rows = rows, job.k = k, job.ldx = rows > 1 ? xs.stride(0) : k;
  job.data = static_cast<uint8_t*>(data.data_ptr());
  job.ldd = k;
  job.scale = static_cast<uint8_t*>(scale.data_ptr());
  cudaError_t const err = mod->table->quantize_mxfp8(job, c10::cuda::getCurrentCUDAStream(x.get_device()));
  TORCH_CHECK(err == cudaSuccess, msg(op, ": launch failed: ", cudaGetErrorString(err)));
  return {data, scale};
}

std::tuple<at::Tensor, at::Tensor> quantize_mxfp8_cuda(at::Tensor const& x, c10::string_view rule) {
  char const* op = "persistent_gemm.quantize_mxfp8";
  TORCH_CHECK_VALUE(x.dim() == 2, msg(op, ": x must be a 2-D (rows, K) tensor, got ", x.dim(), "-D"));
  DType const dtype = input_dtype(op, x);
  TORCH_CHECK_VALUE(rule == "floor" || rule == "rceil", msg(op, ": rule must be 'floor' or 'rceil', got '",
                                                             std::string(rule), "'"));
  int64_t const nb = (x.size(1) + 31) / 32;
  QuantizeJob job;
  job.ld_scale = nb;
  job.rceil = rule == "rceil";
  return run_quantizer(op, x, dtype, {x.size(0), nb}, at::kFloat8_e8m0fnu, job);
}

// quantize_rowwise_e4m3 on CUDA: the fp8_rowwise Linear's activations in one kernel, no host
// synchronisation. The definition -- and the CPU path -- is persistent_gemm.nn._rowwise_e4m3,
// which calls this op for CUDA tensors.
std::tuple<at::Tensor, at::Tensor> quantize_rowwise_e4m3_cuda(at::Tensor const& x) {
  char const* op = "persistent_gemm.quantize_rowwise_e4m3";
  TORCH_CHECK_VALUE(x.dim() == 2, msg(op, ": x must be a 2-D (rows, K) tensor, got ", x.dim(), "-D"));
  TORCH_CHECK_VALUE(x.size(1) > 0, msg(op, ": x must have K > 0 (a row's amax sets its scale)"));
  DType const dtype = input_dtype(op, x);
  QuantizeJob job;
  job.rowwise = true;
  return run_quantizer(op, x, dtype, {x.size(0), 1}, at::kFloat, job);
}

// dequantize_mx on CUDA: (rows, K) e4m3 or (rows, K/2) packed e2m1 data and their plain e8m0
// scales -> bf16 (rows, K). The dequantization the "dequantize, then torch.mm" baseline of
// benchmarks/bench_mx.py pays; quant.py's dequantize_mxfp8 / dequantize_mxfp4 define the values.
at::Tensor dequantize_mx_cuda(at::Tensor const& data, at::Tensor const& scale) {
  char const* op = "persistent_gemm.dequantize_mx";
  bool const e2m1 = data.scalar_type() == at::kFloat4_e2m1fn_x2;
  TORCH_CHECK_TYPE(e2m1 || data.scalar_type() == at::kFloat8_e4m3fn,
                   msg(op, ": data must be torch.float8_e4m3fn or torch.float4_e2m1fn_x2, got ", data.scalar_type()));
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat8_e8m0fnu,
                   msg(op, ": scale must be torch.float8_e8m0fnu, got ", scale.scalar_type()));
  TORCH_CHECK_VALUE(data.dim() == 2 && scale.dim() == 2, msg(op, ": data and scale must be 2-D"));
  TORCH_CHECK_VALUE(data.device() == scale.device(), msg(op, ": data is on ", data.device(), ", scale on ",
                                                         scale.device()));
  int64_t const rows = data.size(0), k = data.size(1) * (e2m1 ? 2 : 1), nb = (k + 31) / 32;
  TORCH_CHECK_VALUE(scale.size(0) == rows && scale.size(1) == nb,
                    msg(op, ": scale must be (", rows, ", ", nb, ") for data of ", rows, " rows and K = ", k,
                        ", got (", scale.size(0), ", ", scale.size(1), ")"));
  c10::cuda::CUDAGuard guard(data.device());
  ArchModule const* mod = arch_for_device(data.get_device());
  TORCH_CHECK(mod, msg(op, ": no persistent_gemm arch module is built for this GPU"));
  auto out = at::empty({rows, k}, data.options().dtype(at::kBFloat16));
  if (rows == 0 || k == 0) return out;
  at::Tensor const d = data.stride(1) == 1 ? data : data.contiguous();
  at::Tensor const s = scale.stride(1) == 1 || nb <= 1 ? scale : scale.contiguous();
  DequantizeJob job;
  job.data = static_cast<uint8_t const*>(d.data_ptr());
  job.e2m1 = e2m1;
  job.rows = rows, job.k = k, job.ld = rows > 1 ? d.stride(0) : d.size(1);
  job.scale = static_cast<uint8_t const*>(s.data_ptr());
  job.ld_scale = rows > 1 ? s.stride(0) : nb;
  job.out = out.data_ptr();
  job.ldo = k;
  cudaError_t const err = mod->table->dequantize_mx(job, c10::cuda::getCurrentCUDAStream(data.get_device()));
  TORCH_CHECK(err == cudaSuccess, msg(op, ": launch failed: ", cudaGetErrorString(err)));
  return out;
}

// quantized_linear on CUDA: one swapped Linear (persistent_gemm.nn) in one op call -- its
// activations' quantizer kernel, then the GEMM op's own CUDA entry (its checks, kernel choice and
// launch), with no second trip through the dispatcher and Python. The CPU path (_ops.py) composes
// the same two definitions.
at::Tensor quantized_linear_cuda(at::Tensor const& x, at::Tensor const& weight_q, at::Tensor const& weight_scale,
                                 c10::string_view format, std::optional<at::ScalarType> out_dtype,
                                 std::optional<at::Tensor> const& bias, c10::string_view rule, bool use_fast_accum,
                                 std::optional<c10::string_view> config) {
  char const* op = "persistent_gemm.quantized_linear";
  auto same_device = [&](char const* name, at::Tensor const& t) {
    TORCH_CHECK_VALUE(t.device() == x.device(), msg(op, ": x is on ", x.device(), ", ", name, " on ", t.device(),
                                                    "; every operand must be on one device"));
  };
  same_device("weight_q", weight_q);
  same_device("weight_scale", weight_scale);
  if (bias && bias->defined()) same_device("bias", *bias);
  TORCH_CHECK(weight_q.dim() == 2, msg(op, ": weight_q must be a 2-D tensor, got ", weight_q.dim(), "-D"));
  int64_t const k = weight_q.size(1) * (weight_q.scalar_type() == at::kFloat4_e2m1fn_x2 ? 2 : 1);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k,
              msg(op, ": x has K = ", x.dim() == 2 ? x.size(1) : -1, ", weight_q K = ", k));
  if (format == "fp8_rowwise") {
    auto const [xq, xs] = quantize_rowwise_e4m3_cuda(x);
    return scaled_mm_cuda(xq, weight_q.t(), xs, weight_scale, out_dtype, use_fast_accum, config, bias, 1.0, 1.0);
  }
  TORCH_CHECK_VALUE(format == "mxfp8" || format == "fp8_fp4",
                    msg(op, ": format must be 'fp8_rowwise', 'mxfp8' or 'fp8_fp4', got '", std::string(format), "'"));
  auto const [xq, xs] = quantize_mxfp8_cuda(x, rule);
  return mx_mm_cuda(format == "fp8_fp4", xq, weight_q.t(), xs, weight_scale, out_dtype, "plain", config, "blocked",
                    bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(persistent_gemm, CUDA, m) {
  m.impl("quantize_mxfp8", &quantize_mxfp8_cuda);
  m.impl("quantize_rowwise_e4m3", &quantize_rowwise_e4m3_cuda);
  m.impl("dequantize_mx", &dequantize_mx_cuda);
  m.impl("quantized_linear", &quantized_linear_cuda);
}

}  // namespace persistent_gemm
