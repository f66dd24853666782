// SM100 (Blackwell) warp-specialized persistent GEMM: tcgen05 UMMA, TMEM accumulators,
// driven by persistent_gemm's own tile scheduler (no CLC, no CUTLASS tile scheduler).
//
// The persistent loop, the role split and the scheduler are ours. Inside them we compose the
// CUTLASS 4.2 SM100 collectives, which own the data movement and the instructions:
//   CollectiveMainloop  cutlass::gemm::collective::CollectiveMma<MainloopSm100TmaUmmaWarpSpecialized>
//                       (TMA loads into a smem ring, tcgen05.mma into a TMEM accumulator)
//   CollectiveEpilogue  cutlass::epilogue::collective::CollectiveEpilogue<Sm100TmaWarpSpecialized>
//                       (tcgen05.ld TMEM -> registers -> smem -> TMA store), no source C.
//
// Warps of a CTA (224 threads):
//   0..3  epilogue     one warpgroup: warp w may only tcgen05.ld TMEM lanes 32*(w%4).., so the
//                      four epilogue warps must be warps 0..3 of a warpgroup.
//   4     producer     TMA loads of A and B tiles (one elected lane issues).
//   5     MMA          one elected lane issues every tcgen05.mma; the rest of the warp only
//                      walks the loop (the atoms elect inside).
//   6     TMEM         tcgen05.alloc at start, tcgen05.dealloc after the epilogue is done.
// Each role owns a copy of PersistentTileScheduler and walks the same clock; nothing is
// passed between roles except through the smem / TMEM pipelines.
//
// Accumulators: AccumulatorPipelineStageCount (>= 2, from the mainloop builder: TMEM capacity /
// per-CTA tile, capped at 4) buffers in TMEM, so the MMA warp fills buffer i+1 while the
// epilogue drains buffer i. A 128-row CTA tile takes N fp32 columns per buffer (2 x 256 = all
// 512); 64-row tiles pack two buffers into the same columns (CUTLASS's TMEM fragment layout).
// The kernel always allocates all 512 columns.
//
// ---- 1-SM vs 2-SM and the meaning of m_idx -------------------------------------------------
// The scheduler is always instantiated with the *per-CTA* tile (CtaShape_MNK = MMA tile / CTAs
// per MMA). m_idx is a per-CTA tile index in units of CtaM rows, for both styles:
//   Umma1Sm  CtaM = MmaM.     A CTA issues its own MMAs on rows [m_idx*CtaM, +CtaM).
//   Umma2Sm  CtaM = MmaM / 2. The CTA pair (rank_m 2j, 2j+1) of a cluster issues one
//            cta_group::2 MMA of MmaM rows. The scheduler gives the pair m_idx = 2q and 2q+1
//            with q = cluster_row*ClusterM/2 + j, because m_idx = cluster_row*ClusterM + rank_m
//            and ClusterM is even. q = m_idx / 2 is the MMA tile; m_idx % 2 = rank_m % 2 is the
//            half. Both CTAs of a pair see the same tile_id (same cluster), and
//              - CTA rank_m%2 == 0 (leader) issues the MMAs and holds TMEM rows of half 0,
//              - each CTA TMA-loads its own CtaM rows of A ([m_idx*CtaM, +CtaM)) and half of B,
//              - each CTA's epilogue stores D rows [m_idx*CtaM, +CtaM): exactly its m_idx.
//            The CUTLASS mainloop indexes A by m/2 and picks the half by blockIdx.x % 2; our
//            grid puts rank_m in blockIdx.x, so the two agree.
//   Hence a schedule model of a 2-SM config must use TileM = MmaM / 2 (e.g. MMA 256x256 ->
//   scheduler tile 128x256), or its cluster count along M differs from the kernel's.
//
// Grouped (ScheduleTag::Grouped; the grouped MXFP8 GEMM, host/sm100_grouped_bands.cuh): the
// scheduler's grouped walk over the experts' rows (GroupM: the activations are A), E problems
// of L = E. Every CTA's TMEM warp builds the GroupTable in shared memory before the roles start.
// A tile of expert e, m_idx tiles into its rows, reads A and its scales, and writes D, at the
// padded band ids_before(e) / tiles_n + m_idx of the band-aligned copies (L coordinate 0), and
// the weight and its scales at L = e: the mainloop's load_grouped (the only role that addresses
// memory by the coordinate besides the epilogue). 1x1 clusters and 1-SM MMAs, so a band is one
// CTA tile and a group's ids are its bands times the N tiles.
//
// Tail CTAs (valid && !in_bounds): they run the full pipeline like any CTA. Their TMA loads
// are out of bounds (zero fill, full transaction bytes), their MMAs compute zeros, their TMA
// stores are clipped. They must not skip: they take part in A/B multicasts of their cluster,
// and in 2-SM mode the peer of an in-bounds leader must load its half and drain its TMEM.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cutlass/arch/arch.h"
#include "cutlass/arch/barrier.h"
#include "cutlass/detail/sm100_tmem_helper.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/gemm.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/pipeline/pipeline.hpp"

