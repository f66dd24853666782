// Device passes around the MX bf16 route (collective/sm90_mx_bf16_mma.hpp), arch-neutral CUDA.
//
// mx_bf16_prepass: one launch before the GEMM.
//   weight rows:      (a CTA per 128-row band of the blocked scales) the row's reference exponent
//                     r = its largest e8m0 code (NaN codes and blocks past K excluded; 127 for a
//                     row without one), stored as the fp32 2^(r - 127) the mainloop and the
//                     epilogue read. Rows up to the next 128.
//   activation rows:  (a warp per 1024-element chunk of a token) the same reference per token,
//                     and the token's e4m3 values times
//                     2^(e - r) as bf16, K permuted inside each 32-block as the mainloop's A
//                     fragment expects (mx_detail::bf16_route_source), zero past K. Exact unless
//                     a token's codes span more than 124 binades (then its smallest blocks meet
//                     bf16's subnormals, as they would fp32's in any fp32 accumulation).
//                     bf16 activations (weight-only, a_bf16): reference 1.0, the values copied
//                     into the same K order, exactly.
// mx_dequantize_bf16: e4m3 or packed e2m1 rows times 2^(e - 127) as bf16 in natural order: the
//   "dequantize, then torch.mm" baseline the benchmark measures the fused route against.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include "persistent_gemm/collective/mx_block_scales.hpp"
#include "persistent_gemm/scheduler/grouped_rows.hpp"

namespace persistent_gemm::host {

namespace mx_prepass_detail {
namespace mx = persistent_gemm::collective::mx_detail;

// e8m0 scales: plain rows of `ld` bytes, or the blocked layout (ld == 0; 128 x 4 atoms).
struct ScaleView {
  const uint8_t* p = nullptr;
  int64_t ld = 0;
  int32_t atom_cols = 0;  // ceil(K / 128)
  __device__ uint32_t code(int64_t row, int blk) const {
    if (ld > 0) return p[row * ld + blk];
    return p[((row / mx_blocked::kAtomRows) * atom_cols + blk / 4) * mx_blocked::kAtomBytes + mx_blocked::atom_offset(int(row % mx_blocked::kAtomRows)) +
             blk % 4];
  }
};

__device__ inline float e4m3_value(uint32_t byte) {
  __nv_fp8_e4m3 v;
  v.__x = static_cast<__nv_fp8_storage_t>(byte);
  return float(v);
}

// Exact, branch-free: the 3 magnitude bits under fp32's exponent field's low bits are the value
// times 2^-126 (code 1, 0.5, lands on the subnormal 2^-127); 2^126 is exact in fp32.
__device__ inline float e2m1_value(uint32_t code) {
  float const m = __uint_as_float((code & 7u) << 22) * 0x1p126f;
  return (code & 8u) ? -m : m;
}

// 2^e as fp32 for e in [-254, 254]: two factors keep every product on fp32's rounding path.
__device__ inline float scale_value(float v, int e) { return ldexpf(v, e); }

// Largest non-NaN code of a row (warp-wide), or 127 when there is none.
__device__ inline int row_reference(ScaleView s, int64_t row, int k_blocks, int lane) {
  int r = -1;
  auto take = [&](uint32_t word, int b0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int const c = int((word >> (8 * i)) & 0xFFu);
      r = b0 + i < k_blocks && c != 255 && c > r ? c : r;
    }
  };
  uint8_t const* p = s.p + row * s.ld;
  if (s.ld > 0 && (reinterpret_cast<uintptr_t>(p) % 16) == 0 && s.ld % 16 == 0 && k_blocks % 16 == 0) {
    // Plain rows of whole 16-byte groups: 16 codes per lane per load (K = 8192: one load a lane).
    for (int b = 16 * lane; b < k_blocks; b += 512) {
      uint4 const v = *reinterpret_cast<uint4 const*>(p + b);
      take(v.x, b), take(v.y, b + 4), take(v.z, b + 8), take(v.w, b + 12);
    }
  } else {
    for (int b = lane; b < k_blocks; b += 32) {
      int const c = int(s.code(row, b));
      r = c != 255 && c > r ? c : r;
    }
  }
  r = __reduce_max_sync(0xFFFFFFFFu, r);
  return r < 0 ? 127 : r;
}

__device__ inline float pow2_minus_127(int r) { return __uint_as_float(r == 0 ? 0x00400000u : uint32_t(r) << 23); }
}  // namespace mx_prepass_detail

