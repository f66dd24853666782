// Sm100Gemm<Spec>: one SM100 `mm` or `scaled_mm` variant, D(M,N) = scale * A(M,K) @ B(K,N), D
// row-major, fp32 accumulate in TMEM. Composes the CUTLASS SM100 mainloop / epilogue collectives
// (via their builders) with our persistent kernel (sm100_gemm_persistent.hpp) and launches it.
//
// Spec (builder_spec.hpp) names:
//   ElementA/B     cutlass::bfloat16_t or cutlass::half_t (mm, Scale None), or
//                  cutlass::float_e4m3_t (scaled_mm, Scale Tensorwise / Rowwise; tcgen05
//                  kind::f8f6f4). A and B the same.
//   ElementD       bf16 / fp16 / fp32
//   kAKMajor       A (M,K) row-major (K contiguous); else column-major (M contiguous)
//   kBKMajor       B (K,N) column-major (K contiguous); else row-major (N contiguous)
//   TileShape      the MMA tile (MmaM, N, K): Umma1Sm MmaM in {64, 128}, Umma2Sm MmaM in {128, 256};
//                  the per-CTA tile (what the scheduler counts in) is MmaM / CTAs-per-MMA.
//   ClusterShape   cute::Shape<_cm, _cn, _1>, equal to the schedule tag's cluster
//   ScheduleTag    persistent_gemm::scheduler::PersistentSchedule<...>
//   KernelStyle    Umma1Sm or Umma2Sm
//   kStages        smem pipeline depth; 0 = as many as fit after the epilogue's smem
//   kScale         ScaleMode::None, or for e4m3 Tensorwise (scale_a[0] * scale_b[0]) / Rowwise
//                  (scale_a[m] * scale_b[n]): fp32 scales applied to the fp32 accumulator in the
//                  epilogue (epilogue/sm100_scale_fusion.hpp), rounded once to ElementD.
//
// FP8 accumulation: tcgen05 accumulates e4m3 products in fp32 in TMEM over the whole K; there is
// no reduced-precision ("fast") accumulator to promote out of, unlike SM90's wgmma. So one
// kernel serves use_fast_accum=False and True (its entry says fast_accum = false).
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

#include "persistent_gemm/epilogue/sm100_scale_fusion.hpp"
#include "persistent_gemm/kernel/builder_common.hpp"
#include "persistent_gemm/kernel/builder_spec.hpp"
#include "persistent_gemm/kernel/sm100_builder_common.hpp"
#include "persistent_gemm/kernel/sm100_gemm_persistent.hpp"
#include "persistent_gemm/kernel/sm100_launch.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

template <class Spec>
struct Sm100Gemm : Sm100Host<Sm100Gemm<Spec>> {
  PGEMM_SPEC_SCHEDULE_MEMBERS(Spec);
  PGEMM_SPEC_OPERAND_MEMBERS(Spec);
  PGEMM_SPEC_OUTPUT_MEMBERS(Spec);
  PGEMM_SPEC_REQUIRE(Spec, kScale, "the epilogue's ScaleMode (None for mm)");
  using MmaTileShape = TileShape;
  static constexpr ScaleMode Scale = Spec::kScale;
  static_assert(std::is_same_v<ElementA, ElementB>, "A and B share a dtype");
  static constexpr bool kFp8 = std::is_same_v<ElementA, cutlass::float_e4m3_t>;
  static_assert(kFp8 || std::is_same_v<ElementA, cutlass::bfloat16_t> || std::is_same_v<ElementA, cutlass::half_t>,
                "bf16 / fp16 inputs (mm) or e4m3 (scaled_mm)");
  // Mirrored by catalogue.py (the variants) and library.py (the sm100a e4m3 lowering).
  static_assert(Scale != ScaleMode::Block32, "MX block scales are applied in the mainloop: Sm100MxGemm");
  static_assert(kFp8 == (Scale != ScaleMode::None),
                "e4m3 operands come with tensorwise or rowwise scales (scaled_mm); 16-bit ones without (mm)");
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

  // The per-CTA tile (2-SM: a CTA owns half the MMA tile's rows), as the epilogue builder sees it.
  static constexpr int kCtaM = int(cute::size<0>(MmaTileShape{})) / (k2Sm ? 2 : 1);
  using CtaTile = cute::Shape<cute::Int<kCtaM>, cute::Int<int(cute::size<1>(MmaTileShape{}))>,
                              cute::Int<int(cute::size<2>(MmaTileShape{}))>>;
  using Fusion = epilogue::sm100::ScaleFusion<ElementD, Scale, CtaTile>;

  // No source C (void): D = scale * acc. Every fusion node reads no tensor by TMA (no producer
  // load), so the kernel needs no epilogue-load warp.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD, EpilogueSchedule, typename Fusion::type>::CollectiveOp;

  // Auto stages: fill what the epilogue leaves; the builder also reserves room for CUTLASS's
  // CLC scheduler, which our kernel does not use, so the estimate is conservative.
  using StageCountType = StageCountFor<Stages, static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignA, ElementB, LayoutB, kAlignB,
      ElementAccumulator, MmaTileShape, ClusterShape, StageCountType, MainloopSchedule>::CollectiveOp;

  using Kernel = Sm100GemmPersistent<CollectiveMainloop, CollectiveEpilogue, ScheduleTag, Style>;
  static_assert(std::is_same_v<CtaTile, typename Kernel::CtaShape_MNK>, "the fusion's CTA tile is the mainloop's");
  using TileScheduler = typename Kernel::TileScheduler;  // per-CTA tile: what a schedule model must use

  using Strides = Sm100Strides<CollectiveMainloop, CollectiveEpilogue>;

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
    args.mainloop.dA = make_stride_2d<typename Strides::A>(a.lda, AKMajor ? a.m : a.k);
    args.mainloop.ptr_B = static_cast<ElementB const*>(a.b);
    // B as CUTLASS (N, K): K-major (column-major K x N) -> (ldb, 1); N-major -> (1, ldb).
    args.mainloop.dB = make_stride_2d<typename Strides::B>(a.ldb, BKMajor ? a.n : a.k);
    Fusion::set(args.epilogue.thread, a);
    Sm100Host<Sm100Gemm>::set_output(args, a);
    return args;
  }

  // What TMA needs: 16 B aligned bases, 16 B multiple leading dimensions no smaller than the
  // contiguous extent, scale pointers when scaled; then the kernel's structural checks.
  static bool can_implement(GemmArgs const& a) {
    if (a.scale_mode != Scale || a.a_k_major != AKMajor || a.b_k_major != BKMajor) return false;
    if (Scale != ScaleMode::None && (!a.scale_a || !a.scale_b)) return false;
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

  // entry(), workspace_bytes() and run(): Sm100Host.
};

}  // namespace persistent_gemm::kernel