#include "cute/arch/cluster_sm90.hpp"
#include "cute/arch/tmem_allocator_sm100.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cute/tensor.hpp"

#include "persistent_gemm/generated/arch_limits.hpp"
#include "persistent_gemm/kernel/persistent_kernel_types.hpp"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"
#include "persistent_gemm/scheduler/tile_scheduler.hpp"

namespace persistent_gemm::kernel {

// Kernel styles: how many CTAs one tcgen05.mma spans (cta_group::1 or cta_group::2).
struct Umma1Sm {};
struct Umma2Sm {};

namespace detail {
template <class Style> struct UmmaStyle;
template <> struct UmmaStyle<Umma1Sm> { static constexpr int kCtasPerMma = 1; };
template <> struct UmmaStyle<Umma2Sm> { static constexpr int kCtasPerMma = 2; };

// tcgen05 ordering around thread synchronisation: TMEM allocation -> use, and use -> dealloc.
CUTLASS_DEVICE void tcgen05_before_thread_sync() {
#if defined(CUTLASS_ARCH_TCGEN_ENABLED)
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
#endif
}
CUTLASS_DEVICE void tcgen05_after_thread_sync() {
#if defined(CUTLASS_ARCH_TCGEN_ENABLED)
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
#endif
}
}  // namespace detail

template <class CollectiveMainloop_, class CollectiveEpilogue_, class ScheduleTag_, class Style_>
class Sm100GemmPersistent {
 public:
  PGEMM_PERSISTENT_KERNEL_TYPES(CollectiveMainloop_, CollectiveEpilogue_, ScheduleTag_, Style_);
  // TileShape is the MMA tile (MmaM, N, K); CtaShape_MNK below the per-CTA tile.
  static_assert(!ScheduleTag::ReducesK,
                "split-K and stream-K schedules are walked by the scheduler but this kernel does not reduce K ranges yet "
                "(KernelConfig.kernel_rejection says the same)");

  using ArchTag = typename CollectiveMainloop::ArchTag;
  using DispatchPolicy = typename CollectiveMainloop::DispatchPolicy;
  using ClusterShape = typename DispatchPolicy::ClusterShape;
  using AtomThrShapeMNK = typename CollectiveMainloop::AtomThrShapeMNK;
  using CtaShape_MNK = typename CollectiveMainloop::CtaShape_MNK;  // per-CTA tile
  using MainloopArguments = typename CollectiveMainloop::Arguments;
  using MainloopParams = typename CollectiveMainloop::Params;
  using EpilogueArguments = typename CollectiveEpilogue::Arguments;
  using EpilogueParams = typename CollectiveEpilogue::Params;
  using EpilogueTile = typename CollectiveEpilogue::EpilogueTile;

  static_assert(ArchTag::kMinComputeCapability >= 100, "SM100 kernel");
  static_assert(cute::is_static_v<ClusterShape>, "static cluster shapes only");
  static_assert(!DispatchPolicy::IsOverlappingAccum, "needs >= 2 disjoint TMEM accumulator buffers");

