// Benchmark peer, not part of the package: stock CUTLASS 3.x on SM90 -- GemmUniversal with
// CUTLASS's own PersistentScheduler, or its StreamKScheduler -- over the same collectives as our
// sm90a_bf16_128x256x64_c2x1_sw8_row_coop (TMA + GMMA cooperative mainloop, auto stage count,
// TMA epilogue, cluster 2x1), swizzle 8 along N. The only difference from ours is the kernel
// around the collectives and the scheduler, so M = 3000 (CUTLASS pads the swizzled grid, ours
// narrows the last panel) isolates what our scheduler is worth.
//
// Built at benchmark time by benchmarks/bench_mm.py --cutlass-peer (torch.utils.cpp_extension.load);
// no torch headers here (they need C++20, CUTLASS's SM90 code is built as C++17): the binding is
// cutlass_sm90_stock.cpp.
#include <cstdint>
#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"
#include "cutlass/util/packed_stride.hpp"

namespace {

using Element = cutlass::bfloat16_t;
using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
constexpr int kAlign = 8;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, kAlign, Element,
    cutlass::layout::RowMajor, kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlign, Element,
    cutlass::layout::ColumnMajor, kAlign, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

// The same collectives under CUTLASS's two SM90 persistent schedulers: its data-parallel
// PersistentScheduler, and its StreamKScheduler (deterministic turnstile reduction), which is
// the yardstick for our stream-K tail on the same tile.
template <class Scheduler>
using GemmOn = cutlass::gemm::device::GemmUniversalAdapter<
    cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>>;

// Both schedulers take the same swizzle and raster (along N); `configure` sets what only one has.
template <class Gemm, class Configure>
char const* run(void const* a, int64_t lda, void const* b, int64_t ldb, void* d, int m, int n, int k, int swizzle,
                void* workspace, size_t workspace_bytes, cudaStream_t stream, size_t* workspace_needed,
                Configure configure) {
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, k, 1));
  cute::get<0>(sa) = lda;
  StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(n, k, 1));
  cute::get<0>(sb) = ldb;
  StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(m, n, 1));
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {m, n, k, 1},
                                {static_cast<Element const*>(a), sa, static_cast<Element const*>(b), sb},
                                {{1.0f, 0.0f}, nullptr, sd, static_cast<Element*>(d), sd}};
  // The SM count once per process: left 0, CUTLASS asks the driver on every call
  // (cudaGetDeviceProperties), host time that a kernel-time measurement cannot hide.
  static int const sm_count = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms;
  }();
  args.hw_info.sm_count = sm_count;
  args.scheduler.max_swizzle_size = swizzle;
  args.scheduler.raster_order = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params::RasterOrderOptions::AlongN;
  configure(args.scheduler);
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return "cannot implement this problem";
  *workspace_needed = Gemm::get_workspace_size(args);
  if (*workspace_needed > workspace_bytes) return nullptr;  // caller retries with the size
  // initialize() also clears what stream-K's workspace needs cleared (a memset on `stream`).
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return "initialize failed";
  if (gemm.run(stream) != cutlass::Status::kSuccess) return "run failed";
  return nullptr;
}

}  // namespace

// a (M, K) row-major with leading dimension lda, b (K, N) column-major with ldb, d (M, N)
// row-major contiguous; bf16. stream_k: 0 = PersistentScheduler, 1 = StreamKScheduler forced to
// stream-K, 2 = StreamKScheduler with CUTLASS's own heuristic (data-parallel, split-K or
// stream-K). Returns a message on failure, nullptr on success.
char const* cutlass_peer_mm(void const* a, int64_t lda, void const* b, int64_t ldb, void* d, int m, int n, int k,
                            int swizzle, int stream_k, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            size_t* workspace_needed) {
  using Decomposition = cutlass::gemm::kernel::detail::DecompositionMode;
  if (stream_k == 0) {
    return run<GemmOn<cutlass::gemm::PersistentScheduler>>(a, lda, b, ldb, d, m, n, k, swizzle, workspace,
                                                           workspace_bytes, stream, workspace_needed, [](auto&) {});
  }
  return run<GemmOn<cutlass::gemm::StreamKScheduler>>(
      a, lda, b, ldb, d, m, n, k, swizzle, workspace, workspace_bytes, stream, workspace_needed, [&](auto& s) {
        s.decomposition_mode = stream_k == 1 ? Decomposition::StreamK : Decomposition::Heuristic;
      });
}
