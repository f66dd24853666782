// Type builder + host runner for the persistent SM90 GEMM.
//
//   persistent_gemm::kernel::Sm90Gemm<Spec>::run(GemmArgs const&, stream), Spec (builder_spec.hpp)
//   naming ElementA, kAKMajor, ElementB, kBKMajor, ElementD, TileShape, ClusterShape, ScheduleTag,
//   KernelStyle, kStages, kScale, kTmaStore, Accumulation and kSwapAB.
//
// D(M,N) = scale * A(M,K) @ B(K,N), fp32 accumulation, D row-major with leading dimension ldd.
//   A: row-major (M,K) when AKMajor, else column-major.  B: column-major (K,N) when BKMajor,
//   else row-major. FP8 (e4m3) operands must both be K-major (the only GMMA fp8 smem layout).
// Mainloop: CUTLASS's TMA + GMMA warp-specialized collective, chosen by MainloopSelector from
//           the style and the accumulation tag. FP8 has two: AccumPromoted adds each K-tile's
//           partial sums into an fp32 accumulator (torch._scaled_mm's default accuracy) without
//           draining the wgmma queue (collective/sm90_fp8_promoted_mma.hpp, over CUTLASS's FP8
//           collective; tiles too wide for its registers promote N-slices in turn,
//           sm90_fp8_sliced_promotion_mma.hpp); AccumFast keeps them in the tensor core's
//           reduced-precision accumulator for the whole K loop (use_fast_accum=True), whose
//           error grows with K.
// Epilogue: TmaStore  -> CUTLASS TMA warp-specialized epilogue with an EVT for the scale;
//                        needs a 16 B aligned D pointer, ldd AND N (a TMA store writes whole
//                        16 B chunks at the N edge); otherwise use the !TmaStore variant.
//           !TmaStore -> Sm90PredicatedEpilogue: per-thread predicated stores, any ldd.
// SwapAB:   the caller passes the weight as A and the activations as B (decode: the weight fills
//           the wgmma's 64-row side, the tokens a narrow N); D is written transposed, so the
//           kernel's column-major (M', N') output is the op's row-major (M, N). Predicated stores.
// Split-K:  a ScheduleTag with SplitK > 1 or StreamK reduces K ranges through GemmArgs::workspace
//           (Sm90GemmPersistent::split_fixup); predicated stores; one nonce per launch.
// Stages == 0 sizes the smem ring from what the epilogue leaves free.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

#include "persistent_gemm/collective/sm90_fp8_promoted_mma.hpp"
#include "persistent_gemm/collective/sm90_fp8_sliced_promotion_mma.hpp"
#include "persistent_gemm/epilogue/sm90_tma_fusion.hpp"
#include "persistent_gemm/generated/arch_limits.hpp"
#include "persistent_gemm/kernel/builder_common.hpp"
#include "persistent_gemm/kernel/builder_spec.hpp"
#include "persistent_gemm/kernel/cluster_launch.hpp"
#include "persistent_gemm/kernel/promotion_rule.hpp"
#include "persistent_gemm/kernel/sm90_gemm_persistent.hpp"
#include "persistent_gemm/kernel/split_nonce.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

// Accumulation tags (kernel_config.py's KernelConfig.accum).
struct AccumPromoted {};
struct AccumFast {};

namespace sm90_detail {

using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;

// Registers a consumer may spend on accumulators: archs.py's limit, which config_rules.py's
// rejection reads too, so Python refuses such a tile first.
constexpr int kAccumulatorRegisterBudget = arch_limits::sm90a::kAccumulatorRegisterBudget;

// Promoted FP8: the whole-tile mainloop (0), the N-sliced one (slice width x 2 + two A fragments)
// or neither (-1), by kernel/promotion_rule.hpp's rule over archs.py's two register budgets.
template <class TileShape, bool Coop>
constexpr int promoted_choice() {
  return promotion::choice(cute::size<0>(TileShape{}), cute::size<1>(TileShape{}), cute::size<2>(TileShape{}), Coop,
                           kAccumulatorRegisterBudget, arch_limits::sm90a::kSlicedPromotionRegisterBudget);
}

// tag -> selector -> CUTLASS kernel schedule of the mainloop collective, one per (style,
// accumulation). The plain schedules serve 16-bit operands and, with FP8 operands, select
// CUTLASS's promoting FP8 collective (which Sm90Gemm then wraps); the FastAccum ones exist for
// FP8 only (asserted in Sm90Gemm).
template <class Style, class Accum>
struct MainloopSelector {
  template <class Coop, class PingPong_>
  using ByStyle = std::conditional_t<std::is_same_v<Style, Cooperative>, Coop, PingPong_>;
  using type = std::conditional_t<
      std::is_same_v<Accum, AccumFast>,
      ByStyle<cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
              cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum>,
      ByStyle<cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::gemm::KernelTmaWarpSpecializedPingpong>>;
};

// Shared memory the kernel needs besides the mainloop ring: the epilogue's buffers and
// barriers plus our ordering barriers and section padding.
template <class Epilogue>
constexpr int kernel_carveout_bytes() {
  return int(sizeof(typename Epilogue::TensorStorage)) + int(sizeof(typename Epilogue::PipelineStorage)) + 256;
}

}  // namespace sm90_detail

