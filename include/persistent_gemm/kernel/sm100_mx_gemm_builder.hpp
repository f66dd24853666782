// Sm100MxGemm: the SM100 MX (block-scaled) GEMMs, mxfp8_mm and fp8_fp4_mm on tcgen05.
//
//   D(M,N) = (A . 2^SFA)(M,K) @ (B . 2^SFB)(K,N), fp32 accumulate in TMEM, D row-major.
//
// Sm100MxGemm<Spec>, Spec (builder_spec.hpp) naming:
//   ElementB       cutlass::float_e4m3_t (mxfp8) or cutlass::float_e2m1_t (FP8 x FP4); A is e4m3
//   ElementD       D's element
//   TileShape      the MMA tile (MmaM, N, 128): Umma1Sm MmaM = 128, Umma2Sm MmaM = 256
//   ClusterShape   cute::Shape<_cm, _cn, _1>, equal to the schedule tag's cluster
//   ScheduleTag    persistent_gemm::scheduler::PersistentSchedule<...>
//   KernelStyle    Umma1Sm or Umma2Sm
//   kStages        smem pipeline depth; 0 = as many as fit after the epilogue's smem
//
// The instruction is tcgen05.mma.kind::mxf8f6f4.block_scale (e4m3 x e4m3 or e4m3 x e2m1, one
// ue8m0 per 32 K-elements on each side; UTCQMMA in SASS). Composition, as Sm100Gemm does:
// CUTLASS's block-scaled mainloop collective (MainloopSm100TmaUmmaWarpSpecializedBlockScaled:
// TMA of A, B, SFA, SFB into one smem stage; UTCCP copies SFA/SFB smem -> TMEM before each
// MMA) inside our Sm100GemmPersistent (persistent loop, role split, our scheduler).
//
// Both operands are K-major (GemmArgs' a = the activations (M, K) row-major, b = the weight as
// (K, N) column-major, i.e. the (N, K) row-major weight). scale_a / scale_b are the blocked
// layout (scale_layout.py, 128 x 4 e8m0 atoms of 512 B, padded rows and blocks): the layout
// CUTLASS's Sm1xxBlockScaledConfig describes, which the dispatcher produces with the same
// arch-neutral relayout kernel as on SM90 (host/scale_to_blocked.cuh).
//
// Rules (mirrored in config_rules.py's _sm100_mx, and in can_implement below):
//   - tile_k = 128: the FP4 operand is loaded by TMA into 8-bit smem containers
//     (16U4_ALIGN16B), whose K extent must be 128 elements; one SF atom column per K tile.
//   - tile_n = 128 per CTA: N = 256 makes CUTLASS's builder give one accumulator stage (2 x 256
//     fp32 columns would leave no TMEM for the scale factors), i.e. overlapping accumulators,
//     which our kernel does not implement; 64 and 192 need SFB column shifts per tile parity.
//   - e2m1 weights: K % 128 == 0 (a TMA 16U4_ALIGN16B row is 64 B); e4m3: K % 16 == 0.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/layout/matrix.h"
#include "cutlass/numeric_types.h"

#include "persistent_gemm/generated/arch_limits.hpp"
#include "persistent_gemm/kernel/builder_common.hpp"
#include "persistent_gemm/kernel/builder_spec.hpp"
#include "persistent_gemm/kernel/sm100_builder_common.hpp"
#include "persistent_gemm/kernel/sm100_gemm_persistent.hpp"
#include "persistent_gemm/kernel/sm100_launch.hpp"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

template <class Spec>
struct Sm100MxGemm : Sm100Host<Sm100MxGemm<Spec>> {
  PGEMM_SPEC_SCHEDULE_MEMBERS(Spec);
  PGEMM_SPEC_OUTPUT_MEMBERS(Spec);
  PGEMM_SPEC_REQUIRE(Spec, ElementB, "the weight's element: float_e4m3_t or float_e2m1_t");
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = typename Spec::ElementB;
  using MmaTileShape = TileShape;
  static constexpr bool kE2m1 = std::is_same_v<ElementB, cutlass::float_e2m1_t>;
  static_assert(kE2m1 || std::is_same_v<ElementB, cutlass::float_e4m3_t>, "ElementB: float_e4m3_t or float_e2m1_t");
  static_assert(Stages == 0 || Stages >= 2, "Stages: 0 (auto) or >= 2");

  static constexpr bool k2Sm = std::is_same_v<Style, Umma2Sm>;
  static_assert(k2Sm || std::is_same_v<Style, Umma1Sm>, "Style must be Umma1Sm or Umma2Sm");
  static constexpr int kMmaM = cute::size<0>(MmaTileShape{});
  static constexpr int kMmaN = cute::size<1>(MmaTileShape{});
  using Limits = arch_limits::sm100a;
  static_assert(sm100_mx::kTileK == Limits::kMxTileK && sm100_mx::kTileN == Limits::kMxTileN,
                "sm100_tile_mapping.hpp's host rules use archs.py's MX tile");
  static_assert(cute::size<2>(MmaTileShape{}) == Limits::kMxTileK,
                "SM100 MX kernels need tile_k = 128 (FP4 smem containers, one scale-atom column per K tile)");
  static_assert(kMmaM == (k2Sm ? 256 : 128), "SM100 MX: MMA tile_m is 128 (1sm) or 256 (2sm)");
  static_assert(kMmaN == Limits::kMxTileN,
                "SM100 MX: tile_n must be 128 (256 forces overlapping TMEM accumulators, 64/192 per-tile SFB shifts)");

