// The consumer half of Sm90MxBlockScaledMma (sm90_mx_block_scaled_mma.hpp declares these members
// and describes the scale expansion and both promotion schedules): per K-tile the e8m0 scales
// expanded to fp32, per 32-K block the RS operand converted from packed e2m1, and mma(), which
// issues the wgmmas and promotes their temporaries into the accumulator. Apart from the types,
// shared memory and producer so that each half reads on its own.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"

#include "persistent_gemm/collective/mx_block_scales.hpp"
#include "persistent_gemm/collective/sm90_mx_block_scaled_mma.hpp"

namespace persistent_gemm::collective {

// Expand this stage's e8m0 atoms into fp32, shared by the kMmaThreads threads of the tile.
template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_, class Promotion_>
CUTLASS_DEVICE void Sm90MxBlockScaledMma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Promotion_>::expand_scales(
    TensorStorage& shared, int stage, int kt, int m_off, int n_off, int thread_idx, Params const& params) const {
  float* f = shared.sf_f32[stage];
  int const first_block = kt * mx_detail::kBlocksPerTile;
  auto expand = [&](uint32_t word, int b) {
    uint32_t const code = (word >> (8 * b)) & 0xFFu;
    return first_block + b < params.k_blocks ? mx_detail::e8m0_to_float(code) : 0.0f;
  };
  CUTLASS_PRAGMA_UNROLL
  for (int r = thread_idx; r < kTileM; r += kMmaThreads) {
    int const rr = m_off + r;  // row inside the tile's atom(s)
    uint32_t const w = *reinterpret_cast<uint32_t const*>(
        shared.sf_x[stage] + (rr / 128) * mx_blocked::kAtomBytes + mx_blocked::atom_offset(rr % 128));
    if constexpr (kFold) {
      // The strip's largest and smallest code per block (bytes of w), over its 16 rows: 16
      // consecutive lanes, as kTileM and kMmaThreads are multiples of 32.
      uint32_t hi = w, lo = w;
      CUTLASS_PRAGMA_UNROLL
      for (int s = 1; s < mx_detail::kFoldStripRows; s *= 2) {
        hi = __vmaxu4(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, s));
        lo = __vminu4(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, s));
      }
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) {
        int const code = int((w >> (8 * b)) & 0xFFu), top = int((hi >> (8 * b)) & 0xFFu);
        int const bottom = int((lo >> (8 * b)) & 0xFFu);
        bool const in_k = first_block + b < params.k_blocks;
        bool const fold = in_k && top != 255 && top - bottom <= mx_detail::kFoldShiftMax - mx_detail::kFoldShiftMin;
        int const ref = top - mx_detail::kFoldShiftMax;  // R, in code units
        shared.fold_lut[stage][b * kTileM + r] = mx_detail::e2m1_fold_lut(fold ? code - ref : 0);
        f[b * kTileM + r] = !in_k ? 0.0f
                            : fold ? __uint_as_float(mx_detail::f32_pow2_bits(ref - 127))
                                   : mx_detail::e8m0_to_float(uint32_t(code));
        if (r % mx_detail::kFoldStripRows == 0) shared.fold_mode[stage][b * (kTileM / 16) + r / 16] = fold;
      }
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) f[b * kTileM + r] = expand(w, b);
    }
  }
  float* fc = f + mx_detail::kBlocksPerTile * kTileM;
  CUTLASS_PRAGMA_UNROLL
  for (int c = thread_idx; c < kTileN; c += kMmaThreads) {
    int const cc = n_off + c;
    uint32_t const w = *reinterpret_cast<uint32_t const*>(
        shared.sf_y[stage] + (cc / 128) * mx_blocked::kAtomBytes + mx_blocked::atom_offset(cc % 128));
    int const q = (c / 2) % 4, slot = (c / 8) * 2 + c % 2;
    CUTLASS_PRAGMA_UNROLL
    for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) fc[(b * 4 + q) * kColStride + slot] = expand(w, b);
  }
}