template <class Spec>
struct Sm90Gemm {
  PGEMM_SPEC_SCHEDULE_MEMBERS(Spec);
  PGEMM_SPEC_OPERAND_MEMBERS(Spec);
  PGEMM_SPEC_OUTPUT_MEMBERS(Spec);
  PGEMM_SPEC_REQUIRE(Spec, kScale, "the epilogue's ScaleMode");
  PGEMM_SPEC_REQUIRE(Spec, kTmaStore, "bool: TMA-store epilogue, else predicated stores");
  PGEMM_SPEC_REQUIRE(Spec, Accumulation, "AccumPromoted or AccumFast");
  PGEMM_SPEC_REQUIRE(Spec, kSwapAB, "bool: the weight as A, D written transposed");
  using Accum = typename Spec::Accumulation;
  static constexpr bool TmaStore = Spec::kTmaStore, SwapAB = Spec::kSwapAB;
  static constexpr persistent_gemm::ScaleMode Scale = Spec::kScale;
  static constexpr bool kCooperative = std::is_same_v<Style, Cooperative>;
  static constexpr bool kFp8 = cutlass::sizeof_bits<ElementA>::value == 8;
  static_assert(cutlass::sizeof_bits<ElementA>::value == cutlass::sizeof_bits<ElementB>::value,
                "mixed-width operands are not supported by this builder");
  static_assert(!kFp8 || (AKMajor && BKMajor), "FP8 GMMA reads both operands K-major only: pass K-major A and B");
  static_assert(Scale != ScaleMode::Block32, "Block32 (MX) scaling is an SM100 mainloop feature");
  static_assert(std::is_same_v<Accum, AccumPromoted> || std::is_same_v<Accum, AccumFast>,
                "Accum must be AccumPromoted or AccumFast");
  static_assert(kFp8 || std::is_same_v<Accum, AccumPromoted>,
                "fast accumulation is an FP8 mainloop option; 16-bit operands always accumulate in fp32");
  static_assert(!SwapAB || !TmaStore, "swap-AB writes D transposed: use the predicated epilogue (TmaStore = false)");
  static_assert(!SwapAB || (AKMajor && BKMajor), "swap-AB takes the weight and the activations K-major");
  static_assert(ScheduleTag::SplitK == 1 || !TmaStore,
                "split-K: the decode kernels' partial units skip a predicated epilogue (TmaStore = false); "
                "stream-K keeps the TMA store (its roles step the epilogue states past a partial piece)");
  static constexpr bool kPromotedFp8 = kFp8 && std::is_same_v<Accum, AccumPromoted>;
  static constexpr int kPromotedChoice = sm90_detail::promoted_choice<TileShape, kCooperative>();
  static_assert(!kPromotedFp8 || kPromotedChoice >= 0,
                "promoted FP8 accumulation holds an fp32 accumulator and two in-flight temporaries: 3 x the tile's "
                "accumulator registers per consumer thread exceed the budget, and the tile is not a 128-row "
                "cooperative one whose N-sliced temporaries fit (use a smaller tile, or AccumFast)");

  using LayoutA = std::conditional_t<AKMajor, sm90_detail::RowMajor, sm90_detail::ColumnMajor>;
  using LayoutB = std::conditional_t<BKMajor, sm90_detail::ColumnMajor, sm90_detail::RowMajor>;
  static constexpr int kAlignA = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16 B: the TMA minimum
  static constexpr int kAlignB = 128 / cutlass::sizeof_bits<ElementB>::value;

  using EpilogueSel =
      epilogue::Sm90EpilogueSelector<TmaStore, ElementD, TileShape, ClusterShape, kCooperative, Scale, SwapAB>;
  using CollectiveEpilogue = typename EpilogueSel::Collective;

