// FP8 mainloop with fp32 promotion that does not stall the tensor core.
//
// Hopper's FP8 wgmma accumulates at reduced precision inside the tensor core, so accurate FP8
// GEMMs (torch._scaled_mm's default) add each K-tile's partial sums into a separate fp32
// accumulator. CUTLASS's promoting mainloop (MainloopSm90TmaGmmaWarpSpecializedFP8) does that
// with one temporary accumulator: issue a K-tile's wgmmas into it, wait for *all* of them
// (warpgroup_wait<0>), add, repeat -- every K-tile the consumer's wgmma queue runs dry while it
// adds, and both cooperative warpgroups do so in lockstep. Measured on the H200 at 8192^3: 0.88x
// of cuBLAS's promoted kernel.
//
// This mainloop keeps two temporaries and alternates them: K-tile t's wgmmas go into T[t % 2]
// while the consumer waits only for K-tile t-1 (warpgroup_wait<1>) and adds T[(t-1) % 2] into the
// fp32 accumulator, so the tensor core always has the next K-tile queued. The price is a third
// accumulator's registers, which the register-budget rule (config_rules.py, sm90_gemm_builder.hpp)
// accounts for. Promotion happens every K-tile (tile_k = 128 e4m3 elements), as DeepGEMM's and
// cuBLAS's accurate modes do.
//
// Composed, not copied: everything but the consumer's mma()/mma_tail() -- TMA loads, shared
// storage, pipeline, parameters -- is CUTLASS's FP8 collective, inherited.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace persistent_gemm::collective {

template <class Base>
struct Sm90Fp8OverlappedPromotionMma : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;

  // fp32 accumulator + two in-flight temporaries, in accumulator-sized register sets. The kernel
  // reads this to size its register split.
  static constexpr int kAccumulatorCopies = 3;

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)

    constexpr int kMmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_thread_layout = make_layout(Int<kMmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    int const warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));                 // M
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));                 // N

    Tensor temp0 = make_fragment_like(accum);
    Tensor temp1 = make_fragment_like(accum);
    PipelineState smem_pipe_release = smem_pipe_read;

    // One K-tile's wgmmas into `temp`, zero-initialised by the first one; returns at once.
    auto issue = [&](auto& temp) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      int const stage = smem_pipe_read.index();
      warpgroup_fence_operand(temp);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), temp);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(temp);
      ++smem_pipe_read;
    };
    // After the wait that retired `temp`'s batch: fp32 add, then hand its smem stage back.
    auto promote = [&](auto& temp) {
      warpgroup_fence_operand(temp);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += temp(i);
      warpgroup_fence_operand(accum);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    // The last K-tile in flight in `temp`: retire it, add it, and leave.
    auto drain = [&](auto& temp) {
      warpgroup_wait<0>();
      promote(temp);
    };

    clear(accum);
    // Both temporaries are issued before the first wait, and the one-K-tile case branches off
    // before any wgmma is in flight. With the loop's entry test between the first two issues,
    // ptxas injected a warpgroup.wait 0 there (warning C7517): every tile's first K-tile ran
    // alone, with nothing queued behind it.
    if (k_tile_count < 2) {
      issue(temp0);
      return drain(temp0);
    }
    issue(temp0);
    issue(temp1);
    // Both temporaries in flight at the top of every iteration, temp0 the older; unrolled by two
    // so each temporary is a fixed register set (no dynamic indexing).
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 2;; k_tile += 2) {
      warpgroup_wait<1>();
      promote(temp0);
      if (k_tile == k_tile_count) return drain(temp1);
      issue(temp0);
      warpgroup_wait<1>();
      promote(temp1);
      if (k_tile + 1 == k_tile_count) return drain(temp0);
      issue(temp1);
    }
  }

  // mma() retired every wgmma and released every stage it read.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace persistent_gemm::collective