  static constexpr int kCtasPerMma = detail::UmmaStyle<Style>::kCtasPerMma;
  static_assert(int(cute::size(AtomThrShapeMNK{})) == kCtasPerMma,
                "Style (Umma1Sm/Umma2Sm) disagrees with the mainloop's TiledMma (cta_group)");

  static constexpr int ClusterM = cute::size<0>(ClusterShape{});
  static constexpr int ClusterN = cute::size<1>(ClusterShape{});
  static constexpr int ClusterSize = ClusterM * ClusterN;
  static_assert(cute::size<2>(ClusterShape{}) == 1, "cluster K extent must be 1");
  static_assert(ClusterM == ScheduleTag::ClusterM && ClusterN == ScheduleTag::ClusterN,
                "mainloop cluster shape and schedule tag disagree");
  static_assert(ClusterM % kCtasPerMma == 0, "2-SM MMA pairs CTAs along M: cluster_m must be even");

  static constexpr bool kGrouped = ScheduleTag::Grouped;
  static_assert(!kGrouped || (ClusterSize == 1 && kCtasPerMma == 1),
                "grouped SM100 kernels run 1x1 clusters and 1-SM MMAs: a padded band is one CTA tile "
                "(KernelConfig.kernel_rejection says the same)");

  static constexpr int CtaM = cute::size<0>(CtaShape_MNK{});
  static constexpr int CtaN = cute::size<1>(CtaShape_MNK{});
  static constexpr int TileK = cute::size<2>(TileShape{});

  // Our scheduler, in per-CTA tiles (see the header comment on m_idx); grouped, over the experts' M.
  using TileScheduler =
      cute::conditional_t<kGrouped, scheduler::PersistentTileScheduler<ScheduleTag, CtaM, CtaN, /*GroupM=*/true>,
                          typename scheduler::TileSchedulerSelector<ScheduleTag, CtaM, CtaN>::type>;
  using SchedulerParams = typename TileScheduler::Params;
  using WorkTileInfo = scheduler::WorkTileInfo;

  static constexpr uint32_t AccumulatorPipelineStageCount =
      DispatchPolicy::Schedule::AccumulatorPipelineStageCount;
  static_assert(AccumulatorPipelineStageCount >= 2, "double-buffered TMEM accumulators");

  // Roles.
  static constexpr uint32_t NumEpilogueThreads = CollectiveEpilogue::ThreadCount;  // 128
  static constexpr uint32_t NumEpilogueWarps = NumEpilogueThreads / cutlass::NumThreadsPerWarp;
  static_assert(NumEpilogueThreads == cutlass::NumThreadsPerWarpGroup, "one epilogue warpgroup");
  static constexpr int kProducerWarp = NumEpilogueWarps;      // 4
  static constexpr int kMmaWarp = NumEpilogueWarps + 1;       // 5
  static constexpr int kTmemWarp = NumEpilogueWarps + 2;      // 6
  static constexpr uint32_t MaxThreadsPerBlock = NumEpilogueThreads + 3 * cutlass::NumThreadsPerWarp;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;

  // Pipelines.
  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
  using MainloopPipelineState = typename CollectiveMainloop::MainloopPipelineState;
  using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;  // unused: no source C
  using EpiLoadPipelineState = typename CollectiveEpilogue::LoadPipelineState;
  using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
  using EpiStorePipelineState = typename CollectiveEpilogue::StorePipelineState;
  using AccumulatorPipeline = cutlass::PipelineUmmaAsync<AccumulatorPipelineStageCount, AtomThrShapeMNK>;
  using AccumulatorPipelineState = typename AccumulatorPipeline::PipelineState;

  using TmemAllocator = cute::conditional_t<kCtasPerMma == 1, cute::TMEM::Allocator1Sm, cute::TMEM::Allocator2Sm>;
  // Whole TMEM: the builder sizes the accumulator stages to TMEM capacity, an allocation must be
  // a power of two, and with one CTA per SM nobody else wants the rest.
  static constexpr int kTmemColumns = TmemAllocator::Sm100TmemCapacityColumns;

