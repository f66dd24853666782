// Our persistent, warp-specialized SM90 GEMM kernel.
//
// The kernel owns the persistent loop, the role split and the schedule; CUTLASS collectives
// are composed inside it by type (the mainloop's TMA loads / GMMA loop, the epilogue's store),
// the way FlashAttention-3 composes its hopper/ kernels.
//
//   warpgroup 0 (producer, setmaxnreg down):
//     warp 0   TMA loads of A/B tiles into the smem ring (mainloop pipeline)
//     warp 1   epilogue source loads, only if the epilogue asks for them (ours never do: no C)
//     warp 2,3 idle
//   warpgroups 1, 2 (consumers, setmaxnreg up): GMMA mainloop + epilogue
//     Cooperative: both consumer WGs share every tile (TiledMma spans 256 threads).
//     PingPong:    consumer c takes steps c, c+2, ... of the CTA's clock; an ordered barrier
//                  alternates the two WGs' mainloops and epilogues, so one WG's epilogue
//                  overlaps the other's MMAs.
//
// Every role owns a PersistentTileScheduler and walks initial_work()/next_work() itself; the
// walk is a pure function of (Params, blockIdx), so roles never exchange tile coordinates.
//
// Split-K (ScheduleTag::SplitK = S > 1): each work unit reduces its own K-tile range. Units
// 0..S'-2 of a tile store their fp32 accumulators to a workspace slot (in fragment order: no
// coordinate math) and set the slot's flag to the launch's nonce; unit S'-1, the reducer, waits
// for every flag of its tile, clears them, and adds slots 0..S'-2 in index order before the
// normal epilogue, so the sum's order is fixed and the result bitwise reproducible. The reducer waits only on smaller ids, which every worker reaches
// no later than it (one clock, ids in order) and all launched clusters are resident: no deadlock.
//
// Grouped (ScheduleTag::Grouped, MoE experts): before the roles split, one producer warp builds
// the groups' table (rows and tile ids, from offs) in shared memory, and every role walks the
// grouped clock over it; each tile's group and rows go to the mainloop's producer (its Y rows)
// and to the epilogue (the rows it may store) through set_group_tile.
//
// Tail CTAs (valid && !in_bounds: the part of a cluster hanging past the M/N tile grid) run the
// normal path. They must keep issuing loads and releasing stages, because their cluster
// partners consume the halves they multicast and wait on their consumers' releases; the TMA
// unit zero-fills out-of-bounds boxes, and out-of-bounds stores are clipped (TMA store) or
// predicated off (Sm90PredicatedEpilogue), so no memory outside D is touched. Skipping only the
// MMAs would save no time: the CTA is paced by its partners' loads either way.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cuda_runtime_api.h>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"  // CUTLASS_GRID_CONSTANT
#include "cutlass/pipeline/pipeline.hpp"

#include "persistent_gemm/kernel/cluster_launch.hpp"
#include "persistent_gemm/generated/arch_limits.hpp"
#include "persistent_gemm/kernel/persistent_kernel_types.hpp"
#include "persistent_gemm/scheduler/tile_scheduler.hpp"

namespace persistent_gemm::kernel {

struct Cooperative {};
struct PingPong {};

template <class CollectiveMainloop_, class CollectiveEpilogue_, class ScheduleTag_, class Style_>
class Sm90GemmPersistent {
 public:
  PGEMM_PERSISTENT_KERNEL_TYPES(CollectiveMainloop_, CollectiveEpilogue_, ScheduleTag_, Style_);
  static constexpr int kSplitK = ScheduleTag::SplitK;
  static constexpr bool kStreamK = ScheduleTag::StreamK;
  static constexpr bool kReducesK = ScheduleTag::ReducesK;  // some unit may hold part of a tile's K
  static constexpr bool kGrouped = ScheduleTag::Grouped;    // (group, tile) ids over the groups' rows
  static constexpr bool kCooperative = std::is_same_v<Style, Cooperative>;
  static_assert(kCooperative || std::is_same_v<Style, PingPong>, "Style must be Cooperative or PingPong");