  // The element pairs CUTLASS's block-scaled builder keys on: data type + ue8m0 per 32 K.
  using ElementPairA = cutlass::mx_float8_t<ElementA>;
  using ElementPairB = std::conditional_t<kE2m1, cutlass::mx_float4_t<ElementB>, cutlass::mx_float8_t<ElementB>>;
  using ElementSF = cutlass::float_ue8m0_t;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N), K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 16;                    // e4m3 elements: 16 B TMA rows
  static constexpr int kAlignB = kE2m1 ? sm100_mx::kFp4KAlign : 16;  // e2m1: 16U4_ALIGN16B rows
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using MainloopSchedule = std::conditional_t<k2Sm, cutlass::gemm::KernelTmaWarpSpecialized2SmMxf8f6f4Sm100,
                                              cutlass::gemm::KernelTmaWarpSpecialized1SmMxf8f6f4Sm100>;
  using EpilogueSchedule = std::conditional_t<k2Sm, cutlass::epilogue::TmaWarpSpecialized2Sm,
                                              cutlass::epilogue::TmaWarpSpecialized1Sm>;

  // No source C: D = 1 * acc (the scales are already applied by the MMA).
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD, EpilogueSchedule>::CollectiveOp;

  using StageCountType = StageCountFor<Stages, static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementPairA, LayoutA, kAlignA,
      ElementPairB, LayoutB, kAlignB, ElementAccumulator, MmaTileShape, ClusterShape, StageCountType,
      MainloopSchedule>::CollectiveOp;
  static_assert(!CollectiveMainloop::DispatchPolicy::IsOverlappingAccum,
                "SM100 MX: this tile leaves TMEM for one accumulator stage only (overlapping accumulators)");

  using Kernel = Sm100GemmPersistent<CollectiveMainloop, CollectiveEpilogue, ScheduleTag, Style>;
  using TileScheduler = typename Kernel::TileScheduler;

  using Strides = Sm100Strides<CollectiveMainloop, CollectiveEpilogue>;
  using BlkScaledConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;

  static typename Kernel::Arguments make_arguments(GemmArgs const& g) {
    typename Kernel::Arguments args;
    auto const problem = cute::make_shape(int(g.m), int(g.n), int(g.k), 1);
    args.problem_shape = problem;
    // Every operand has K (D: N) contiguous: the strides are (row stride, 1, batch stride).
    args.mainloop.ptr_A = static_cast<ElementA const*>(g.a);
    args.mainloop.dA = sm100_row_stride<typename Strides::A>(g.lda, g.m);
    args.mainloop.ptr_B = static_cast<ElementB const*>(g.b);
    // GemmArgs' ldb counts bytes of the packed storage; CUTLASS counts elements.
    args.mainloop.dB = sm100_row_stride<typename Strides::B>(kE2m1 ? 2 * g.ldb : g.ldb, g.n);
    args.mainloop.ptr_SFA = static_cast<ElementSF const*>(g.scale_a);
    args.mainloop.layout_SFA = BlkScaledConfig::tile_atom_to_shape_SFA(problem);
    args.mainloop.ptr_SFB = static_cast<ElementSF const*>(g.scale_b);
    args.mainloop.layout_SFB = BlkScaledConfig::tile_atom_to_shape_SFB(problem);
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    Sm100Host<Sm100MxGemm>::set_output(args, g);
    return args;
  }

  // The same rule set as sm100_mx::implementable (host-testable, sm100_tile_mapping.hpp), then
  // CUTLASS's own checks.
  static bool can_implement(GemmArgs const& g) {
    if (g.scale_mode != ScaleMode::Block32 || !g.a_k_major || !g.b_k_major) return false;
    // No fused bias here (archs.py: fused_bias=False): the dispatcher applies bias and alpha after us.
    if (g.bias != nullptr || g.alpha != 1.0f) return false;
    if (!g.a || !g.b || !g.d || !g.scale_a || !g.scale_b) return false;
    if (!aligned16(g.a) || !aligned16(g.b) || !aligned16(g.d) || !aligned16(g.scale_a) || !aligned16(g.scale_b))
      return false;
    if (kE2m1 && reinterpret_cast<uintptr_t>(g.b) % sm100_mx::kFp4TmaAlign) return false;
    if (sm100_mx::rejection(g.m, g.n, g.k, g.lda, g.ldb, g.ldd, kE2m1, int(sizeof(ElementD)), g.d_pad_writable) !=
        sm100_mx::Reject::None)
      return false;
    return Kernel::can_implement(make_arguments(g));
  }

  // entry(), workspace_bytes() and run(): Sm100Host.
};

}  // namespace persistent_gemm::kernel