  struct SharedStorage {
    struct PipelineStorage : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
      alignas(16) typename AccumulatorPipeline::SharedStorage accumulator;
      // Completes when the epilogues of this CTA and of its MMA peer are done with TMEM.
      alignas(16) cutlass::arch::ClusterBarrier tmem_dealloc;
    } pipelines;

    // Written by tcgen05.alloc; at the same smem offset in both CTAs of a 2-SM pair, as
    // cta_group::2 allocation requires.
    alignas(16) uint32_t tmem_base_ptr;

    // Grouped: the experts' rows and tile ids (scheduler/grouped_rows.hpp).
    cute::conditional_t<kGrouped, scheduler::GroupTable, cute::tuple<>> groups;

    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename CollectiveEpilogue::TensorStorage epilogue;
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(arch_limits::sm100a::kSmemBytes == cutlass::arch::sm100_smem_capacity_bytes,
                "archs.py's sm100a smem_bytes is CUTLASS's SM100 capacity (its builders size stages by that)");
  static_assert(SharedStorageSize <= arch_limits::sm100a::kSmemBytes,
                "shared storage exceeds the 227 KB SM100 opt-in limit; lower Stages");

  struct Arguments {
    ProblemShape problem_shape{};
    MainloopArguments mainloop{};
    EpilogueArguments epilogue{};
    int sm_count = 0;     // multiprocessors of the device
    int max_workers = 0;  // clusters on the clock; 0: sm_count / cluster size
    scheduler::GroupRows group_rows{};  // grouped: the experts' rows (problem M is the padded bands)
  };

  struct Params {
    ProblemShape problem_shape{};
    MainloopParams mainloop{};
    EpilogueParams epilogue{};
    SchedulerParams scheduler{};
  };

  // ------------------------------------------------------------------------------ host ---
  // Structural checks only, as the SM90 kernel: the collectives' can_implement also demand that
  // the contiguous extents (K of a K-major operand, N of D) be 16-byte multiples, which TMA does
  // not need (a box is clipped at the extent and zero-filled; strides and bases are what must be
  // aligned). The builders check those real TMA rules (sm100_tile_mapping.hpp's rejection and
  // the 32-byte rule of e2m1 operands), so N = 8191 or an odd K runs like any other shape
  // (issue 25: CUTLASS's extent checks refused them at launch, after our rules accepted them).
  static bool can_implement(Arguments const& args) {
    auto const [M, N, K, L] = args.problem_shape;
    bool const grouped_ok = !kGrouped || (args.group_rows.rows && args.group_rows.groups == L &&
                                          args.group_rows.groups <= scheduler::kMaxGroups);
    return M >= 1 && N >= 1 && K >= 1 && L >= 1 && grouped_ok && (args.sm_count >= 1 || args.max_workers >= 1);
  }

  static Params to_underlying_arguments(Arguments const& args) {
    auto const [M, N, K, L] = args.problem_shape;
    typename TileScheduler::Arguments sched_args;
    sched_args.m = M;
    sched_args.n = N;
    sched_args.l = L;
    if constexpr (kGrouped) {  // the clock runs over the experts' rows; L and M describe the copies
      sched_args.m = args.group_rows.total;
      sched_args.l = 1;
      sched_args.group_rows = args.group_rows;
    }
    sched_args.k_tiles = (K + TileK - 1) / TileK;  // the clock's K ranges (split-K / stream-K) need it
    sched_args.max_workers = args.max_workers;
    return {args.problem_shape,
            CollectiveMainloop::to_underlying_arguments(args.problem_shape, args.mainloop, nullptr,
                                                        cutlass::KernelHardwareInfo{}),
            CollectiveEpilogue::to_underlying_arguments(args.problem_shape, args.epilogue, nullptr),
            TileScheduler::to_underlying_arguments(sched_args, args.sm_count)};
  }

