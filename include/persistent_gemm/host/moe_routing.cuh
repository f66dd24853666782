// MoE routing on the device, around the two grouped GEMMs of an expert layer (persistent_gemm.moe):
//   moe_dispatch    the slots (token, k) sorted stably by expert -- offs for grouped_mm, each slot's
//                   sorted row -- and the activations (and their MX scales) gathered into that order;
//   moe_activation  SiLU(gate) * up or gpt-oss's clamped SwiGLU, h (rows, 2I) -> (rows, I);
//   moe_combine     each token's top-k rows weighted and summed in fp32, in slot order.
// One launch each, nothing read on the host: a decode step captures in a CUDA graph. The
// definitions (and the CPU path) are csrc/moe_routing.cpp's; the registry's job structs say them.
//
// moe_dispatch, deterministically and without global atomics: every CTA counts all slots by expert
// (warp w owns a contiguous slot range and counts[w][e] in shared memory), scans the counts in
// (expert, warp) order -- so slot s of expert e lands after every earlier slot of e -- and walks
// its warps' slots again, ranking equal experts within a 32-slot batch by __match_any_sync. Each
// CTA copies only the sorted rows of its own range; CTA 0 writes offs and slot_rows. The counting
// is repeated per CTA (S = tokens x top_k index reads from L2), which is what buys one launch.
//
// Programmatic dependent launch, as the grouped GEMVs: each kernel is launched allowed to start
// before the previous kernel on the stream ends, waits for it before reading anything, and lets
// the next kernel start at once (a grouped GEMV then streams its weights while this one runs;
// it reads what this one writes only after its own wait).
#pragma once

#include <cstdint>
#include <cstdio>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "persistent_gemm/host/quantize_mxfp8.cuh"  // quant_detail::to_float, launch_for_element
#include "persistent_gemm/registry.h"

namespace persistent_gemm::host {

namespace moe_detail {

__device__ __forceinline__ void wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

constexpr int kMaxWarps = 16;
constexpr int kCountInts = kMoeMaxExperts;  // counts[warps][experts]: 46 KB, under static shared memory's 48

// Warps that count: as many as the counts table fits, at most 16.
inline int dispatch_warps(int experts) {
  int const w = experts > 0 ? kCountInts / experts : 0;
  return w < 1 ? 0 : (w > kMaxWarps ? kMaxWarps : w);
}

__device__ __forceinline__ int64_t index_at(MoeDispatchJob const& j, int64_t s) {
  return j.indices_64 ? static_cast<int64_t const*>(j.indices)[s] : int64_t(static_cast<int32_t const*>(j.indices)[s]);
}

// Exclusive prefix of v over the block (warps = blockDim.x / 32); `scratch` holds 32 ints.
__device__ __forceinline__ int block_exclusive_scan(int v, int* scratch) {
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    int const y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int const n = blockDim.x / 32;
    int t = lane < n ? scratch[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      int const y = __shfl_up_sync(0xffffffffu, t, d);
      if (lane >= d) t += y;
    }
    if (lane < n) scratch[lane] = t;  // inclusive prefix of the warps' totals
  }
  __syncthreads();
  int const before = warp > 0 ? scratch[warp - 1] : 0;
  __syncthreads();  // scratch is reused by the caller's next scan
  return before + x - v;
}

// The warp copies row `src_row` of every gather to row `dst_row`.
__device__ __forceinline__ void copy_row(MoeDispatchJob const& j, int64_t src_row, int64_t dst_row, int lane) {
  for (int g = 0; g < j.gathers; ++g) {
    MoeGather const& m = j.gather[g];
    uint8_t const* src = static_cast<uint8_t const*>(m.src) + src_row * m.ld_src;
    uint8_t* dst = static_cast<uint8_t*>(m.dst) + dst_row * m.row_bytes;
    bool const vec = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | uintptr_t(m.row_bytes)) % 16) == 0;
    if (vec) {
      for (int64_t c = lane; c < m.row_bytes / 16; c += 32)
        reinterpret_cast<uint4*>(dst)[c] = __ldg(reinterpret_cast<uint4 const*>(src) + c);
    } else {
      for (int64_t c = lane; c < m.row_bytes; c += 32) dst[c] = src[c];
    }
  }
}

