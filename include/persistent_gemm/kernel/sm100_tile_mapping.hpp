// The parts of the SM100 kernels that are not tcgen05: which CTA of a 2-SM pair does what, which
// MMA tiles are live at the edges, how many workers the persistent clock gets, and which problems
// the MX kernels accept (their scale factors' blocked layout: layout/mx_blocked.hpp).
//
// Plain arithmetic, host and device, no CUTLASS and no arch-specific instruction, so the same
// functions the SM100 kernels and their host code call are run on the H200 and on a CPU by
// tests/device/sm100_mapping_probe.cu (tests/test_sm100_mapping.py) against Python references
// and against CUTLASS's own Sm1xxBlockScaledConfig layout. What these tests cannot reach is the
// tcgen05 instruction stream itself.
#pragma once

#include <cstdint>

#include "persistent_gemm/layout/mx_blocked.hpp"  // PGEMM_HD

namespace persistent_gemm::kernel {

namespace sm100_map {

// ---- 2-SM pairs ----------------------------------------------------------------------------
// A cta_group::2 MMA spans the CTA pair (rank 2j, 2j+1) of a cluster (the cluster's M-ranks are
// its lowest rank bits: blockIdx.x). The scheduler counts per-CTA tiles, so the pair holds
// m_idx = 2q and 2q+1 (q the MMA tile) and each CTA owns CtaM = MmaM / 2 rows of it.
struct CtaRole {
  bool leader;         // issues the pair's MMAs, holds TMEM rows of half 0
  uint32_t peer_rank;  // the other CTA of the pair (itself for 1-SM)
  int32_t mma_m;       // the MMA tile along M: m_idx / CTAs per MMA
  int32_t half;        // which half of the MMA tile's rows this CTA loads, holds and stores
  int32_t row0;        // first output row of this CTA: m_idx * CtaM
};

PGEMM_HD CtaRole cta_role(uint32_t rank_in_cluster, int32_t m_idx, int ctas_per_mma, int cta_m) {
  CtaRole r;
  r.leader = rank_in_cluster % uint32_t(ctas_per_mma) == 0;
  r.peer_rank = rank_in_cluster ^ uint32_t(ctas_per_mma - 1);
  r.mma_m = m_idx / ctas_per_mma;
  r.half = m_idx % ctas_per_mma;
  r.row0 = m_idx * cta_m;
  return r;
}

// Whether the MMA tile a CTA takes part in writes any output (the leader's half is the lower
// rows, so the tile is live iff the leader's CTA tile is in bounds). A tail peer of a live tile
// must still load its half and drain TMEM; a dead tile's CTAs only keep the cluster in step.
PGEMM_HD bool mma_tile_live(int32_t m_idx, int32_t n_idx, int32_t tiles_m, int32_t tiles_n, int ctas_per_mma) {
  return (m_idx / ctas_per_mma) * ctas_per_mma < tiles_m && n_idx < tiles_n;
}

// ---- persistent workers --------------------------------------------------------------------
// Clusters on the clock: the caller's cap if given, else one per cluster-sized slice of the GPU,
// never more than the device can hold at once (max_active_clusters > 0: the occupancy query's
// answer; GPC shape can make it smaller than sm_count / cluster_size for clusters > 1).
PGEMM_HD int32_t workers(int32_t sm_count, int32_t cluster_size, int32_t max_active_clusters, int32_t max_workers) {
  if (max_workers > 0) return max_workers;
  int32_t w = cluster_size > 0 ? sm_count / cluster_size : 0;
  if (max_active_clusters > 0 && max_active_clusters < w) w = max_active_clusters;
  return w > 0 ? w : 1;
}

// Steps of the clock the busiest worker takes for `ids` cluster ids.
PGEMM_HD int32_t waves(int64_t ids, int32_t workers) {
  return workers > 0 ? int32_t((ids + workers - 1) / workers) : 0;
}

}  // namespace sm100_map

// ---- what the SM100 MX kernels accept -------------------------------------------------------
namespace sm100_mx {

constexpr int kTileK = 128;     // K per pipeline stage: one scale atom column
constexpr int kTileN = 128;     // per-CTA N (see sm100_mx_gemm_builder.hpp)
constexpr int kFp4KAlign = 128; // e2m1 rows via TMA 16U4_ALIGN16B: 128 elements (64 B)
constexpr int kFp8KAlign = 16;  // e4m3 rows: 16 B

enum class Reject : int32_t { None = 0, Extent, KAlign, RowStride, OutRow, Fp4Stride };
// e2m1 operands by TMA (16U4_ALIGN16B) need 32-byte bases and row strides (cuTensorMapEncodeTiled);
// an encode failure is not returned by CuTe, the kernel faults: checked before, by the builder.
constexpr int kFp4TmaAlign = 32;

// lda / ldb count bytes of the row-major (M, K) activations and (N, K) weight; ldd counts D's
// elements. d_bytes: 2 (bf16) or 4 (fp32).
PGEMM_HD Reject rejection(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldd, bool e2m1,
                          int d_bytes, bool d_pad_writable) {
  if (m < 1 || n < 1 || k < 1) return Reject::Extent;
  if (k % (e2m1 ? kFp4KAlign : kFp8KAlign)) return Reject::KAlign;
  int64_t const b_row = e2m1 ? k / 2 : k;
  if (lda < k || ldb < b_row || lda % 16 || ldb % 16) return Reject::RowStride;
  if (e2m1 && ldb % kFp4TmaAlign) return Reject::Fp4Stride;
  // The TMA store writes whole 16-byte chunks at the N edge.
  int64_t const chunk = 16 / d_bytes;
  if (ldd < n || ldd % chunk || (n % chunk && !(d_pad_writable && ldd >= (n + chunk - 1) / chunk * chunk)))
    return Reject::OutRow;
  return Reject::None;
}

inline const char* reason(Reject r) {
  switch (r) {
    case Reject::None: return "";
    case Reject::Extent: return "M, N and K must be >= 1";
    case Reject::KAlign: return "K must be a multiple of 128 for e2m1 weights (16 for e4m3): TMA row rule";
    case Reject::RowStride: return "operand rows must be 16-byte aligned and no shorter than K";
    case Reject::OutRow: return "the output's rows must be whole 16-byte chunks (TMA store)";
    case Reject::Fp4Stride: return "e2m1 weight rows must start 32-byte aligned (TMA 16U4_ALIGN16B)";
  }
  return "unknown";
}

// K the dispatcher pads a copy of both operands to when K breaks the alignment rule: zero data
// past K contributes nothing whatever its scale (the relayout pads scales with 2^0).
PGEMM_HD int64_t padded_k(int64_t k, bool e2m1) {
  int64_t const a = e2m1 ? kFp4KAlign : kFp8KAlign;
  return (k + a - 1) / a * a;
}

}  // namespace sm100_mx

}  // namespace persistent_gemm::kernel