// One pre-pass: references of `w_rows` weight rows, and the bf16 activations of `a_rows` tokens.
struct MxBf16PrepassJob {
  int32_t k = 0;                     // logical K of both operands
  const uint8_t* w_scale = nullptr;  // weight e8m0 codes (plain rows of w_scale_ld bytes, or blocked: 0)
  int64_t w_scale_ld = 0;
  int32_t w_rows = 0;
  float* w_ref = nullptr;            // round_up(w_rows, 128) floats
  const uint8_t* a = nullptr;        // (a_rows, K) e4m3, row stride lda bytes; or bf16 (a_bf16), lda elements
  bool a_bf16 = false;               // the activations are bf16 without scales (a_scale unused)
  int64_t lda = 0;
  const uint8_t* a_scale = nullptr;
  int64_t a_scale_ld = 0;
  int32_t a_rows = 0;
  float* a_ref = nullptr;            // a_rows floats
  __nv_bfloat16* y = nullptr;        // (a_rows, round_up(K, 32)) bf16, row stride ldy elements (multiple of 32)
  int64_t ldy = 0;
  // A grouped GEMM's rows (offs or counts): checked here, so the launch fails with their error
  // before the GEMM (which clamps them and never traps) reads them.
  persistent_gemm::scheduler::GroupRows groups{};
};

namespace mx_prepass_detail {
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkBlocks = 32;  // 32-blocks of one warp's activation chunk: a block per lane

// A weight band (128 rows): the band's atoms are contiguous; the uint4 at 16 i of an atom holds
// rows i, i+32, i+64, i+96 (4 codes each). Thread t reads column t/32, t/32 + 8, ... for rows
// t%32 + 32 j; the eight warps' maxima meet in shared memory.
inline __device__ void weight_band(MxBf16PrepassJob const& job, int band, int k_blocks, int atom_cols) {
  __shared__ int best[kWarps][mx_blocked::kAtomRows];
  int const t = threadIdx.x, i = t % 32, w = t / 32;
  int r[4] = {-1, -1, -1, -1};
  uint8_t const* base = job.w_scale + int64_t(band) * atom_cols * mx_blocked::kAtomBytes;
  for (int a = w; a < atom_cols; a += kWarps) {
    uint4 const v = reinterpret_cast<uint4 const*>(base + int64_t(a) * mx_blocked::kAtomBytes)[i];
    uint32_t const words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        int const c = int((words[j] >> (8 * b)) & 0xFFu);
        bool const valid = a * 4 + b < k_blocks && c != 255;
        r[j] = valid && c > r[j] ? c : r[j];
      }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) best[w][i + 32 * j] = r[j];
  __syncthreads();
  if (t < mx_blocked::kAtomRows) {
    int m = -1;
#pragma unroll
    for (int x = 0; x < kWarps; ++x) m = max(m, best[x][t]);
    int64_t const row = int64_t(band) * mx_blocked::kAtomRows + t;
    job.w_ref[row] = pow2_minus_127(row < job.w_rows && m >= 0 ? m : 127);
  }
}

// One warp: token `row`'s reference (every warp of the row recomputes it from the row's codes,
// a few hundred bytes from L2), then its chunk of 32 blocks, a block per lane: 32 e4m3 bytes in,
// 64 bf16 bytes out, in the mainloop's fragment order (mx_detail::bf16_route_source).
// A warp: token `row`'s bf16 chunk of 32 blocks (weight-only), a block per lane, copied into the
// mainloop's fragment order; the token's reference is 1.
inline __device__ void bf16_activation_chunk(MxBf16PrepassJob const& job, int64_t row, int chunk, int k_blocks) {
  int const lane = threadIdx.x % 32;
  if (chunk == 0 && lane == 0) job.a_ref[row] = 1.0f;
  int const b = chunk * kChunkBlocks + lane;
  if (b >= k_blocks) return;
  int const k0 = b * mx::kBlockK;
  auto const* a = reinterpret_cast<__nv_bfloat16 const*>(job.a) + row * job.lda + k0;
  alignas(16) uint16_t v[mx::kBlockK];
  if ((reinterpret_cast<uintptr_t>(a) % 16) == 0 && k0 + mx::kBlockK <= job.k) {
#pragma unroll
    for (int i = 0; i < mx::kBlockK / 8; ++i) reinterpret_cast<uint4*>(v)[i] = reinterpret_cast<uint4 const*>(a)[i];
  } else {
#pragma unroll
    for (int i = 0; i < mx::kBlockK; ++i) v[i] = k0 + i < job.k ? reinterpret_cast<uint16_t const*>(a)[i] : uint16_t(0);
  }
  alignas(16) uint16_t out[mx::kBlockK];
#pragma unroll
  for (int p = 0; p < mx::kBlockK; ++p) out[p] = v[mx::bf16_route_source(p)];
  __nv_bfloat16* y = job.y + row * job.ldy + int64_t(b) * mx::kBlockK;
#pragma unroll
  for (int i = 0; i < 4; ++i) reinterpret_cast<uint4*>(y)[i] = reinterpret_cast<uint4 const*>(out)[i];
}

