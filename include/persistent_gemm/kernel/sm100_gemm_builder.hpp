// Sm100Gemm: one SM100 `mm` variant, D(M,N) = A(M,K) @ B(K,N), D row-major, fp32 accumulate,
// ScaleMode::None. Composes the CUTLASS SM100 mainloop / epilogue collectives (via their
// builders) with our persistent kernel (sm100_gemm_persistent.hpp) and launches it.
//
//   ElementA/B/D   cutlass::bfloat16_t or cutlass::half_t (A and B the same)
//   AKMajor        A (M,K) row-major (K contiguous); else column-major (M contiguous)
//   BKMajor        B (K,N) column-major (K contiguous); else row-major (N contiguous)
//   MmaTileShape   the MMA tile (MmaM, N, K): Umma1Sm MmaM in {64, 128}, Umma2Sm MmaM in {128, 256};
//                  the per-CTA tile (what the scheduler counts in) is MmaM / CTAs-per-MMA.
//   ClusterShape   cute::Shape<_cm, _cn, _1>, equal to the schedule tag's cluster
//   ScheduleTag    persistent_gemm::scheduler::PersistentSchedule<...>
//   Style          Umma1Sm or Umma2Sm
//   Stages         smem pipeline depth; 0 = as many as fit after the epilogue's smem
//
// Host contract mirrors Sm90Gemm: can_implement(GemmArgs), run() noexcept returning
// cudaErrorInvalidValue for arguments this variant cannot run (majorness mismatch, scales, TMA
// alignment, CUTLASS divisibility), else the launch's error.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/layout/matrix.h"

#include "persistent_gemm/kernel/sm100_gemm_persistent.hpp"
#include "persistent_gemm/kernel/sm100_launch.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

template <class ElementA, bool AKMajor, class ElementB, bool BKMajor, class ElementD, class MmaTileShape,
          class ClusterShape, class ScheduleTag, class Style, int Stages>
struct Sm100Gemm {
  static_assert(std::is_same_v<ElementA, ElementB>, "A and B share a dtype");
  static_assert(std::is_same_v<ElementA, cutlass::bfloat16_t> || std::is_same_v<ElementA, cutlass::half_t>,
                "bf16 / fp16 inputs");
  static_assert(Stages == 0 || Stages >= 2, "Stages: 0 (auto) or >= 2");

  static constexpr bool k2Sm = std::is_same_v<Style, Umma2Sm>;
  static_assert(k2Sm || std::is_same_v<Style, Umma1Sm>, "Style must be Umma1Sm or Umma2Sm");

  using LayoutA = std::conditional_t<AKMajor, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutB = std::conditional_t<BKMajor, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  using ElementAccumulator = float;
  // TMA wants 16-byte aligned rows.
  static constexpr int kAlignA = 16 / sizeof(ElementA);
  static constexpr int kAlignB = 16 / sizeof(ElementB);
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using MainloopSchedule = std::conditional_t<k2Sm, cutlass::gemm::KernelTmaWarpSpecialized2SmSm100,
                                              cutlass::gemm::KernelTmaWarpSpecialized1SmSm100>;
  using EpilogueSchedule = std::conditional_t<k2Sm, cutlass::epilogue::TmaWarpSpecialized2Sm,
                                              cutlass::epilogue::TmaWarpSpecialized1Sm>;

  // No source C (void): D = 1 * acc; the kernel therefore has no epilogue-load warp.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD, EpilogueSchedule>::CollectiveOp;

  // Auto stages: fill what the epilogue leaves; the builder also reserves room for CUTLASS's
  // CLC scheduler, which our kernel does not use, so the estimate is conservative.
  using StageCountType = std::conditional_t<
      Stages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<(Stages > 0 ? Stages : 2)>>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignA, ElementB, LayoutB, kAlignB,
      ElementAccumulator, MmaTileShape, ClusterShape, StageCountType, MainloopSchedule>::CollectiveOp;

  using Kernel = Sm100GemmPersistent<CollectiveMainloop, CollectiveEpilogue, ScheduleTag, Style>;
  using TileScheduler = typename Kernel::TileScheduler;  // per-CTA tile: what a schedule model must use