  using MainloopSchedule = typename sm90_detail::MainloopSelector<Style, Accum>::type;
  using StageCount = StageCountFor<Stages, sm90_detail::kernel_carveout_bytes<CollectiveEpilogue>()>;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignA, ElementB, LayoutB, kAlignB,
      float, TileShape, ClusterShape, StageCount, MainloopSchedule>::CollectiveOp;
  // By kPromotedChoice, or -1 where nothing is promoted (16-bit operands, fast accumulation).
  template <int Choice, class = void>
  struct MainloopFor {
    using type = persistent_gemm::collective::Sm90Fp8SlicedPromotionMma<BuiltMainloop, Choice / 2, Choice % 2 == 1>;
  };
  template <class Unused>
  struct MainloopFor<0, Unused> {
    using type = persistent_gemm::collective::Sm90Fp8OverlappedPromotionMma<BuiltMainloop>;
  };
  template <class Unused>
  struct MainloopFor<-1, Unused> {
    using type = BuiltMainloop;
  };
  using CollectiveMainloop = typename MainloopFor<kPromotedFp8 ? kPromotedChoice : -1>::type;

  using Kernel = Sm90GemmPersistent<CollectiveMainloop, CollectiveEpilogue, ScheduleTag, Style>;
  using Arguments = typename Kernel::Arguments;
  using Params = typename Kernel::Params;

  // GemmArgs -> kernel Arguments. Strides are (M,K,L) for A and (N,K,L) for B in CUTLASS's
  // convention; the unit-stride mode is static in each StrideA/StrideB type.
  static Arguments make_arguments(GemmArgs const& g) {
    using StrideA = typename CollectiveMainloop::StrideA;
    using StrideB = typename CollectiveMainloop::StrideB;
    StrideA dA{};
    StrideB dB{};
    if constexpr (AKMajor) cute::get<0>(dA) = g.lda; else cute::get<1>(dA) = g.lda;
    if constexpr (BKMajor) cute::get<0>(dB) = g.ldb; else cute::get<1>(dB) = g.ldb;
    Arguments args{};
    args.problem = cute::make_shape(int(g.m), int(g.n), int(g.k), 1);
    args.mainloop = {static_cast<ElementA const*>(g.a), dA, static_cast<ElementB const*>(g.b), dB};
    args.epilogue = EpilogueSel::make(g);
    args.scheduler.max_workers = g.max_workers;
    args.sm_count = g.sm_count;
    args.workspace = g.workspace;
    return args;
  }

  // Split-K's workspace for this problem (0 when unsplit or K has a single K-tile).
  static size_t workspace_bytes(GemmArgs const& g) { return Kernel::workspace_bytes(make_arguments(g)); }

  // What TMA itself requires (not CUTLASS's stricter extent-divisibility checks): 16 B aligned
  // bases, 16 B multiple non-unit strides no smaller than the contiguous extent, and scale
  // pointers when a scale mode is compiled in.
  static bool can_implement(GemmArgs const& g) {
    if (g.m < 1 || g.n < 1 || g.k < 1 || g.scale_mode != Scale) return false;
    if (!g.a || !g.b || !g.d) return false;
    int64_t const a_contig = AKMajor ? g.k : g.m, b_contig = BKMajor ? g.k : g.n;
    // D's contiguous extent: N, or the kernel's M when it writes D transposed (swap-AB).
    if (g.lda < a_contig || g.ldb < b_contig || g.ldd < (SwapAB ? g.m : g.n)) return false;
    if (!aligned16(g.a) || !aligned16(g.b)) return false;
    if ((g.lda * int64_t(sizeof(ElementA))) % 16 != 0 || (g.ldb * int64_t(sizeof(ElementB))) % 16 != 0) return false;
    if constexpr (TmaStore) {
      // N too: measured on H200, a TMA store clips its innermost dimension at 16 B granularity,
      // zero-filling D's columns [N, roundup(N, 16 B)) (loads do clip per element).
      int64_t const bytes = int64_t(sizeof(ElementD));
      if (!aligned16(g.d) || (g.ldd * bytes) % 16 != 0) return false;
      if ((g.n * bytes) % 16 != 0 && !(g.d_pad_writable && g.ldd * bytes >= (g.n * bytes + 15) / 16 * 16))
        return false;
    }
    if constexpr (Scale != ScaleMode::None) {
      if (!g.scale_a || !g.scale_b) return false;
    }
    auto const args = make_arguments(g);
    if (g.workspace_bytes < Kernel::workspace_bytes(args)) return false;
    return Kernel::can_implement(args);
  }

  // Never throws; cudaErrorInvalidValue for a problem this instantiation cannot run.
  static cudaError_t run(GemmArgs const& g, cudaStream_t stream) noexcept {
    if (!can_implement(g)) return cudaErrorInvalidValue;
    auto args = make_arguments(g);
    if (Kernel::flag_bytes(args)) args.split_nonce = next_split_nonce();
    return launch_sm90_persistent<Kernel>(args, stream);
  }
};

}  // namespace persistent_gemm::kernel