inline __device__ void activation_chunk(MxBf16PrepassJob const& job, int64_t row, int chunk, int k_blocks, int atom_cols) {
  int const lane = threadIdx.x % 32;
  ScaleView const s{job.a_scale, job.a_scale_ld, atom_cols};
  int const r = row_reference(s, row, k_blocks, lane);
  if (chunk == 0 && lane == 0) job.a_ref[row] = pow2_minus_127(r);
  int const b = chunk * kChunkBlocks + lane;
  if (b >= k_blocks) return;  // ldy is K rounded up to whole blocks
  __nv_bfloat16* y = job.y + row * job.ldy + int64_t(b) * mx::kBlockK;
  uint32_t const c = s.code(row, b);
  uint8_t const* a = job.a + row * job.lda + int64_t(b) * mx::kBlockK;
  int const k0 = b * mx::kBlockK;
  uint32_t x[8];
  if ((reinterpret_cast<uintptr_t>(a) % 16) == 0 && k0 + mx::kBlockK <= job.k) {
    uint4 const v0 = reinterpret_cast<uint4 const*>(a)[0], v1 = reinterpret_cast<uint4 const*>(a)[1];
    x[0] = v0.x, x[1] = v0.y, x[2] = v0.z, x[3] = v0.w, x[4] = v1.x, x[5] = v1.y, x[6] = v1.z, x[7] = v1.w;
  } else {
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) word |= (k0 + 4 * w + i < job.k ? uint32_t(a[4 * w + i]) : 0u) << (8 * i);
      x[w] = word;
    }
  }
  // 2^(120 + e - r) undoes the bit placement's 2^-120 and applies the block's share of the scale.
  uint32_t bits = mx::bf16_pow2_bits(120 + int(c) - r);
  bits = c == 255 ? 0x7FC0u : bits;
  uint32_t const mul_bits = bits | (bits << 16);
  __nv_bfloat162 const mul = reinterpret_cast<__nv_bfloat162 const&>(mul_bits);
  // Output word p/2 = 8 kk + 4 half + q holds lane q's pair j = 2 kk + half.
  alignas(16) uint32_t out[16];
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t const pair = mx::e4m3_pair_to_bf16x2(x[2 * q], x[2 * q + 1], j);
      __nv_bfloat162 const v = __hmul2(reinterpret_cast<__nv_bfloat162 const&>(pair), mul);
      out[8 * (j / 2) + 4 * (j % 2) + q] = reinterpret_cast<uint32_t const&>(v);
    }
#pragma unroll
  for (int i = 0; i < 4; ++i) reinterpret_cast<uint4*>(y)[i] = reinterpret_cast<uint4 const*>(out)[i];
}

static __global__ void __launch_bounds__(kThreads) mx_bf16_prepass_kernel(MxBf16PrepassJob job, int w_bands, int chunks) {
  int const k_blocks = (job.k + mx::kBlockK - 1) / mx::kBlockK;
  int const atom_cols = (job.k + mx::kTileK - 1) / mx::kTileK;
  if (job.groups.groups > 0 && blockIdx.x == 0 && threadIdx.x < 32) {
    int32_t const bad = persistent_gemm::scheduler::first_bad_group(job.groups, int(threadIdx.x));
    persistent_gemm::scheduler::trap_on_bad_rows(job.groups, bad, threadIdx.x == 0);
  }
  if (int(blockIdx.x) < w_bands) {
    weight_band(job, blockIdx.x, k_blocks, atom_cols);
    return;
  }
  int64_t const g = (int64_t(blockIdx.x) - w_bands) * kWarps + threadIdx.x / 32;
  if (g >= int64_t(job.a_rows) * chunks) return;
  if (job.a_bf16)
    bf16_activation_chunk(job, g / chunks, int(g % chunks), k_blocks);
  else
    activation_chunk(job, g / chunks, int(g % chunks), k_blocks, atom_cols);
}