// Packed e2m1 rows of this thread -> the RS wgmma's A fragment of one 32-K block.
// smem row r of a stage is 64 bytes, 64 B-swizzled by TMA: 16 B chunk j of a row sits at
// j ^ (address bits 7..8 of the row). The hardware swizzles absolute shared-memory addresses,
// so the XOR is taken from the row's address, not its index (the buffer need not be 512 B aligned).
// Fold: `lut` holds this stage's per-(block, row) conversion LUTs (FoldStorage::fold_lut).
template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_, class Promotion_>
template <class FragA>
CUTLASS_DEVICE void Sm90MxBlockScaledMma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Promotion_>::load_x_block(
    FragA&& frag, uint8_t const* stage_base, int thread_idx, int block, uint64_t const* lut) {
  using namespace cute;
  int const q = thread_idx % 4;
  uint32_t const half = (q & 1) ? 0x7632u : 0x5410u;
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kMmaM; ++mi) {
    auto regs = recast<uint32_t>(frag(_, mi));  // 4 registers: (r, k 4q..), (r+8, ..), (r, k 16+4q..), (r+8, ..)
    CUTLASS_PRAGMA_UNROLL
    for (int v1 = 0; v1 < 2; ++v1) {
      int const r = fragment_row(thread_idx, mi, v1);
      uint8_t const* row_start = stage_base + r * 64;
      uint32_t const row_addr = cute::cast_smem_ptr_to_uint(row_start);
      uint8_t const* row = row_start + ((block ^ ((row_addr >> 7) & 3)) << 4);
      uint32_t const w0 = *reinterpret_cast<uint32_t const*>(row + 4 * (q >> 1));      // k 4q..4q+3
      uint32_t const w1 = *reinterpret_cast<uint32_t const*>(row + 8 + 4 * (q >> 1));  // k 16+4q..
      uint32_t lo, hi;
      if constexpr (kFold) {
        uint64_t const l = lut[block * kTileM + r];
        mx_detail::e2m1x8_to_e4m3x8(__byte_perm(w0, w1, half), lo, hi, uint32_t(l), uint32_t(l >> 32));
      } else {
        mx_detail::e2m1x8_to_e4m3x8(__byte_perm(w0, w1, half), lo, hi);
      }
      regs(v1) = lo;
      regs(2 + v1) = hi;
    }
  }
}