  using ClusterShape = typename CollectiveMainloop::DispatchPolicy::ClusterShape;
  using ElementA = typename CollectiveMainloop::ElementA;
  using ElementB = typename CollectiveMainloop::ElementB;
  using ElementAccumulator = typename CollectiveMainloop::ElementAccumulator;
  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
  using MainloopState = typename CollectiveMainloop::PipelineState;
  using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
  using EpiLoadState = typename CollectiveEpilogue::LoadPipelineState;
  using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
  using EpiStoreState = typename CollectiveEpilogue::StorePipelineState;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  using Scheduler = typename scheduler::TileSchedulerSelector<ScheduleTag, kTileM, kTileN>::type;
  static_assert(Scheduler::ClusterM == cute::size<0>(ClusterShape{}) &&
                    Scheduler::ClusterN == cute::size<1>(ClusterShape{}) && cute::size<2>(ClusterShape{}) == 1,
                "schedule tag's cluster must match the mainloop's ClusterShape (multicast masks depend on it)");

  // ---- threads and registers -----------------------------------------------------------
  static constexpr uint32_t kWarpGroupThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t kMmaThreads = cute::size(TiledMma{});  // threads sharing one tile
  static constexpr uint32_t kConsumerWarpGroups = 2;
  static_assert(kCooperative ? kMmaThreads == 2 * kWarpGroupThreads : kMmaThreads == kWarpGroupThreads,
                "Cooperative needs a 256-thread TiledMma, PingPong a 128-thread one (use the matching builder schedule)");
  static_assert(!kCooperative || kTileM % 128 == 0, "Cooperative splits the tile's M across two warpgroups");
  static constexpr uint32_t MaxThreadsPerBlock = kWarpGroupThreads * (1 + kConsumerWarpGroups);  // 384
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;

  // Same split as CUTLASS: 40 / 232 (x 128 + 2 x 128 = 64.5K registers), moving to 24 / 240 when a
  // consumer thread holds >= 208 accumulator registers (e.g. a 128x256 ping-pong tile).
  // A mainloop may keep several accumulator-sized register sets (kAccumulatorCopies, e.g. the
  // promoting FP8 mainloop's temporaries); CUTLASS's own keep their extras out of this count.
  template <class M, class = void>
  struct AccumulatorCopies : std::integral_constant<int, 1> {};
  template <class M>
  struct AccumulatorCopies<M, std::void_t<decltype(M::kAccumulatorCopies)>>
      : std::integral_constant<int, M::kAccumulatorCopies> {};
  // ... or registers that are not whole accumulator copies (kExtraRegisters: the sliced
  // promoting mainloop's slice temporaries and A fragments).
  template <class M, class = void>
  struct ExtraRegisters : std::integral_constant<int, 0> {};
  template <class M>
  struct ExtraRegisters<M, std::void_t<decltype(M::kExtraRegisters)>>
      : std::integral_constant<int, M::kExtraRegisters> {};
  // A mainloop that needs the tile's coordinates in its consumer (the MX mainloop: where the
  // tile's rows sit inside their scale atoms) exposes set_tile(); CUTLASS's do not.
  template <class M, class C, class = void>
  struct HasSetTile : std::false_type {};
  template <class M, class C>
  struct HasSetTile<M, C, std::void_t<decltype(std::declval<M&>().set_tile(std::declval<C const&>()))>>
      : std::true_type {};
  template <class C>
  CUTLASS_DEVICE static void set_tile(CollectiveMainloop& mainloop, C const& blk_coord) {
    if constexpr (HasSetTile<CollectiveMainloop, C>::value) mainloop.set_tile(blk_coord);
  }