  using StrideA = typename CollectiveMainloop::StrideA;
  using StrideB = typename CollectiveMainloop::StrideB;
  using StrideD = typename CollectiveEpilogue::StrideD;
  using StrideC = typename CollectiveEpilogue::StrideC;

  // (rows, cols) of a 2-D operand -> CUTLASS (outer, inner, batch) stride with one dynamic
  // leading dimension; the batch stride is only nominal (L == 1).
  template <class Stride>
  static Stride make_stride_2d(int64_t ld, int64_t extent_of_ld_dim) {
    Stride s{};
    if constexpr (cute::is_static_v<std::remove_cv_t<std::remove_reference_t<decltype(cute::get<0>(s))>>>) {
      cute::get<1>(s) = ld;  // first mode contiguous (column-major in CUTLASS terms)
    } else {
      cute::get<0>(s) = ld;  // second mode contiguous
    }
    cute::get<2>(s) = ld * extent_of_ld_dim;
    return s;
  }

  static typename Kernel::Arguments make_arguments(GemmArgs const& a) {
    typename Kernel::Arguments args;
    args.problem_shape = {a.m, a.n, a.k, 1};
    args.mainloop.ptr_A = static_cast<ElementA const*>(a.a);
    // A as (M, K): row-major -> stride (lda, 1); column-major -> stride (1, lda).
    args.mainloop.dA = make_stride_2d<StrideA>(a.lda, AKMajor ? a.m : a.k);
    args.mainloop.ptr_B = static_cast<ElementB const*>(a.b);
    // B as CUTLASS (N, K): K-major (column-major K x N) -> (ldb, 1); N-major -> (1, ldb).
    args.mainloop.dB = make_stride_2d<StrideB>(a.ldb, BKMajor ? a.n : a.k);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = make_stride_2d<StrideC>(a.ldd, a.m);
    args.epilogue.ptr_D = static_cast<ElementD*>(a.d);
    args.epilogue.dD = make_stride_2d<StrideD>(a.ldd, a.m);
    args.sm_count = a.sm_count;
    args.max_workers = a.max_workers;
    return args;
  }

  // What TMA needs: 16 B aligned bases, 16 B multiple leading dimensions no smaller than the
  // contiguous extent; then CUTLASS's own checks (K-major operands: K % 8 == 0, etc.).
  static bool can_implement(GemmArgs const& a) {
    if (a.scale_mode != ScaleMode::None || a.a_k_major != AKMajor || a.b_k_major != BKMajor) return false;
    // No fused bias here (archs.py: fused_bias=False): the dispatcher applies bias and alpha after us.
    if (a.bias != nullptr || a.alpha != 1.0f) return false;
    if (a.m < 1 || a.n < 1 || a.k < 1 || !a.a || !a.b || !a.d) return false;
    int64_t const a_contig = AKMajor ? a.k : a.m, b_contig = BKMajor ? a.k : a.n;
    if (a.lda < a_contig || a.ldb < b_contig || a.ldd < a.n) return false;
    if (!aligned16(a.a) || !aligned16(a.b) || !aligned16(a.d)) return false;
    if (a.lda % kAlignA || a.ldb % kAlignB || a.ldd % kAlignD) return false;
    // A TMA store writes whole 16-byte chunks at the N edge (seen on SM90; assumed here too).
    if (a.n % kAlignD && !(a.d_pad_writable && a.ldd >= (a.n + kAlignD - 1) / kAlignD * kAlignD)) return false;
    return Kernel::can_implement(make_arguments(a));
  }

  static void const* entry() { return reinterpret_cast<void const*>(&cutlass::device_kernel<Kernel>); }

  static size_t workspace_bytes(GemmArgs const&) { return 0; }  // no split-K here

  // Never throws; cudaErrorInvalidValue for a problem this instantiation cannot run.
  static cudaError_t run(GemmArgs const& a, cudaStream_t stream) noexcept {
    if (!can_implement(a)) return cudaErrorInvalidValue;
    return launch_sm100_persistent<Kernel>(entry(), make_arguments(a), stream);
  }
};

}  // namespace persistent_gemm::kernel