__global__ void moe_dispatch_kernel(MoeDispatchJob j) {
  __shared__ int counts[kCountInts];
  __shared__ int scratch[32];
  __shared__ unsigned long long first_bad;
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int const experts = j.experts;
  int64_t const slots = j.tokens * j.top_k;
  int64_t const lo = slots * warp / warps, hi = slots * (warp + 1) / warps;
  for (int i = threadIdx.x; i < warps * experts; i += blockDim.x) counts[i] = 0;
  if (threadIdx.x == 0) first_bad = ~0ull;
  wait_prerequisites();
  launch_dependents();
  __syncthreads();
  // 1. counts[w][e]; the first slot whose index is not an expert.
  for (int64_t s = lo + lane; s < hi; s += 32) {
    int64_t const e = index_at(j, s);
    if (e >= 0 && e < experts)
      atomicAdd(&counts[warp * experts + int(e)], 1);
    else
      atomicMin(&first_bad, static_cast<unsigned long long>(s));
  }
  __syncthreads();
  if (first_bad != ~0ull) {
    // Every CTA stops before writing; one thread says why and fails the launch.
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      int64_t const s = int64_t(first_bad);
      printf("persistent_gemm.moe_dispatch: router_indices[%lld][%lld] = %lld is not an expert index in [0, %d)\n",
             static_cast<long long>(s / j.top_k), static_cast<long long>(s % j.top_k),
             static_cast<long long>(index_at(j, s)), experts);
      __trap();
    }
    return;
  }
  // 2. Exclusive prefix over (expert, warp): entry i is counts[i % warps][i / warps]; each thread
  // scans a contiguous run of entries, in place.
  int const entries = warps * experts;
  int const per = (entries + blockDim.x - 1) / blockDim.x;
  int const i0 = threadIdx.x * per, i1 = min(i0 + per, entries);
  int run = 0;
  for (int i = i0; i < i1; ++i) run += counts[(i % warps) * experts + i / warps];
  int base = block_exclusive_scan(run, scratch);
  for (int i = i0; i < i1; ++i) {
    int& c = counts[(i % warps) * experts + i / warps];
    int const n = c;
    c = base;
    base += n;
  }
  __syncthreads();
  if (blockIdx.x == 0) {  // warp 0's bases are the experts' starts; read before warp 0 moves them
    for (int e = threadIdx.x; e < experts; e += blockDim.x) j.offs[e] = e + 1 < experts ? counts[e + 1] : int32_t(slots);
    __syncthreads();
  }
  // 3. Each slot's sorted row; this CTA's rows [r0, r1) copied.
  int64_t const r0 = slots * blockIdx.x / gridDim.x, r1 = slots * (blockIdx.x + 1) / gridDim.x;
  unsigned const below = (1u << lane) - 1;
  int64_t e_next = lo + lane < hi ? index_at(j, lo + lane) : -1;
  for (int64_t b = lo; b < hi; b += 32) {
    int64_t const s = b + lane;
    bool const live = s < hi;
    int const e = int(e_next);
    e_next = s + 32 < hi ? index_at(j, s + 32) : -1;  // in flight during this batch
    unsigned const peers = __match_any_sync(0xffffffffu, e);
    int const row = live ? counts[warp * experts + e] + __popc(peers & below) : 0;
    __syncwarp();
    if (live && (peers & below) == 0) counts[warp * experts + e] += __popc(peers);
    __syncwarp();
    if (live && blockIdx.x == 0) j.slot_rows[s] = row;
    unsigned mine = __ballot_sync(0xffffffffu, live && row >= r0 && row < r1);
    while (mine) {
      int const l = __ffs(mine) - 1;
      mine &= mine - 1;
      int64_t const src = __shfl_sync(0xffffffffu, s, l) / j.top_k;
      int const dst = __shfl_sync(0xffffffffu, row, l);
      copy_row(j, src, dst, lane);
    }
  }
}

using quant_detail::to_float;

// Element i of a bf16 / fp16 / fp32 array `t` names, as float.
__device__ __forceinline__ float load_any(void const* p, DType t, int64_t i) {
  return t == DType::FP32 ? static_cast<float const*>(p)[i]
                          : (t == DType::FP16 ? to_float(static_cast<__half const*>(p)[i])
                                              : to_float(static_cast<__nv_bfloat16 const*>(p)[i]));
}

