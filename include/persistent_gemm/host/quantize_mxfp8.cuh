// MXFP8 quantization on the GPU: x (rows, K) in bf16 / fp16 / fp32 -> e4m3 data (rows, K) and
// one e8m0 scale per 1x32 block along K (rows, ceil(K/32)), plain layout. The definition is
// python/persistent_gemm/quant.py's quantize_mxfp8, bit for bit (tests/test_gpu_quant.py):
//   amax over the block (a partial tail block is zero-padded), NaN scale (code 255) when any
//   element is NaN/inf; floor rule E = floor(log2 amax) - 8, rceil rule the smallest E with
//   amax / 2^E <= 448 (from the float32 quotient); E clamped to [-127, 127], amax 0 -> code 0;
//   elements x * 2^-E (exact) clamped to +-448 (NaN kept), rounded to nearest-even e4m3.
// Arch-neutral CUDA: 8 threads own a block, 4 consecutive elements each, so a warp reads 4
// blocks of a row contiguously; the block's amax is a 3-step shuffle reduction.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include "persistent_gemm/registry.h"

namespace persistent_gemm::host {

namespace quant_detail {

constexpr int kBlock = 32;
constexpr int kPerThread = 4;
constexpr int kThreadsPerBlock = kBlock / kPerThread;  // 8 lanes per 1x32 block
constexpr float kE4m3Max = 448.0f;
constexpr int kE4m3Emax = 8;
constexpr int kBias = 127;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Exact float32 2^n for n in [-128, 127]: the bit pattern, 2^-127 as the subnormal 0x00400000
// (quant.py's _exp2_int, which maps every n < -126 there too).
__device__ __forceinline__ float exp2_int(int n) {
  return __int_as_float(n >= -126 ? (n + kBias) << 23 : 0x00400000);
}

__device__ __forceinline__ int block_code(float amax, bool finite, bool rceil) {
  if (!finite) return 255;
  if (amax == 0.0f) return 0;
  int e;
  int exp;
  if (rceil) {
    float const m = frexpf(amax / kE4m3Max, &e);
    exp = m == 0.5f ? e - 1 : e;  // an exact power of two is its own ceiling
  } else {
    frexpf(amax, &e);  // amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1
    exp = e - 1 - kE4m3Emax;
  }
  exp = exp < -kBias ? -kBias : (exp > kBias ? kBias : exp);
  return exp + kBias;
}

template <class T>
__global__ void quantize_mxfp8_kernel(QuantizeJob job) {
  int64_t const t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t const nb = (job.k + kBlock - 1) / kBlock;
  int64_t const blk_id = t / kThreadsPerBlock;
  // Whole 8-lane groups stay together (blockDim is a multiple of 8), so the shuffles below see
  // only active or only inactive lanes of a group; out-of-range groups still join the shuffle.
  bool const live = blk_id < job.rows * nb;
  int64_t const row = live ? blk_id / nb : 0;
  int64_t const blk = live ? blk_id % nb : 0;
  int64_t const col0 = blk * kBlock + (t % kThreadsPerBlock) * kPerThread;
  T const* x = static_cast<T const*>(job.x) + row * job.ldx;

  float v[kPerThread];
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    v[i] = (live && col0 + i < job.k) ? to_float(x[col0 + i]) : 0.0f;
    finite = finite && isfinite(v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int d = 1; d < kThreadsPerBlock; d <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    finite = __shfl_xor_sync(0xffffffffu, int(finite), d) != 0 && finite;
  }
  if (!live) return;
  int const code = block_code(amax, finite, job.rceil);
  float const mult = exp2_int(kBias - code);
  uint8_t* out = job.data + row * job.ldd;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if (col0 + i >= job.k) break;
    float s = v[i] * mult;
    if (!isnan(s)) s = fminf(fmaxf(s, -kE4m3Max), kE4m3Max);  // fminf would drop a NaN
    out[col0 + i] = uint8_t(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3));
  }
  if (t % kThreadsPerBlock == 0) job.scale[row * job.ld_scale + blk] = uint8_t(code);
}