template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_, class Promotion_>
template <class FrgTensorC>
CUTLASS_DEVICE void Sm90MxBlockScaledMma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Promotion_>::mma(
    MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count, int thread_idx,
    TensorStorage& shared, Params const& params) {
  using namespace cute;
  static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
  static_assert(size<0>(FrgTensorC{}) == kAtomN / 2, "unexpected wgmma accumulator fragment");
  static_assert(size<1>(FrgTensorC{}) == kMmaM && size<2>(FrgTensorC{}) == kMmaN, "unexpected accumulator tiling");

  Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), SmemLayoutB{});
  TiledMma tiled_mma;
  auto wg_mma = mx_detail::warpgroup_slice(tiled_mma, thread_idx);
  Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
  auto thread_mma = tiled_mma.get_slice(thread_idx);
  // The X operand: smem descriptors (SS), or a register fragment filled per block (RS).
  auto x_fragment = [&]() {
    if constexpr (kRegisterX) {
      return mx_detail::register_fragment_a<ElementA, kTileM, mx_detail::kTileK>(thread_mma);
    } else {
      return wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    }
  };
  auto tCrA = x_fragment();
  int const q = thread_idx % 4;

  // The packed e2m1 bytes of block b of `stage`, converted into `frag_a` (RS only).
  auto load_x = [&](auto& frag_a, int stage, int b) {
    if constexpr (kFold)
      load_x_block(frag_a(_, _, b), &shared.smem_A[stage * kTileM * kXBytesPerRow], thread_idx, b,
                   shared.fold_lut[stage]);
    else
      load_x_block(frag_a(_, _, b), &shared.smem_A[stage * kTileM * kXBytesPerRow], thread_idx, b);
  };
  // One wgmma of block b of `stage` into `temp`, zero-initialised; the caller commits.
  auto mma_block = [&](auto& temp, int stage, int b, auto& frag_a) {
    warpgroup_fence_operand(temp);
    warpgroup_arrive();
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    if constexpr (kRegisterX)
      cute::gemm(tiled_mma, frag_a(_, _, b), tCrB(_, _, b, stage), temp);
    else
      cute::gemm(tiled_mma, tCrA(_, _, b, stage), tCrB(_, _, b, stage), temp);
  };
  // Block b of the current stage into `temp` as its own wgmma batch.
  auto issue_block = [&](auto& temp, int stage, int b, auto& frag_a) {
    if constexpr (kRegisterX) {
      load_x(frag_a, stage, b);
      warpgroup_fence_operand(frag_a);
    }
    mma_block(temp, stage, b, frag_a);
    warpgroup_commit_batch();
    // Keeps the compiler from moving reads of `temp` into the window where the wgmma owns it.
    warpgroup_fence_operand(temp);
  };
  // acc += temp * col_scale * row_scale for block b of `stage`. Folded strips (both of a
  // thread's rows carry the strip's factor) take one FMUL per column instead of one per element.
  // The warp-uniform branch sits inside the column loop: around the whole loop, the two bodies'
  // register allocation spilled.
  auto promote = [&](auto& temp, int stage, int b) {
    float const* f = shared.sf_f32[stage];
    float rs[kMmaM][2];
    bool folded = kFold;
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kMmaM; ++mi) {
      int const r0 = fragment_row(thread_idx, mi, 0);
      rs[mi][0] = f[b * kTileM + r0];
      rs[mi][1] = f[b * kTileM + fragment_row(thread_idx, mi, 1)];
      if constexpr (kFold) folded = folded && shared.fold_mode[stage][b * (kTileM / 16) + r0 / 16];
    }
    float const* fc = f + mx_detail::kBlocksPerTile * kTileM + (b * 4 + q) * kColStride;
    warpgroup_fence_operand(temp);
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_UNROLL
    for (int ni = 0; ni < kMmaN; ++ni) {
      CUTLASS_PRAGMA_UNROLL
      for (int v2 = 0; v2 < kAtomN / 8; v2 += 2) {
        // slots ni * kAtomN/4 + 2 v2 + {0,1} and 2 (v2+1) + {0,1}: columns 8 v2 + 2q + {0,1}, 8 (v2+1) + ...
        float4 const cs = *reinterpret_cast<float4 const*>(fc + ni * (kAtomN / 4) + 2 * v2);
        float const c[4] = {cs.x, cs.y, cs.z, cs.w};
        // The scale product first, so `temp` (a wgmma accumulator) is only read, never written,
        // outside the wgmma. (ptxas still serializes this kernel's wgmmas, C7514, when the
        // promotion reads a temporary under wait<1>: docs/design/sm90_mx_mainloop.md.)
        auto columns = [&](auto shared_row) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) {
            int const v0 = j % 2, vv2 = v2 + j / 2;
            CUTLASS_PRAGMA_UNROLL
            for (int mi = 0; mi < kMmaM; ++mi) {
              float const s0 = c[j] * rs[mi][0];
              CUTLASS_PRAGMA_UNROLL
              for (int v1 = 0; v1 < 2; ++v1) {
                int const v = v0 + 2 * v1 + 4 * vv2;
                float const scale = decltype(shared_row)::value || v1 == 0 ? s0 : c[j] * rs[mi][1];
                accum(v, mi, ni) = fmaf(temp(v, mi, ni), scale, accum(v, mi, ni));
              }
            }
          }
        };
        if (folded)  // warp-uniform: a warp's rows are one strip per mi
          columns(cute::true_type{});
        else
          columns(cute::false_type{});
      }
    }
    warpgroup_fence_operand(accum);
  };

  // One barrier per tile owner: both warpgroups (cooperative) or this one (ping-pong).
  // NamedBarrier offsets user ids past CUTLASS's reserved ones itself.
  int const owner = kCooperative ? 0 : cutlass::canonical_warp_group_idx() - 1;
  cutlass::arch::NamedBarrier scale_barrier(kMmaThreads, owner);
  // Wait for a stage, expand its scales for every thread of the tile.
  int kt = 0;
  auto acquire_unsynced = [&]() {
    pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
    int const stage = smem_pipe_read.index();
    expand_scales(shared, stage, kt, tile_m_off_, tile_n_off_, thread_idx, params);
    ++kt;
    ++smem_pipe_read;
    return stage;
  };
  auto acquire = [&]() {
    int const stage = acquire_unsynced();
    scale_barrier.sync();
    return stage;
  };
  PipelineState smem_pipe_release = smem_pipe_read;
  auto release = [&]() {
    pipeline.consumer_release(smem_pipe_release);
    ++smem_pipe_release;
  };

  clear(accum);
  if constexpr (!kPerKTile) {
    Tensor t0 = make_fragment_like(accum);
    Tensor t1 = make_fragment_like(accum);
    // Block b of a K-tile goes into t[b % 2]; block 3's promotion is the next K-tile's first.
    // A K-tile's second half (block 1 in flight), the same in the first K-tile and the loop. A
    // macro, not a lambda: the lambda changed the RS kernel's register allocation (2.9k SASS
    // lines of sm90a_e4m3xe2m1_128x128x128 differed), the macro is the same code token for token.
#define PGEMM_MX_PROMOTE_BLOCKS_0_TO_2(stage) \
    warpgroup_wait<1>();                      \
    promote(t0, stage, 0);                    \
    issue_block(t0, stage, 2, tCrA);          \
    warpgroup_wait<1>();                      \
    promote(t1, stage, 1);                    \
    issue_block(t1, stage, 3, tCrA);          \
    warpgroup_wait<1>();                      \
    promote(t0, stage, 2)
    int stage = acquire();
    issue_block(t0, stage, 0, tCrA);
    issue_block(t1, stage, 1, tCrA);
    PGEMM_MX_PROMOTE_BLOCKS_0_TO_2(stage);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k = 1; k < k_tile_count; ++k) {
      int const prev = stage;
      stage = acquire();
      issue_block(t0, stage, 0, tCrA);
      warpgroup_wait<1>();
      promote(t1, prev, 3);
      release();
      issue_block(t1, stage, 1, tCrA);
      PGEMM_MX_PROMOTE_BLOCKS_0_TO_2(stage);
    }