  static dim3 get_grid_shape(Params const& params) { return TileScheduler::get_grid_shape(params.scheduler); }
  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }
  static dim3 get_cluster_shape() { return dim3(ClusterM, ClusterN, 1); }

  // ---------------------------------------------------------------------------- device ---
  // Grouped: the padded band of a tile's rows (the copies' M tile; see the header comment).
  CUTLASS_DEVICE static int32_t band_of(Params const& params, TileScheduler const& sched, WorkTileInfo const& w) {
    return sched.ids_before(w.l_idx) / params.scheduler.tiles_n + w.m_idx;
  }
  // The (m, n, k, l) the MMA and the epilogue address a tile by: D's tile, at L 0 when grouped.
  CUTLASS_DEVICE static auto tile_coord(Params const& params, TileScheduler const& sched, WorkTileInfo const& w) {
    if constexpr (kGrouped) return cute::make_coord(band_of(params, sched, w), w.n_idx, cute::_, 0);
    else return cute::make_coord(w.m_idx, w.n_idx, cute::_, w.l_idx);
  }

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH__) && !defined(CUTLASS_ARCH_TCGEN_ENABLED)
    // Built for an arch without tcgen05 (e.g. a non-'a' target): never launched there.
    CUTE_INVALID_CONTROL_PATH("Sm100GemmPersistent needs sm_100a");