// rows x K values (e4m3: K bytes per row; e2m1: K/2 bytes, code 2i in the low nibble of byte
// i). A thread writes 8 consecutive outputs (one 16 B store where aligned).
template <bool kE2m1>
__global__ void __launch_bounds__(256)
    mx_dequantize_bf16_kernel(const uint8_t* data, int64_t ld, ScaleView s, int64_t rows, int32_t k,
                              __nv_bfloat16* out, int64_t ldo) {
  int64_t const groups = (k + 7) / 8;
  int64_t const g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= rows * groups) return;
  int64_t const row = g / groups;
  int const k0 = int(g % groups) * 8;
  uint8_t const* src = data + row * ld;
  uint32_t const c = s.code(row, k0 / mx::kBlockK);
  float const nan = __int_as_float(0x7FC00000);
  alignas(16) __nv_bfloat16 v[8];
  bool const full = k0 + 8 <= k;
  if (kE2m1 && full && (reinterpret_cast<uintptr_t>(src + k0 / 2) % 4) == 0) {
    uint32_t const w = *reinterpret_cast<uint32_t const*>(src + k0 / 2);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = __float2bfloat16_rn(c == 255 ? nan : scale_value(e2m1_value(w >> (4 * i)), int(c) - 127));
  } else if (!kE2m1 && full && (reinterpret_cast<uintptr_t>(src + k0) % 8) == 0) {
    uint2 const w = *reinterpret_cast<uint2 const*>(src + k0);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = __float2bfloat16_rn(c == 255 ? nan : scale_value(e4m3_value(((i < 4 ? w.x : w.y) >> (8 * (i % 4))) & 0xFFu), int(c) - 127));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int const kk = k0 + i;
      float x = 0.0f;
      if (kk < k) x = kE2m1 ? e2m1_value(src[kk / 2] >> (4 * (kk % 2))) : e4m3_value(src[kk]);
      v[i] = __float2bfloat16_rn(c == 255 ? nan : scale_value(x, int(c) - 127));
    }
  }
  __nv_bfloat16* dst = out + row * ldo + k0;
  if (full && (reinterpret_cast<uintptr_t>(dst) % 16) == 0) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<uint4 const*>(v);
  } else {
    for (int i = 0; i < 8 && k0 + i < k; ++i) dst[i] = v[i];
  }
}
}  // namespace mx_prepass_detail

inline cudaError_t mx_bf16_prepass(MxBf16PrepassJob const& job, cudaStream_t stream) {
  namespace d = mx_prepass_detail;
  int const w_bands = (job.w_rows + 127) / 128;
  int const chunks = (job.k + 32 * d::kChunkBlocks - 1) / (32 * d::kChunkBlocks);
  int64_t const a_ctas = (int64_t(job.a_rows) * chunks + d::kWarps - 1) / d::kWarps;
  if (w_bands + a_ctas == 0) return cudaSuccess;
  d::mx_bf16_prepass_kernel<<<unsigned(w_bands + a_ctas), d::kThreads, 0, stream>>>(job, w_bands, chunks);
  return cudaGetLastError();
}

// The baseline's dequantization: (rows, K) MX data and its scales (plain rows of scale_ld bytes,
// or blocked: 0) -> bf16 (rows, K), row stride ldo.
inline cudaError_t mx_dequantize_bf16(bool e2m1, const uint8_t* data, int64_t ld, const uint8_t* scale,
                                      int64_t scale_ld, int64_t rows, int32_t k, __nv_bfloat16* out, int64_t ldo,
                                      cudaStream_t stream) {
  namespace d = mx_prepass_detail;
  if (rows == 0 || k == 0) return cudaSuccess;
  d::ScaleView const s{scale, scale_ld, (k + 127) / 128};
  unsigned const grid = unsigned((rows * ((k + 7) / 8) + 255) / 256);
  if (e2m1)
    d::mx_dequantize_bf16_kernel<true><<<grid, 256, 0, stream>>>(data, ld, s, rows, k, out, ldo);
  else
    d::mx_dequantize_bf16_kernel<false><<<grid, 256, 0, stream>>>(data, ld, s, rows, k, out, ldo);
  return cudaGetLastError();
}

}  // namespace persistent_gemm::host