  static constexpr int kAccRegsPerThread = AccumulatorCopies<CollectiveMainloop>::value * kTileM * kTileN /
                                               int(kMmaThreads) * int(sizeof(ElementAccumulator)) / int(sizeof(uint32_t)) +
                                           ExtraRegisters<CollectiveMainloop>::value;
  static constexpr bool kHeavyRegisterPressure = kAccRegsPerThread >= 208;
  static constexpr uint32_t kLoadRegisters = kHeavyRegisterPressure ? 24 : 40;
  static constexpr uint32_t kMmaRegisters = kHeavyRegisterPressure ? 240 : 232;

  // ---- barriers ----------------------------------------------------------------------------
  // Split-K's named barrier over the threads of one tile (PingPong: one per consumer WG); a user
  // id, NamedBarrier adds CUTLASS's reserved count.
  static constexpr uint32_t kSplitBarrier = 0;
  // PingPong: (mainloop, epilogue) x 2 WGs. Cooperative leaves it unused (32 B of smem).
  using MathOrderBarrier = cutlass::OrderedSequenceBarrier<2, kConsumerWarpGroups>;
  // Lets the mainloop warp issue its first tile's loads before the epilogue-load warp competes.
  using LoadOrderBarrier = cutlass::OrderedSequenceBarrier<1, 2>;

  // ---- shared memory -------------------------------------------------------------------------
  // Tensors first: the dynamic smem window starts 1 KB aligned, so the swizzled TMA/GMMA
  // buffers sit on their natural boundary; the barriers (a few hundred bytes) follow.
  struct SharedStorage {
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename CollectiveEpilogue::TensorStorage epilogue;
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
    struct PipelineStorage : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
      alignas(16) typename MathOrderBarrier::SharedStorage math_order;
      alignas(16) typename LoadOrderBarrier::SharedStorage load_order;
    } pipelines;
  };
  // Grouped: the groups' table after the rest.
  struct GroupedSharedStorage : SharedStorage {
    scheduler::GroupTable groups;
  };
  using KernelStorage = std::conditional_t<kGrouped, GroupedSharedStorage, SharedStorage>;
  static constexpr int SharedStorageSize = int(sizeof(KernelStorage));
  static_assert(SharedStorageSize <= arch_limits::sm90a::kSmemBytes,
                "shared storage exceeds the 227 KB SM90 opt-in limit; lower Stages");

  // ---- host interface ------------------------------------------------------------------------
  struct Arguments {
    ProblemShape problem{};
    typename CollectiveMainloop::Arguments mainloop{};
    typename CollectiveEpilogue::Arguments epilogue{};
    typename Scheduler::Arguments scheduler{};
    int sm_count = 0;  // multiprocessors of the device; sizes the persistent grid
    // Split-K only: workspace_bytes(args) bytes, 256 B aligned; never zeroed (see split_fixup).
    void* workspace = nullptr;
    uint64_t split_nonce = 0;  // one per launch (next_split_nonce()); a graph replays its capture's
  };

  struct Params {
    ProblemShape problem{};
    typename CollectiveMainloop::Params mainloop{};
    typename CollectiveEpilogue::Params epilogue{};
    typename Scheduler::Params scheduler{};
    // Split-K: [tile][split < S'-1]; stream-K: [tail worker][CTA of its cluster] (a worker's
    // partial piece is its first tail step, so one slot each). Flags hold the launch's nonce
    // once their slot is written; slots hold [fragment element][MMA thread].
    uint64_t* split_flags = nullptr;
    float* split_partials = nullptr;
    uint64_t split_nonce = 0;          // never 0, never a value a flag holds between launches
  };

