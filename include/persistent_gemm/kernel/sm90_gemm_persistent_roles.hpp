// The device body of Sm90GemmPersistent (sm90_gemm_persistent.hpp declares the kernel and maps its
// roles): the producer warp's TMA loads, the consumer warpgroups' mainloop, split-K fixup and
// epilogue, each walking the tile schedule on its own. Apart from the types, host interface and
// split-K workspace so that each reads on its own.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/pipeline/pipeline.hpp"

#include "persistent_gemm/kernel/sm90_gemm_persistent.hpp"

namespace persistent_gemm::kernel {

template <class CollectiveMainloop_, class CollectiveEpilogue_, class ScheduleTag_, class Style_>
CUTLASS_DEVICE void Sm90GemmPersistent<CollectiveMainloop_, CollectiveEpilogue_, ScheduleTag_, Style_>::operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);

  int const thread_idx = int(threadIdx.x);
  int const warp_idx = cutlass::canonical_warp_idx_sync();
  int const warp_in_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
  int const warp_group = cutlass::canonical_warp_group_idx();
  int const group_thread_idx = thread_idx % int(kWarpGroupThreads);
  int const lane_idx = cutlass::canonical_lane_idx();
  bool const is_producer = warp_group == 0;
  int const consumer = warp_group - 1;  // 0 / 1 for the consumer WGs
  bool const is_mainloop_warp = is_producer && warp_in_group == 0;
  bool const is_epi_load_warp = is_producer && warp_in_group == 1;
  uint32_t const block_rank_in_cluster = cute::block_rank_in_cluster();

  if (warp_idx == 0 && cute::elect_one_sync()) {
    CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
    CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
  }

  // Mainloop ring: one TMA producer thread; every thread of the WG(s) that own a tile consumes.
  typename MainloopPipeline::Params mainloop_pipe_params;
  if (is_mainloop_warp) mainloop_pipe_params.role = MainloopPipeline::ThreadCategory::Producer;
  if (!is_producer) mainloop_pipe_params.role = MainloopPipeline::ThreadCategory::Consumer;
  mainloop_pipe_params.is_leader = group_thread_idx == 0;
  mainloop_pipe_params.num_consumers = kMmaThreads;
  mainloop_pipe_params.num_producers = CollectiveMainloop::NumProducerThreadEvents;
  mainloop_pipe_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
  MainloopPipeline mainloop_pipeline(shared.pipelines.mainloop, mainloop_pipe_params, ClusterShape{});

  typename EpiLoadPipeline::Params epi_load_params;
  if (is_epi_load_warp) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Producer;
  if (!is_producer) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
  epi_load_params.dst_blockid = block_rank_in_cluster;
  epi_load_params.producer_arv_count = cutlass::NumThreadsPerWarp;
  epi_load_params.consumer_arv_count = kMmaThreads;
  if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
    epi_load_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
  }
  EpiLoadPipeline epi_load_pipeline(shared.pipelines.epi_load, epi_load_params);

  // The TMA store "pipeline" is thread-local bookkeeping; always_wait because several
  // consumer threads own the smem buffers the stores read from.
  typename EpiStorePipeline::Params epi_store_params;
  epi_store_params.always_wait = true;
  EpiStorePipeline epi_store_pipeline(epi_store_params);

  typename LoadOrderBarrier::Params load_order_params;
  load_order_params.group_id = warp_in_group == 0 ? 0 : 1;
  load_order_params.group_size = cutlass::NumThreadsPerWarp;
  LoadOrderBarrier load_order_barrier(shared.pipelines.load_order, load_order_params);

  typename MathOrderBarrier::Params math_order_params;
  math_order_params.group_id = consumer > 0 ? uint32_t(consumer) : 0u;
  math_order_params.group_size = kWarpGroupThreads;
  MathOrderBarrier math_order_barrier(shared.pipelines.math_order, math_order_params);

  // Barrier inits must be visible cluster-wide before any peer multicasts into us.
  if constexpr (size(ClusterShape{}) > 1) {
    cute::cluster_arrive_relaxed();
  } else {
    __syncthreads();
  }

  auto const problem_mnkl = params.problem;
  TiledMma tiled_mma;
  CollectiveMainloop collective_mainloop;
  CollectiveEpilogue collective_epilogue(params.epilogue, shared.tensors.epilogue);
  auto load_inputs = collective_mainloop.load_init(problem_mnkl, params.mainloop);
  Tensor gA_mkl = get<0>(load_inputs);                         // (BLK_M, BLK_K, m, k, l)
  int const k_tiles = int(size<3>(gA_mkl));                    // K-tiles of the whole problem
  constexpr int epi_load_inc = CollectiveEpilogue::get_load_pipe_increment(TileShape{});
  constexpr int epi_store_inc = CollectiveEpilogue::get_store_pipe_increment(TileShape{});

  if constexpr (size(ClusterShape{}) > 1) cute::cluster_wait();

  Scheduler scheduler(params.scheduler);

  if (is_producer) {
    cutlass::arch::warpgroup_reg_dealloc<kLoadRegisters>();

    if (is_mainloop_warp) {
      // One clock for the whole CTA: in PingPong the consumers split it, but the loads are
      // issued in clock order, which is the order they will consume the ring in.
      MainloopState write_state = cutlass::make_producer_start_state<MainloopPipeline>();
      bool first_tile = true;
      for (auto work = scheduler.initial_work(); work.is_valid(); work = scheduler.next_work(work)) {
        auto blk_coord = make_coord(work.m_idx, work.n_idx, _, work.l_idx);
        int const k_n = k_count(work, k_tiles);
        auto k_tile_iter = cute::make_coord_iterator(idx2crd(k_begin(work), shape<3>(gA_mkl)), shape<3>(gA_mkl));
        collective_mainloop.load(params.mainloop, mainloop_pipeline, write_state, load_inputs, blk_coord,
                                 k_tile_iter, k_n, lane_idx, block_rank_in_cluster, shared.tensors.mainloop);
        write_state.advance(k_n);
        if (first_tile) {
          load_order_barrier.arrive();
          first_tile = false;
        }
      }
      // Do not exit while peers may still release stages into this CTA's barriers.
      collective_mainloop.load_tail(mainloop_pipeline, write_state);
    } else if (is_epi_load_warp && collective_epilogue.is_producer_load_needed()) {
      // Dead for our epilogues (no C source), kept so a sourced epilogue composes correctly.
      EpiLoadState load_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
      auto work = scheduler.initial_work();
      if (work.is_valid()) load_order_barrier.wait();
      for (; work.is_valid(); work = scheduler.next_work(work)) {
        auto blk_coord = make_coord(work.m_idx, work.n_idx, _, work.l_idx);
        load_state = collective_epilogue.load(epi_load_pipeline, load_state, problem_mnkl, TileShape{}, blk_coord,
                                              tiled_mma, lane_idx, shared.tensors.epilogue);
      }
      collective_epilogue.load_tail(epi_load_pipeline, load_state);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kMmaRegisters>();

    MainloopState read_state;
    EpiLoadState epi_load_state;
    EpiStoreState epi_store_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    if constexpr (kCooperative) {
      int const mma_thread_idx = thread_idx - int(kWarpGroupThreads);  // 0..255 across both WGs
      bool stored = false;
      for (auto work = scheduler.initial_work(); work.is_valid(); work = scheduler.next_work(work)) {
        auto blk_coord = make_coord(work.m_idx, work.n_idx, _, work.l_idx);
        auto accumulators = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
        int const k_n = k_count(work, k_tiles);
        set_tile(collective_mainloop, blk_coord);
        collective_mainloop.mma(mainloop_pipeline, read_state, accumulators, k_n, mma_thread_idx,
                                shared.tensors.mainloop, params.mainloop);
        collective_mainloop.mma_tail(mainloop_pipeline, read_state, k_n);
        read_state.advance(k_n);
        if (!split_fixup(params, work, accumulators, mma_thread_idx, kSplitBarrier)) continue;

        auto [load_next, store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_state, epi_store_pipeline, epi_store_state, problem_mnkl, TileShape{},
            blk_coord, accumulators, tiled_mma, mma_thread_idx, shared.tensors.epilogue);
        epi_load_state = load_next;
        epi_store_state = store_next;
        stored = true;
      }
      // Drain outstanding TMA stores before smem (and the CTA) goes away.
      if (stored) {
        collective_epilogue.store_tail(epi_load_pipeline, epi_load_state, epi_store_pipeline, epi_store_state);
      }
    } else {
      // Consumer c owns clock steps c, c+2, ...; its ring and epilogue states start c tiles
      // in and skip the other WG's tile after each of its own, exactly as the producer fills.
      auto work = scheduler.initial_work();
      if (consumer == 1) {
        read_state.advance(k_count(work, k_tiles));
        work = scheduler.next_work(work);
        epi_load_state.advance(epi_load_inc);
        epi_store_state.advance(epi_store_inc);
      }
      for (; work.is_valid(); work = scheduler.next_work(scheduler.next_work(work))) {
        auto blk_coord = make_coord(work.m_idx, work.n_idx, _, work.l_idx);
        auto accumulators = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));

        int const k_n = k_count(work, k_tiles);
        math_order_barrier.wait();  // my turn on the tensor cores
        set_tile(collective_mainloop, blk_coord);
        collective_mainloop.mma(mainloop_pipeline, read_state, accumulators, k_n, group_thread_idx,
                                shared.tensors.mainloop, params.mainloop);
        math_order_barrier.arrive();  // the other WG's mainloop may start while I finish up
        collective_mainloop.mma_tail(mainloop_pipeline, read_state, k_n);
        // Skip the other WG's unit in the ring: its own K count (a pure function of its id).
        auto const other = scheduler.next_work(work);
        read_state.advance(k_n + (other.is_valid() ? k_count(other, k_tiles) : 0));

        // Split-K fixup outside the epilogue turn: a partial publishes as soon as its MMAs are
        // done, and a waiting reducer holds no turn, so the other WG's mainloop runs meanwhile
        // (inside the turn, every wait would stall this CTA's whole ordered sequence).
        bool const stores = split_fixup(params, work, accumulators, group_thread_idx,
                                        kSplitBarrier + uint32_t(consumer));
        math_order_barrier.wait();  // epilogues alternate too: they share smem and a named barrier
        if (!stores) {
          // A partial unit stores nothing: keep the epilogue turn, and step the states past
          // this unit and the other WG's as a store would have.
          epi_load_state.advance(2 * epi_load_inc);
          epi_store_state.advance(2 * epi_store_inc);
          math_order_barrier.arrive();
          continue;
        }
        auto [load_next, store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_state, epi_store_pipeline, epi_store_state, problem_mnkl, TileShape{},
            blk_coord, accumulators, tiled_mma, group_thread_idx, shared.tensors.epilogue);
        // The store wait is visible only to the issuing thread: finish every TMA store of
        // this tile before handing the epilogue smem to the other WG.
        auto [load_done, store_done] =
            collective_epilogue.store_tail(epi_load_pipeline, load_next, epi_store_pipeline, store_next);
        epi_load_state = load_done;
        epi_store_state = store_done;
        epi_load_state.advance(epi_load_inc);
        epi_store_state.advance(epi_store_inc);
        math_order_barrier.arrive();
      }
    }
  }
#else
  // Compiled for a target without sm_90a features: never launched (the builder's run() only
  // exists in sm_90a translation units), but keep the symbol well-formed.
  (void)params;
  (void)smem_buf;
#endif
}

}  // namespace persistent_gemm::kernel