#else
    using namespace cute;
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);

    int const warp_idx = cutlass::canonical_warp_idx_sync();
    uint32_t const lane_predicate = cute::elect_one_sync();
    bool const is_epilogue = warp_idx < kProducerWarp;
    bool const is_producer = warp_idx == kProducerWarp;
    bool const is_mma = warp_idx == kMmaWarp;
    bool const is_tmem = warp_idx == kTmemWarp;

    auto cluster_shape = ClusterShape{};
    uint32_t const cta_rank_in_cluster = cute::block_rank_in_cluster();
    dim3 const block_id_in_cluster = cute::block_id_in_cluster();
    // In a 2-SM pair, the even-rank CTA (rank_m % 2 == 0) issues the MMAs (sm100_tile_mapping.hpp;
    // the role does not depend on the tile, so m_idx 0 stands in here).
    auto const role = sm100_map::cta_role(cta_rank_in_cluster, 0, kCtasPerMma, CtaM);
    bool const is_mma_leader_cta = role.leader;
    [[maybe_unused]] uint32_t const mma_peer_cta_rank = role.peer_rank;

    auto const problem_shape_MNKL = params.problem_shape;
    int const K = get<2>(problem_shape_MNKL);
    int const k_tiles = (K + TileK - 1) / TileK;

    CollectiveMainloop collective_mainloop(params.mainloop, cluster_shape, cta_rank_in_cluster);
    CollectiveEpilogue collective_epilogue(params.epilogue, shared.tensors.epilogue);

    if (is_producer && lane_predicate) collective_mainloop.prefetch_tma_descriptors();
    if (warp_idx == 0 && lane_predicate) CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);

    // -- pipelines (barrier init now, masks after the cluster-wide init sync) --
    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (is_producer) mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (is_mma) mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    // In 2-SM mode only the leader's full barrier expects the bytes of both CTAs' loads.
    mainloop_pipeline_params.is_leader = lane_predicate && is_mma_leader_cta && is_producer;
    mainloop_pipeline_params.transaction_bytes = CollectiveMainloop::TmaTransactionBytes;
    mainloop_pipeline_params.initializing_warp = kProducerWarp;
    MainloopPipeline mainloop_pipeline(shared.pipelines.mainloop, mainloop_pipeline_params, cluster_shape,
                                       cute::true_type{}, cute::false_type{});

    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (is_epilogue) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_pipeline_params.dst_blockid = cta_rank_in_cluster;
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = NumEpilogueThreads;
    epi_load_pipeline_params.transaction_bytes = CollectiveEpilogue::TmaTransactionBytes;
    epi_load_pipeline_params.initializing_warp = kTmemWarp;
    EpiLoadPipeline epi_load_pipeline(shared.pipelines.epi_load, epi_load_pipeline_params);

    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename AccumulatorPipeline::Params acc_pipeline_params;
    if (is_mma) acc_pipeline_params.role = AccumulatorPipeline::ThreadCategory::Producer;
    if (is_epilogue) acc_pipeline_params.role = AccumulatorPipeline::ThreadCategory::Consumer;
    acc_pipeline_params.producer_arv_count = 1;  // one tcgen05.commit per tile
    // The leader's empty barrier is released by the epilogues of both CTAs of the pair.
    acc_pipeline_params.consumer_arv_count = kCtasPerMma * NumEpilogueThreads;
    acc_pipeline_params.initializing_warp = kMmaWarp;
    AccumulatorPipeline acc_pipeline(shared.pipelines.accumulator, acc_pipeline_params, cluster_shape,
                                     cute::true_type{}, cute::false_type{});

    if (is_tmem && lane_predicate) {
      shared.pipelines.tmem_dealloc.init(kCtasPerMma * NumEpilogueThreads);
    }
    cutlass::arch::fence_barrier_init();
    // Grouped: the table every role's scheduler reads, complete at the sync below. Malformed
    // offs were reported by the in pass; here they are only clamped.
    scheduler::GroupTable const* groups = nullptr;
    if constexpr (kGrouped) {
      if (is_tmem) TileScheduler::build_groups(params.scheduler, shared.groups, int(threadIdx.x % 32));
      groups = &shared.groups;
    }

    // Every barrier of the cluster is initialised before any CTA arrives on a remote one.
    if constexpr (ClusterSize > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }
    mainloop_pipeline.init_masks(cluster_shape, block_id_in_cluster);
    acc_pipeline.init_masks(cluster_shape, block_id_in_cluster);

    // MMA and epilogue wait here for the TMEM allocation; the allocator only arrives.
    cutlass::arch::NamedBarrier tmem_alloc_barrier(
        NumEpilogueThreads + 2 * cutlass::NumThreadsPerWarp, cutlass::arch::ReservedNamedBarriers::TmemAllocBarrier);

    auto tmem_storage = collective_mainloop.template init_tmem_tensors<EpilogueTile, false>(EpilogueTile{});

    if (is_producer) {
      // ---------------------------------------------------------------- TMA producer ---
      TileScheduler sched(params.scheduler, groups);
      auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, shared.tensors.mainloop);
      MainloopPipelineState state = cutlass::make_producer_start_state<MainloopPipeline>();
      for (WorkTileInfo w = sched.initial_work(); w.is_valid(); w = sched.next_work(w)) {
        auto k_iter = cute::make_coord_iterator(k_tiles);
        if constexpr (kGrouped) {
          auto [next_state, next_iter] = collective_mainloop.load_grouped(
              mainloop_pipeline, state, load_inputs, band_of(params, sched, w), w.n_idx, w.l_idx, k_iter, k_tiles);
          state = next_state;
        } else {
          auto [next_state, next_iter] = collective_mainloop.load(mainloop_pipeline, state, load_inputs,
                                                                  tile_coord(params, sched, w), k_iter, k_tiles);
          state = next_state;
        }
      }
      // Wait until the consumers released every stage: no multicast write or remote arrive
      // aimed at this CTA is still in flight when it reaches the exit barrier.
      collective_mainloop.load_tail(mainloop_pipeline, state);
    } else if (is_mma) {
      // ------------------------------------------------------------------------- MMA ---
      tmem_alloc_barrier.arrive_and_wait();
      detail::tcgen05_after_thread_sync();
      collective_mainloop.set_tmem_offsets(tmem_storage, shared.tmem_base_ptr);
      auto mma_inputs = collective_mainloop.mma_init(tmem_storage, shared.tensors.mainloop);

      if (is_mma_leader_cta) {  // the 2-SM peer's MMA warp has nothing to issue
        TileScheduler sched(params.scheduler, groups);
        MainloopPipelineState ml_state;
        AccumulatorPipelineState acc_state = cutlass::make_producer_start_state<AccumulatorPipeline>();
        for (WorkTileInfo w = sched.initial_work(); w.is_valid(); w = sched.next_work(w)) {
          auto coord = tile_coord(params, sched, w);
          // mma() acquires the accumulator buffer (waits for the epilogue to drain it),
          // zero-initialises it with the first k-block and consumes k_tiles smem stages.
          ml_state = collective_mainloop.mma(
              cute::make_tuple(mainloop_pipeline, acc_pipeline), cute::make_tuple(ml_state, acc_state),
              collective_mainloop.slice_accumulator(tmem_storage, acc_state.index()), mma_inputs, coord, k_tiles);
          // tcgen05.commit: the full barrier (of both CTAs in 2-SM mode) fires when this
          // tile's MMAs have landed in TMEM.
          acc_pipeline.producer_commit(acc_state);
          ++acc_state;
        }
      }
    } else if (is_tmem) {
      // ---------------------------------------------------------------- TMEM allocator ---
      TmemAllocator tmem_allocator{};
      tmem_allocator.allocate(kTmemColumns, &shared.tmem_base_ptr);
      // One allocation per CTA: let a later CTA on this SM allocate as soon as we free.
      tmem_allocator.release_allocation_lock();
      detail::tcgen05_before_thread_sync();
      tmem_alloc_barrier.arrive();

      // Dealloc once the epilogues of this CTA and of its peer drained their last tile: by
      // then every MMA writing this CTA's TMEM has completed (its commit was waited on).
      shared.pipelines.tmem_dealloc.wait(0);
      detail::tcgen05_after_thread_sync();
      tmem_allocator.free(shared.tmem_base_ptr, kTmemColumns);
    } else if (is_epilogue) {
      // -------------------------------------------------------------------- epilogue ---
      tmem_alloc_barrier.arrive_and_wait();
      detail::tcgen05_after_thread_sync();
      collective_mainloop.set_tmem_offsets(tmem_storage, shared.tmem_base_ptr);

      TileScheduler sched(params.scheduler, groups);
      EpiLoadPipelineState load_state;
      EpiStorePipelineState store_state = cutlass::make_producer_start_state<EpiStorePipeline>();
      AccumulatorPipelineState acc_state;
      bool stored = false;
      for (WorkTileInfo w = sched.initial_work(); w.is_valid(); w = sched.next_work(w)) {
        auto coord = tile_coord(params, sched, w);
        auto accumulator = get<0>(collective_mainloop.slice_accumulator(tmem_storage, acc_state.index()));
        // store() waits for the accumulator, releases it right after its last tcgen05.ld
        // (so the MMA of the next-but-one tile may start), then converts and TMA-stores.
        auto [next_load, next_store, next_acc] = collective_epilogue.template store<false>(
            epi_load_pipeline, load_state, epi_store_pipeline, store_state, acc_pipeline, acc_state,
            problem_shape_MNKL, CtaShape_MNK{}, coord, TileShape{}, TiledMma{}, accumulator,
            shared.tensors.epilogue);
        load_state = next_load;
        store_state = next_store;
        acc_state = next_acc;
        stored = true;
      }
      if (stored) {
        collective_epilogue.store_tail(epi_load_pipeline, load_state, epi_store_pipeline, store_state,
                                       CtaShape_MNK{});
      }
      // The smem of pending TMA stores must stay valid until the bulk copies have read it.
      cute::tma_store_wait<0>();

      detail::tcgen05_before_thread_sync();
      shared.pipelines.tmem_dealloc.arrive();
      if constexpr (kCtasPerMma == 2) {
        shared.pipelines.tmem_dealloc.arrive(mma_peer_cta_rank);
      }
    }

    // No CTA leaves while a cluster peer may still multicast into it or arrive on its
    // barriers (remote mbarrier ops on an exited CTA are undefined).
    if constexpr (ClusterSize > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    }
#endif
  }
};

}  // namespace persistent_gemm::kernel