  // ---- split-K workspace ---------------------------------------------------------------------
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static typename Scheduler::Params scheduler_params(Arguments const& args) {
    typename Scheduler::Arguments sched = args.scheduler;
    sched.m = cute::get<0>(args.problem);
    sched.n = cute::get<1>(args.problem);
    sched.l = cute::get<3>(args.problem);
    sched.k_tiles = (cute::get<2>(args.problem) + kTileK - 1) / kTileK;
    return Scheduler::to_underlying_arguments(sched, args.sm_count > 0 ? args.sm_count : 1);
  }
  // Partial-sum slots the problem needs: 0 when no unit holds part of a tile's K.
  static int64_t partial_slots(Arguments const& args) {
    if constexpr (!kReducesK) {
      return 0;
    } else {
      auto const p = scheduler_params(args);
      if constexpr (kStreamK) {
        // One slot per tail worker and CTA. With clusters the launch may cap the workers after
        // the caller sized this (launch_sm90_persistent), and a capped grid can have a tail
        // where the uncapped one had none: size for every worker, which bounds any tail.
        constexpr int kClusterSize = Scheduler::ClusterM * Scheduler::ClusterN;
        return int64_t(kClusterSize > 1 ? p.num_workers : p.sk_workers) * kClusterSize;
      }
      int64_t const tiles = int64_t(p.tiles_m) * p.tiles_n * cute::get<3>(args.problem);
      return tiles * (p.splits - 1);
    }
  }
  // Flags first (one 8-byte flag per partial slot), 256 B aligned partials after; nothing when
  // unsplit. Nobody zeroes the workspace: see split_fixup for why no memset is needed.
  static size_t flag_bytes(Arguments const& args) { return size_t((partial_slots(args) * 8 + 255) / 256 * 256); }
  static size_t workspace_bytes(Arguments const& args) {
    int64_t const slots = partial_slots(args);
    if (slots == 0) return 0;
    return flag_bytes(args) + size_t(slots) * size_t(kTileM * kTileN) * sizeof(float);
  }

  // Cheap structural checks only. The collectives' own can_implement also demands that the
  // contiguous extents (K of a K-major operand, N of D) be multiples of 16 B; TMA does not need
  // that (the box is clipped and zero-filled), so the builder checks the real TMA constraints
  // (16 B aligned base, 16 B multiple strides) instead and this kernel accepts any M, N, K >= 1.
  static bool can_implement(Arguments const& args) {
    auto const [m, n, k, l] = args.problem;
    if (m < 1 || n < 1 || k < 1 || l != 1) return false;
    if (args.sm_count < 1 && args.scheduler.max_workers < 1) return false;
    if (CollectiveEpilogue::get_workspace_size(args.problem, args.epilogue) != 0) return false;  // none wired
    if (workspace_bytes(args) != 0 && (args.workspace == nullptr || reinterpret_cast<uintptr_t>(args.workspace) % 256))
      return false;
    return true;
  }

  static Params to_underlying_arguments(Arguments const& args) {
    Params p{args.problem,
             CollectiveMainloop::to_underlying_arguments(args.problem, args.mainloop, nullptr),
             CollectiveEpilogue::to_underlying_arguments(args.problem, args.epilogue, nullptr),
             scheduler_params(args)};
    p.split_nonce = args.split_nonce;
    if (size_t const flags = flag_bytes(args)) {
      p.split_flags = static_cast<uint64_t*>(args.workspace);
      p.split_partials = reinterpret_cast<float*>(static_cast<char*>(args.workspace) + flags);
    }
    return p;
  }

