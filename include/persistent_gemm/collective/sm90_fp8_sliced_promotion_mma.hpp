// Promoted FP8 mainloop for tiles too wide for three whole-tile accumulators (128x256, 128x192).
//
// Sm90Fp8OverlappedPromotionMma keeps the fp32 accumulator and two whole-tile temporaries: 3 x
// 128 registers per consumer thread at 128x256, past the budget. Here the temporaries cover one
// N-slice of the tile at a time (SliceN columns): a K-tile is S = TileN / SliceN wgmma batches,
// slice s into temporary s % 2, and while slice s runs the consumer adds slice s-1's temporary
// into its columns of the accumulator. Every output element is still promoted once per K-tile,
// as the whole-tile mainloop does: same numerics, a wider tile.
//
// A narrow SS wgmma re-reads A from shared memory for every slice: at m64n64k32 that is 128
// B/clk, all of shared memory's read bandwidth (docs/design/sm90_fp8_promoted_wide_tile.md). So
// A lives in registers (RS wgmma): ldmatrix loads it once per K-tile and each slice reads only
// its B columns from shared memory. Where two A fragments fit the register budget (DoubleA) they
// alternate by K-tile; where only one does, a K-tile's last slice reads A from shared memory
// instead (SS), which frees the fragment for the next K-tile one slice early.
// kernel/promotion_rule.hpp chooses SliceN and DoubleA.
//
// Composed, not copied: TMA loads, shared storage, pipeline and parameters are CUTLASS's FP8
// collective (Base), inherited; this class replaces the TiledMma (RS atoms SliceN wide) and the
// consumer's mma()/mma_tail().
#pragma once

#include "cute/tensor.hpp"
#include "cute/atom/copy_traits_sm75.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "persistent_gemm/kernel/promotion_rule.hpp"

namespace persistent_gemm::collective {

template <class Base, int SliceN, bool DoubleA>
struct Sm90Fp8SlicedPromotionMma : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using ElementA = typename Base::ElementA;
  using ElementB = typename Base::ElementB;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kSlices = kTileN / SliceN;
  static_assert(kTileM == 128, "sliced promotion: cooperative tiles of 128 rows (one 64-row A fragment per warpgroup)");
  static_assert(SliceN % 16 == 0 && kTileN % SliceN == 0, "sliced promotion: SliceN must divide tile_n, in steps of 16");
  static_assert(kSlices % 2 == 0,
                "sliced promotion: an even number of slices, so slice s of every K-tile uses temporary s % 2");
  static_assert(kTileK % 32 == 0, "sliced promotion: tile_k is whole k32 wgmma steps");