#undef PGEMM_MX_PROMOTE_BLOCKS_0_TO_2
    warpgroup_wait<0>();
    promote(t1, stage, 3);
    release();
  } else {
    // (Measured on the H200: 44.8 us at 1 x 8192 x 8192. A one-K-tile step with four temporaries
    // per set measured 36.2 us in an earlier run, before the named-barrier and fence fixes; it
    // is the next thing to bring back, with a GPU run to validate it.)
    // A step is two K-tiles (8 blocks, one wgmma batch per K-tile) into one set of eight
    // temporaries; the previous step's set is promoted while this one runs. Two K-tiles per
    // wait halve the latency chain (wait, expand, barrier, issue, promote) per byte, which is
    // what a decode tile is bound by; RS tiles load all their e2m1 bytes before converting.
    Tensor a0 = make_fragment_like(accum), a1 = make_fragment_like(accum), a2 = make_fragment_like(accum),
           a3 = make_fragment_like(accum), a4 = make_fragment_like(accum), a5 = make_fragment_like(accum),
           a6 = make_fragment_like(accum), a7 = make_fragment_like(accum);
    Tensor b0 = make_fragment_like(accum), b1 = make_fragment_like(accum), b2 = make_fragment_like(accum),
           b3 = make_fragment_like(accum), b4 = make_fragment_like(accum), b5 = make_fragment_like(accum),
           b6 = make_fragment_like(accum), b7 = make_fragment_like(accum);
    // RS: one X fragment per K-tile in flight, so a conversion never overwrites registers a
    // pending wgmma reads.
    auto tCrA1 = x_fragment();
    auto tCrA2 = x_fragment();
    auto tCrA3 = x_fragment();
    auto issue_tile = [&](auto& t0, auto& t1, auto& t2, auto& t3, int stage, auto& frag_a) {
      if constexpr (kRegisterX) {
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) load_x(frag_a, stage, b);
        warpgroup_fence_operand(frag_a);
      }
      mma_block(t0, stage, 0, frag_a);
      mma_block(t1, stage, 1, frag_a);
      mma_block(t2, stage, 2, frag_a);
      mma_block(t3, stage, 3, frag_a);
      warpgroup_commit_batch();  // one batch per K-tile (the hardware tracks at most 8)
      warpgroup_fence_operand(t0);
      warpgroup_fence_operand(t1);
      warpgroup_fence_operand(t2);
      warpgroup_fence_operand(t3);
    };
    auto promote_tile = [&](auto& t0, auto& t1, auto& t2, auto& t3, int stage) {
      promote(t0, stage, 0);
      promote(t1, stage, 1);
      promote(t2, stage, 2);
      promote(t3, stage, 3);
      release();
    };
    // Issue step k-tiles [k, k+1) or [k, k+2) into one set; returns how many.
    int stage_lo[2], stage_hi[2];
    auto issue_step = [&](int k, int set, auto& t0, auto& t1, auto& t2, auto& t3, auto& t4, auto& t5, auto& t6,
                          auto& t7, auto& fa, auto& fb) {
      bool const two = k + 1 < k_tile_count;
      stage_lo[set] = acquire_unsynced();
      if (two) stage_hi[set] = acquire_unsynced();
      scale_barrier.sync();
      issue_tile(t0, t1, t2, t3, stage_lo[set], fa);
      if (two) issue_tile(t4, t5, t6, t7, stage_hi[set], fb);
      return two;
    };
    auto promote_step = [&](bool two, int set, auto& t0, auto& t1, auto& t2, auto& t3, auto& t4, auto& t5,
                            auto& t6, auto& t7) {
      promote_tile(t0, t1, t2, t3, stage_lo[set]);
      if (two) promote_tile(t4, t5, t6, t7, stage_hi[set]);
    };
    // After issuing a step, the previous one is done once at most this step's batches remain.
    auto wait_previous = [&](bool two_now) {
      if (two_now)
        warpgroup_wait<2>();
      else
        warpgroup_wait<1>();
    };
    bool two_a = issue_step(0, 0, a0, a1, a2, a3, a4, a5, a6, a7, tCrA, tCrA1);
    int k = 2;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k < k_tile_count; k += 4) {
      bool const two_b = issue_step(k, 1, b0, b1, b2, b3, b4, b5, b6, b7, tCrA2, tCrA3);
      wait_previous(two_b);
      promote_step(two_a, 0, a0, a1, a2, a3, a4, a5, a6, a7);
      if (k + 2 >= k_tile_count) {
        warpgroup_wait<0>();
        promote_step(two_b, 1, b0, b1, b2, b3, b4, b5, b6, b7);
        return;
      }
      two_a = issue_step(k + 2, 0, a0, a1, a2, a3, a4, a5, a6, a7, tCrA, tCrA1);
      wait_previous(two_a);
      promote_step(two_b, 1, b0, b1, b2, b3, b4, b5, b6, b7);
    }
    warpgroup_wait<0>();
    promote_step(two_a, 0, a0, a1, a2, a3, a4, a5, a6, a7);
  }
}

}  // namespace persistent_gemm::collective