  static dim3 get_grid_shape(Params const& params) { return Scheduler::get_grid_shape(params.scheduler); }
  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }
  static dim3 get_cluster_shape() { return dim3(Scheduler::ClusterM, Scheduler::ClusterN, 1); }

  // ---- device -------------------------------------------------------------------------------
  // The unit's K-tiles: [begin, begin + count). Unsplit kernels keep the whole-K constant.
  CUTLASS_DEVICE static int k_begin(scheduler::WorkTileInfo const& w) {
    if constexpr (!kReducesK) return 0;
    else return w.k_tile_begin;
  }
  CUTLASS_DEVICE static int k_count(scheduler::WorkTileInfo const& w, int k_tiles) {
    if constexpr (!kReducesK) return k_tiles;
    else return w.k_tile_end - w.k_tile_begin;
  }

  // Split-K / stream-K fixup, called by every thread that owns the tile (kMmaThreads of them)
  // after its mainloop. Returns true when this unit runs the epilogue: a whole tile, or the
  // reducer of a split one. A partial unit stores its fragment to its slot, then writes the
  // launch's nonce to the slot's flag (release); the reducer waits until each of its tile's
  // flags holds the nonce (acquire), clears it, and adds the slots in a fixed order (bitwise
  // reproducible): split-K's reducer is split S'-1 and adds splits 0..S'-2; stream-K's is the
  // piece at K-tile 0 and adds the pieces of the workers after its own, in worker order.
  //
  // Why the workspace needs no memset (a second graph node, ~2-3 us at decode): after a launch
  // every flag it set is 0 again (each slot has exactly one reducer in the same launch), and a
  // flag can only read as this launch's nonce once this launch wrote it -- nonces are 64-bit,
  // distinct per eager launch and seeded randomly per process, so stale or uninitialised memory
  // does not hold one. A CUDA graph replays its capture's nonce on its own private workspace,
  // which the previous replay left cleared.
  template <class Accumulators>
  CUTLASS_DEVICE static bool split_fixup(Params const& params, scheduler::WorkTileInfo const& work,
                                         Accumulators& acc, int mma_thread_idx, uint32_t barrier_id) {
    if constexpr (!kReducesK) {
      return true;
    } else {
      constexpr int kFrag = int(decltype(cute::size(acc))::value);
      static_assert(kFrag * int(kMmaThreads) == kTileM * kTileN, "accumulator fragments must tile the output tile");
      constexpr int64_t kSlot = int64_t(kTileM) * kTileN;
      auto const& sp = params.scheduler;
      int64_t first_slot, slot_stride;  // slot of split / piece i: first_slot + i * slot_stride
      int partials;                     // slots the reducer adds
      bool reducer;
      if constexpr (kStreamK) {
        if (work.k_tile_begin == 0 && work.k_tile_end == sp.k_tiles) return true;  // a whole tile
        reducer = work.split_idx == 0;
        if (!work.in_bounds) return reducer;  // a tail CTA: no slot, no flag; its stores are predicated off
        // The unit's pieces belong to consecutive workers of its lane from the reducer's on
        // (workers owner * lanes + lane, + lanes, ...); one slot per (worker, CTA of the cluster).
        constexpr int kCtas = Scheduler::ClusterM * Scheduler::ClusterN;
        int const rank = (work.m_idx - work.cluster_row * Scheduler::ClusterM) * Scheduler::ClusterN +
                         (work.n_idx - work.cluster_col * Scheduler::ClusterN);
        int32_t const u = work.tile_id - sp.sk_first, lane = u % sp.sk_lanes;
        int32_t const owner = Scheduler::sk_owner(sp, int64_t(u / sp.sk_lanes) * sp.k_tiles);
        first_slot = (int64_t(owner) * sp.sk_lanes + lane) * kCtas + rank;
        slot_stride = int64_t(kCtas) * sp.sk_lanes;
        partials = reducer ? Scheduler::sk_pieces(sp, work.tile_id) - 1 : 0;
        if (reducer) first_slot += slot_stride;  // its partners are the workers after its own
      } else {
        int const splits = sp.splits;
        reducer = work.split_idx == splits - 1;
        if (splits == 1 || !work.in_bounds) return reducer;
        int64_t const tile = (int64_t(work.l_idx) * sp.tiles_m + work.m_idx) * sp.tiles_n + work.n_idx;
        first_slot = tile * (splits - 1);
        slot_stride = 1;
        partials = splits - 1;
      }
      uint64_t const nonce = params.split_nonce;
      float* const slots = params.split_partials + first_slot * kSlot + mma_thread_idx;
      uint64_t* const flags = params.split_flags + first_slot;
      if (!reducer) {
        float* const slot = slots + int64_t(work.split_idx) * slot_stride * kSlot;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kFrag; ++i) __stcg(slot + i * int(kMmaThreads), acc(i));  // coalesced across threads
        cutlass::arch::NamedBarrier::arrive_and_wait(kMmaThreads, barrier_id);
        if (mma_thread_idx == 0) {
          // Cumulative release: every thread's stores (ordered before us by the barrier) first.
          asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(flags + work.split_idx * slot_stride), "l"(nonce)
                       : "memory");
        }
        return false;
      }
      if (mma_thread_idx == 0) {
        for (int s = 0; s < partials; ++s) {
          uint64_t seen = 0;
          do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(seen) : "l"(flags + s * slot_stride) : "memory");
          } while (seen != nonce);
          flags[s * slot_stride] = 0;  // the slot's only reader: cleared for the next launch on this memory
        }
      }
      cutlass::arch::NamedBarrier::arrive_and_wait(kMmaThreads, barrier_id);
      for (int s = 0; s < partials; ++s) {
        float const* const slot = slots + int64_t(s) * slot_stride * kSlot;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kFrag; ++i) acc(i) += __ldcg(slot + i * int(kMmaThreads));
      }
      return true;
    }
  }

  // Every role's copy of the clock (grouped: over the CTA's table of the groups).
  CUTLASS_DEVICE static Scheduler make_scheduler(Params const& params, KernelStorage& shared) {
    if constexpr (kGrouped) return Scheduler(params.scheduler, &shared.groups);
    else return Scheduler(params.scheduler);
  }

  // The persistent walk of every warp role (defined below, after the launch helpers).
  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf);
};

