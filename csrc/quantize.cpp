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

std::tuple<at::Tensor, at::Tensor> quantize_mxfp8_cuda(at::Tensor const& x, c10::string_view rule) {
  char const* op = "persistent_gemm.quantize_mxfp8";
  TORCH_CHECK_VALUE(x.dim() == 2, msg(op, ": x must be a 2-D (rows, K) tensor, got ", x.dim(), "-D"));
  DType dtype;
  switch (x.scalar_type()) {
    case at::kBFloat16: dtype = DType::BF16; break;
    case at::kHalf: dtype = DType::FP16; break;
    case at::kFloat: dtype = DType::FP32; break;
    default:
      TORCH_CHECK_TYPE(false, msg(op, ": x must be torch.bfloat16, torch.float16 or torch.float32 on CUDA, got ",
                                  x.scalar_type()));
  }
  TORCH_CHECK_VALUE(rule == "floor" || rule == "rceil", msg(op, ": rule must be 'floor' or 'rceil', got '",
                                                             std::string(rule), "'"));
  c10::cuda::CUDAGuard guard(x.device());
  ArchModule const* mod = arch_for_device(x.get_device());
  TORCH_CHECK(mod, msg(op, ": no persistent_gemm arch module is built for this GPU"));
  int64_t const rows = x.size(0), k = x.size(1), nb = (k + 31) / 32;
  at::Tensor const xs = x.stride(1) == 1 || k <= 1 ? x : x.contiguous();
  auto data = at::empty({rows, k}, x.options().dtype(at::kFloat8_e4m3fn));
  auto scale = at::empty({rows, nb}, x.options().dtype(at::kFloat8_e8m0fnu));
  if (rows == 0 || k == 0) return {data, scale};
  QuantizeJob job;
  job.x = xs.data_ptr();
  job.x_dtype = dtype;
  job.rows = rows, job.k = k, job.ldx = rows > 1 ? xs.stride(0) : k;
  job.data = static_cast<uint8_t*>(data.data_ptr());
  job.ldd = k;
  job.scale = static_cast<uint8_t*>(scale.data_ptr());
  job.ld_scale = nb;
  job.rceil = rule == "rceil";
  cudaError_t const err = mod->table->quantize_mxfp8(job, c10::cuda::getCurrentCUDAStream(x.get_device()));
  TORCH_CHECK(err == cudaSuccess, msg(op, ": launch failed: ", cudaGetErrorString(err)));
  return {data, scale};
}

}  // namespace

TORCH_LIBRARY_IMPL(persistent_gemm, CUDA, m) { m.impl("quantize_mxfp8", &quantize_mxfp8_cuda); }

}  // namespace persistent_gemm