__device__ __forceinline__ void store_any(void* p, DType t, int64_t i, float v) {
  if (t == DType::FP32)
    static_cast<float*>(p)[i] = v;
  else if (t == DType::FP16)
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

constexpr int kElemThreads = 256;

// A CTA per (token, 256 columns), tokens strided by gridDim.y: the token's top_k rows summed in
// slot order.
template <class Y>
__global__ void __launch_bounds__(kElemThreads) moe_combine_kernel(MoeCombineJob j) {
  int64_t const c = int64_t(blockIdx.x) * kElemThreads + threadIdx.x;
  wait_prerequisites();
  launch_dependents();
  if (c >= j.d) return;
  for (int64_t t = blockIdx.y; t < j.tokens; t += gridDim.y) {
    float acc = 0.0f;
    for (int64_t k = 0; k < j.top_k; ++k) {
      int64_t const row = j.slot_rows[t * j.top_k + k];
      if (row < 0 || row >= j.y_rows) {  // column 0's thread says which and fails the launch
        if (c == 0) {
          printf("persistent_gemm.moe_combine: slot_rows[%lld] = %lld is not a row of y (%lld rows)\n",
                 static_cast<long long>(t * j.top_k + k), static_cast<long long>(row), static_cast<long long>(j.y_rows));
          __trap();
        }
        return;
      }
      float const w = load_any(j.weights, j.w_dtype, t * j.ld_w + k);
      acc = __fadd_rn(acc, __fmul_rn(w, to_float(static_cast<Y const*>(j.y)[row * j.ld_y + c])));  // no FMA: the CPU's sums
    }
    store_any(j.out, j.out_dtype, t * j.ld_out + c, acc);
  }
}

// The clamps keep a NaN (a comparison that fails leaves the value), as torch's clamp does.
__device__ __forceinline__ float activation(float gate, float up, bool gpt_oss, float alpha, float limit) {
  if (!gpt_oss) return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up);
  gate = gate > limit ? limit : gate;
  up = up > limit ? limit : (up < -limit ? -limit : up);
  float const glu = __fdiv_rn(gate, __fadd_rn(1.0f, expf(-__fmul_rn(alpha, gate))));
  return __fmul_rn(__fadd_rn(up, 1.0f), glu);
}

template <class H>
__global__ void __launch_bounds__(kElemThreads) moe_activation_kernel(MoeActivationJob j) {
  int64_t const c = int64_t(blockIdx.x) * kElemThreads + threadIdx.x;
  wait_prerequisites();
  launch_dependents();
  if (c >= j.inter) return;
  for (int64_t r = blockIdx.y; r < j.rows; r += gridDim.y) {
    H const* h = static_cast<H const*>(j.h) + r * j.ld_h;
    float const gate = to_float(h[c]), up = to_float(h[j.inter + c]);
    store_any(j.out, j.out_dtype, r * j.ld_out + c, activation(gate, up, j.gpt_oss, j.alpha, j.limit));
  }
}

// <<<grid, threads>>> with the programmatic-serialization attribute.
template <class Job>
cudaError_t launch_pdl(void (*kernel)(Job), dim3 grid, dim3 block, Job const& job, cudaStream_t stream) {
  cudaLaunchAttribute attr[1]{};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, job);
}

constexpr int64_t kMaxGridY = 65535;

}  // namespace moe_detail

inline cudaError_t moe_dispatch(MoeDispatchJob const& job, cudaStream_t stream) {
  int const warps = moe_detail::dispatch_warps(job.experts);
  int64_t const slots = job.tokens * job.top_k;
  if (warps == 0 || job.experts < 1 || job.top_k < 1 || job.gathers < 0 || job.gathers > 2 || slots > INT32_MAX)
    return cudaErrorInvalidValue;
  if (slots == 0) return cudaSuccess;
  // A CTA per sorted row up to two per SM: every CTA counts all slots, so no more than that.
  int64_t const sms = job.sm_count > 0 ? job.sm_count : 1;
  int64_t const ctas = slots < 2 * sms ? slots : 2 * sms;
  return moe_detail::launch_pdl(&moe_detail::moe_dispatch_kernel, dim3(unsigned(ctas)), dim3(unsigned(32 * warps)), job,
                                stream);
}

inline cudaError_t moe_combine(MoeCombineJob const& job, cudaStream_t stream) {
  if (job.tokens == 0 || job.d == 0) return cudaSuccess;
  int64_t const y = job.tokens < moe_detail::kMaxGridY ? job.tokens : moe_detail::kMaxGridY;
  dim3 const grid(unsigned((job.d + moe_detail::kElemThreads - 1) / moe_detail::kElemThreads), unsigned(y));
  return quant_detail::launch_for_element(job.y_dtype, [&](auto y) {
    moe_detail::launch_pdl(&moe_detail::moe_combine_kernel<decltype(y)>, grid, dim3(moe_detail::kElemThreads), job, stream);
  });
}

inline cudaError_t moe_activation(MoeActivationJob const& job, cudaStream_t stream) {
  if (job.rows == 0 || job.inter == 0) return cudaSuccess;
  int64_t const y = job.rows < moe_detail::kMaxGridY ? job.rows : moe_detail::kMaxGridY;
  dim3 const grid(unsigned((job.inter + moe_detail::kElemThreads - 1) / moe_detail::kElemThreads), unsigned(y));
  return quant_detail::launch_for_element(job.h_dtype, [&](auto h) {
    moe_detail::launch_pdl(&moe_detail::moe_activation_kernel<decltype(h)>, grid, dim3(moe_detail::kElemThreads), job,
                           stream);
  });
}

}  // namespace persistent_gemm::host