  // Replaces Base's SS TiledMma: the kernel sizes the accumulator and the epilogue partitions it
  // with this one, (SliceN / 2 values, 1, kSlices) per thread.
  using SliceShape = cute::Shape<cute::_64, cute::Int<SliceN>, cute::Int<kTileK>>;
  using WarpGroups = cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<ElementA, ElementB, float, SliceShape, cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      WarpGroups{}));
  // Two A fragments alternate by K-tile where their registers fit (DoubleA): the next K-tile's
  // load never overwrites registers the previous one's last slice reads. Otherwise the last slice
  // of a K-tile reads A from shared memory (SS, same C layout), so the one fragment is free for
  // the next K-tile as soon as the second-to-last slice retires.
  using TiledMmaSS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<ElementA, ElementB, float, SliceShape, cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      WarpGroups{}));
  static_assert(cute::size<1>(typename TiledMma::AtomShape_MNK{}) == SliceN, "rs_op_selector chose another N");
  static_assert(cute::size<1>(typename TiledMmaSS::AtomShape_MNK{}) == SliceN, "ss_op_selector chose another N");

  // Registers besides the one accumulator: the kernel reads this to size its register split.
  static constexpr int kExtraRegisters = kernel::promotion::sliced_extra_registers(SliceN, kTileK, DoubleA);

  // Slice S of `stage` into `temp`, zero-initialised by its first k-block; returns at once.
  // frag_a: the K-tile's A in registers for the RS slices, the stage's descriptors for the last.
  template <int S, class Mma, class Temp, class FragA, class FragB>
  CUTLASS_DEVICE static void issue(Mma& mma, Temp& temp, FragA const& frag_a, int a_stage, FragB const& frag_b,
                                   int stage) {
    using namespace cute;
    warpgroup_fence_operand(temp);
    warpgroup_arrive();
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTLASS_PRAGMA_UNROLL
    for (int k_block = 0; k_block < size<2>(frag_b); ++k_block) {
      if constexpr (FragA::rank == 4)
        cute::gemm(mma, frag_a(_, 0, k_block, a_stage), frag_b(_, S, k_block, stage), temp);
      else
        cute::gemm(mma, frag_a(_, 0, k_block), frag_b(_, S, k_block, stage), temp);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(temp);
  }

  // After the wait that retired `temp`'s batch: its fp32 add into slice S of the accumulator.
  template <int S, class Accum, class Temp>
  CUTLASS_DEVICE static void promote(Accum& accum, Temp& temp) {
    using namespace cute;
    warpgroup_fence_operand(temp);
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(temp); ++i) accum(i, 0, S) += temp(i);
    warpgroup_fence_operand(accum);
  }

  // Slices 1 .. kSlices-1 of a K-tile whose slice 0 is in flight in t0: slice S into t[S % 2],
  // then slice S-1, in the other temporary, retired and promoted.
  template <int S, class Accum, class Temp, class FragA, class FragASmem, class FragB>
  CUTLASS_DEVICE static void issue_rest(TiledMma& mma, TiledMmaSS& mma_ss, Accum& accum, Temp& t0, Temp& t1,
                                        FragA const& frag_a, FragASmem const& frag_a_smem, FragB const& frag_b,
                                        int stage) {
    if constexpr (S < kSlices) {
      auto& temp = [&]() -> Temp& { if constexpr (S % 2 == 1) return t1; else return t0; }();
      auto& other = [&]() -> Temp& { if constexpr (S % 2 == 1) return t0; else return t1; }();
      if constexpr (S == kSlices - 1 && !DoubleA)
        issue<S>(mma_ss, temp, frag_a_smem, stage, frag_b, stage);
      else
        issue<S>(mma, temp, frag_a, 0, frag_b, stage);
      cute::warpgroup_wait<1>();
      promote<S - 1>(accum, other);
      issue_rest<S + 1>(mma, mma_ss, accum, t0, t1, frag_a, frag_a_smem, frag_b, stage);
    }
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    static_assert(size<1>(FrgTensorC{}) == 1 && size<2>(FrgTensorC{}) == kSlices, "unexpected accumulator tiling");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)

    TiledMma tiled_mma;
    TiledMmaSS tiled_mma_ss;
    int const warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto wg_mma = tiled_mma.get_slice(warp_group_idx * cutlass::NumThreadsPerWarpGroup);
    auto wg_mma_ss = tiled_mma_ss.get_slice(warp_group_idx * cutlass::NumThreadsPerWarpGroup);
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));        // (MMA, kSlices, MMA_K, PIPE) descriptors
    Tensor tCsA = wg_mma_ss.make_fragment_A(wg_mma_ss.partition_A(sA));  // (MMA, 1, MMA_K, PIPE) descriptors
    auto thread_mma = tiled_mma.get_slice(thread_idx);
    Tensor tCrA = thread_mma.partition_fragment_A(sA(_, _, 0));           // (MMA, 1, MMA_K) registers
    Tensor tCrA1 = make_fragment_like(tCrA);                              // DoubleA: odd K-tiles' A
    // ldmatrix: an 8x8 b16 matrix is 8 rows x 16 e4m3, lane l gets row l/4, bytes 4(l%4)..+3,
    // which is the RS fragment's (row, k 4q..4q+3) register.
    auto smem_copy_a = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, ElementA>{}, tiled_mma);
    auto thr_copy_a = smem_copy_a.get_thread_slice(thread_idx);
    Tensor tXsA = thr_copy_a.partition_S(sA);  // (CPY, CPY_M, CPY_K, PIPE)
    Tensor tXrA = thr_copy_a.retile_D(tCrA);
    Tensor tXrA1 = thr_copy_a.retile_D(tCrA1);

    Tensor t0 = make_fragment_like(accum(_, 0, 0));
    Tensor t1 = make_fragment_like(accum(_, 0, 0));
    PipelineState smem_pipe_release = smem_pipe_read;

    // One K-tile into the A fragment frag_a. On entry the previous K-tile's last slice (in t1:
    // the slice count is even) is in flight when `pending`, every other batch has retired; on
    // exit this K-tile's last slice is. A macro: nvcc did not inline a lambda of this size, and
    // its fragments went to local memory.
#define PGEMM_SLICED_K_TILE(frag_a, frag_a_copy, pending)                                         \
    {                                                                                             \
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));         \
      int const stage = smem_pipe_read.index();                                                   \
      ++smem_pipe_read;                                                                           \
      copy(smem_copy_a, tXsA(_, _, _, stage), frag_a_copy);                                       \
      warpgroup_fence_operand(frag_a);                                                            \
      issue<0>(tiled_mma, t0, frag_a, 0, tCrB, stage);                                            \
      if (pending) {                                                                              \
        warpgroup_wait<1>();                                                                      \
        promote<kSlices - 1>(accum, t1);                                                          \
        pipeline.consumer_release(smem_pipe_release); /* its last batch has retired */           \
        ++smem_pipe_release;                                                                      \
      }                                                                                           \
      issue_rest<1>(tiled_mma, tiled_mma_ss, accum, t0, t1, frag_a, tCsA, tCrB, stage);           \
      warpgroup_fence_operand(frag_a);                                                            \
    }
    // Every exit drains the last slice itself, and the loop holds two K-tiles with an exit test
    // before each: with one exit after the loop, or one K-tile per iteration, ptxas serialized
    // every wgmma of the kernel (C7514; both measured on nvcc 13.0's ptxas).
#define PGEMM_SLICED_DRAIN                          \
    {                                               \
      warpgroup_wait<0>();                          \
      promote<kSlices - 1>(accum, t1);              \
      pipeline.consumer_release(smem_pipe_release); \
      return;                                       \
    }

    clear(accum);
    PGEMM_SLICED_K_TILE(tCrA, tXrA, false);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k = 1;; k += 2) {
      if (k == k_tile_count) PGEMM_SLICED_DRAIN
      if constexpr (DoubleA) PGEMM_SLICED_K_TILE(tCrA1, tXrA1, true) else PGEMM_SLICED_K_TILE(tCrA, tXrA, true)
      if (k + 1 == k_tile_count) PGEMM_SLICED_DRAIN
      PGEMM_SLICED_K_TILE(tCrA, tXrA, true);
    }
#undef PGEMM_SLICED_DRAIN
#undef PGEMM_SLICED_K_TILE
  }

  // mma() retired every wgmma and released every stage it read.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace persistent_gemm::collective