// Rowwise e4m3 (QuantizeJob::rowwise): one CTA per row, amax by a block reduction (NaN wins, as
// torch's amax), the scale as torch computes amax / 448 (times the fp32 reciprocal), then
// x / scale (IEEE division, as torch's tensor / tensor) clamped and rounded to nearest-even.
constexpr int kRowThreads = 256;
constexpr float kRowTiny = 1e-12f;

template <class T>
__global__ void __launch_bounds__(kRowThreads) quantize_rowwise_e4m3_kernel(QuantizeJob job) {
  __shared__ float partial[kRowThreads / 32];
  __shared__ float row_scale;
  int64_t const row = blockIdx.x;
  T const* x = static_cast<T const*>(job.x) + row * job.ldx;
  // max that keeps NaN (fmaxf drops it), as torch's amax does
  auto combine = [](float a, float b) { return isnan(a) || isnan(b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); };
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < job.k; c += kRowThreads) amax = combine(amax, fabsf(to_float(x[c])));
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) amax = combine(amax, __shfl_xor_sync(0xffffffffu, amax, d));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = partial[0];
    for (int w = 1; w < kRowThreads / 32; ++w) m = combine(m, partial[w]);
    // clamp(min=tiny) keeps NaN, as torch's clamp does; torch divides by the scalar 448 as a
    // multiply by its fp32 reciprocal (ATen's div_true_kernel)
    float const s = (isnan(m) ? m : fmaxf(m, kRowTiny)) * (1.0f / kE4m3Max);
    row_scale = s;
    reinterpret_cast<float*>(job.scale)[row] = s;
  }
  __syncthreads();
  float const s = row_scale;
  uint8_t* out = job.data + row * job.ldd;
  for (int64_t c = threadIdx.x; c < job.k; c += kRowThreads) {
    float v = to_float(x[c]) / s;
    if (!isnan(v)) v = fminf(fmaxf(v, -kE4m3Max), kE4m3Max);
    out[c] = uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  }
}

// launch(T{}) with T the element type `t` names (bf16, fp16 or fp32); the launch's error. The
// quantizers' inputs and the MoE routing kernels' (host/moe_routing.cuh) operands.
template <class Launch>
cudaError_t launch_for_element(DType t, Launch&& launch) {
  switch (t) {
    case DType::BF16: launch(__nv_bfloat16{}); break;
    case DType::FP16: launch(__half{}); break;
    case DType::FP32: launch(float{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace quant_detail

inline cudaError_t quantize_rowwise_e4m3(QuantizeJob const& job, cudaStream_t stream) {
  using namespace quant_detail;
  if (job.rows == 0) return cudaSuccess;
  if (job.rows > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_for_element(job.x_dtype, [&](auto element) {
    quantize_rowwise_e4m3_kernel<decltype(element)><<<unsigned(job.rows), kRowThreads, 0, stream>>>(job);
  });
}

inline cudaError_t quantize_mxfp8(QuantizeJob const& job, cudaStream_t stream) {
  using namespace quant_detail;
  if (job.rows < 0 || job.k < 0 || !job.x || !job.data || !job.scale) return cudaErrorInvalidValue;
  if (job.rowwise) return quantize_rowwise_e4m3(job, stream);
  int64_t const threads_total = job.rows * ((job.k + kBlock - 1) / kBlock) * kThreadsPerBlock;
  if (threads_total == 0) return cudaSuccess;
  int const threads = 256;
  unsigned const grid = unsigned((threads_total + threads - 1) / threads);
  return launch_for_element(job.x_dtype, [&](auto element) {
    quantize_mxfp8_kernel<decltype(element)><<<grid, threads, 0, stream>>>(job);
  });
}

}  // namespace persistent_gemm::host