// The __global__ entry: one persistent CTA per (cluster rank, worker); Params in param space.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, Kernel::MinBlocksPerMultiprocessor)
    sm90_gemm_persistent_entry(CUTLASS_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ char smem[];
  Kernel kernel;
  kernel(params, smem);
}

// What every SM90 builder's run() does once its own checks passed: Params from the kernel's
// Arguments, then the persistent grid on clusters, on `stream`.
template <class Kernel>
cudaError_t launch_sm90_persistent(typename Kernel::Arguments args, cudaStream_t stream) {
  void const* entry = reinterpret_cast<void const*>(&sm90_gemm_persistent_entry<Kernel>);
  // Workers not forced: no more clusters than the device holds at once (max_active_clusters),
  // as on SM100. The workspace the caller sized for the uncapped count covers the capped one
  // (split-K's slots do not depend on the workers; stream-K's are sized for all of them).
  constexpr int kClusterSize = Kernel::Scheduler::ClusterM * Kernel::Scheduler::ClusterN;
  if (kClusterSize > 1 && args.scheduler.max_workers < 1 && args.sm_count > 0) {
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess) {
      int const resident = max_active_clusters<Kernel>(entry, device);
      if (resident > 0 && resident < args.sm_count / kClusterSize) args.scheduler.max_workers = resident;
    }
  }
  return launch_on_clusters<Kernel>(entry, Kernel::to_underlying_arguments(args), stream);
}

// ---- the roles' device code: the producer warp's TMA loads, the consumers' mainloop, split-K fixup, epilogue 

template <class CollectiveMainloop_, class CollectiveEpilogue_, class ScheduleTag_, class Style_>
CUTLASS_DEVICE void Sm90GemmPersistent<CollectiveMainloop_, CollectiveEpilogue_, ScheduleTag_, Style_>::operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  KernelStorage& shared = *reinterpret_cast<KernelStorage*>(smem_buf);

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

  if constexpr (kGrouped) {
    // The groups' rows are read once per CTA by an idle producer warp, then published to the
    // CTA (a cluster's relaxed arrive below would not order these stores).
    if (warp_idx == 2) Scheduler::build_groups(params.scheduler, shared.groups, lane_idx);
    __syncthreads();
  }

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

  Scheduler scheduler = make_scheduler(params, shared);

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
        if constexpr (kGrouped) collective_mainloop.set_group_tile(scheduler.grouped_tile(work));
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
        if constexpr (kGrouped) collective_epilogue.set_group_tile(scheduler.grouped_tile(work));

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
        if constexpr (kGrouped) collective_epilogue.set_group_tile(scheduler.grouped_tile(work));
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
