// Type builder + host runner for the SM90 MX (block-scaled) GEMMs: mxfp8_mm and fp8_fp4_mm.
//
//   persistent_gemm::kernel::Sm90MxGemm<Spec>::run(GemmArgs const&, stream), Spec (builder_spec.hpp)
//   naming OperandX, ElementD, TileShape, ClusterShape, ScheduleTag, KernelStyle, kStages and kSwapAB.
//
// The kernel computes C(M', N') = X(M', K) . Y(N', K)^T with 1x32 e8m0 scales on both operands
// (collective/sm90_mx_block_scaled_mma.hpp), K contiguous in both; GemmArgs' a/b are X/Y and
// scale_a/scale_b their blocked-layout scales (scale_layout.py: 128x4 atoms).
//   SwapAB = false: X = the activations, Y = the weight, D = C (M x N, row-major).
//   SwapAB = true:  X = the weight (its rows fill the 64-row wgmma side: decode, and e2m1
//                   weights, which only the register-sourced A operand can convert), Y = the
//                   activations; D = C^T, written transposed by the predicated epilogue.
// The dispatcher (csrc/dispatch.cpp) does the swapping; the kernel only knows X and Y.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "persistent_gemm/collective/sm90_mx_block_scaled_mma.hpp"
#include "persistent_gemm/epilogue/sm90_predicated_epilogue.hpp"
#include "persistent_gemm/generated/arch_limits.hpp"
#include "persistent_gemm/kernel/builder_common.hpp"
#include "persistent_gemm/kernel/builder_spec.hpp"
#include "persistent_gemm/kernel/cluster_launch.hpp"
#include "persistent_gemm/kernel/sm90_gemm_persistent.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

namespace sm90_mx_detail {

// archs.py's limit (config_rules.py's budget rule reads the same).
constexpr int kAccumulatorRegisterBudget = arch_limits::sm90a::kAccumulatorRegisterBudget;

template <class OperandX, class TileShape>
constexpr int stage_bytes() {
  constexpr int tm = cute::size<0>(TileShape{}), tn = cute::size<1>(TileShape{});
  constexpr bool fold = std::is_same_v<OperandX, collective::MxOperandE2m1Fold>;
  constexpr int x_row = fold || std::is_same_v<OperandX, collective::MxOperandE2m1> ? 64 : 128;
  constexpr int atoms = (tm <= 128 ? 1 : tm / 128) + (tn <= 128 ? 1 : tn / 128);
  constexpr int floats = 4 * (tm + 4 * (tn / 4 + 4));
  constexpr int fold_bytes = fold ? 4 * tm * 8 + 4 * tm / 16 : 0;  // FoldStorage: LUTs and strip modes
  return tm * x_row + tn * 128 + atoms * 512 + floats * 4 + fold_bytes + 16 /* full/empty barriers */;
}

template <class OperandX, class TileShape>
constexpr int auto_stages() {
  // The fold's storage is padded to whole 1024 B (it precedes the swizzled tiles): up to 1 KB more.
  constexpr int fold_pad = std::is_same_v<OperandX, collective::MxOperandE2m1Fold> ? 1024 : 0;
  return sm90_mx_auto_stages(stage_bytes<OperandX, TileShape>(), fold_pad);
}

}  // namespace sm90_mx_detail

template <class Spec>
struct Sm90MxGemm {
  PGEMM_SPEC_SCHEDULE_MEMBERS(Spec);
  PGEMM_SPEC_OUTPUT_MEMBERS(Spec);
  PGEMM_SPEC_SM90_MX_MEMBERS(Spec, "the MMA's A side: MxOperandE4m3, MxOperandE2m1 or MxOperandE2m1Fold");
  PGEMM_SPEC_REQUIRE(Spec, kSwapAB, "bool: X is the weight, D written transposed");
  static constexpr bool SwapAB = Spec::kSwapAB;
  static constexpr bool kE2m1 = std::is_same_v<OperandX, collective::MxOperandE2m1> ||
                                std::is_same_v<OperandX, collective::MxOperandE2m1Fold>;
  static_assert(kE2m1 || std::is_same_v<OperandX, collective::MxOperandE4m3>,
                "OperandX: MxOperandE4m3, MxOperandE2m1 or MxOperandE2m1Fold");
  static_assert(!ScheduleTag::ReducesK, "the MX kernels reduce whole tiles: no split-K or stream-K "
                                        "(KernelConfig.kernel_rejection says the same)");
  static_assert(!kE2m1 || SwapAB, "e2m1 weights are converted in registers, which only the MMA's A side allows: "
                                  "FP8 x FP4 kernels must be swap-AB (the weight as X)");
  static_assert(cute::size<2>(TileShape{}) == arch_limits::sm90a::kMxTileK,
                "MX kernels need tile_k = 128 (four 1x32 scale blocks, one blocked-layout atom column)");
  static constexpr int kAccRegs = int(cute::size<0>(TileShape{}) * cute::size<1>(TileShape{})) / (kCooperative ? 256 : 128);
  static_assert(3 * kAccRegs <= sm90_mx_detail::kAccumulatorRegisterBudget,
                "MX promotion holds an fp32 accumulator and two in-flight temporaries: 3 x the tile's accumulator "
                "registers per consumer thread exceed the budget (use a smaller tile)");
  // Tiny (decode) tiles promote two K-tiles per wgmma wait: 1 + 2 x 8 accumulator sets.
  using Promotion = std::conditional_t<17 * kAccRegs <= sm90_mx_detail::kAccumulatorRegisterBudget,
                                       collective::PromotePerKTile, collective::PromotePerBlock>;
  static constexpr int kStages = Stages > 0 ? Stages : sm90_mx_detail::auto_stages<OperandX, TileShape>();

  using CollectiveMainloop =
      collective::Sm90MxBlockScaledMma<OperandX, TileShape, ClusterShape, kStages, kCooperative, Promotion>;
  using EpilogueOp = epilogue::Sm90PredicatedEpilogue<ElementD, ScaleMode::Block32, SwapAB>;
  using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp>;
  using Kernel = Sm90GemmPersistent<CollectiveMainloop, CollectiveEpilogue, ScheduleTag, Style>;
  using Arguments = typename Kernel::Arguments;
  using Params = typename Kernel::Params;

  static Arguments make_arguments(GemmArgs const& g) {
    Arguments args{};
    args.problem = cute::make_shape(int(g.m), int(g.n), int(g.k), 1);
    args.mainloop = {g.a, g.lda, g.b, g.ldb, static_cast<uint8_t const*>(g.scale_a),
                     static_cast<uint8_t const*>(g.scale_b)};
    args.epilogue = {static_cast<ElementD*>(g.d), int64_t(g.ldd), nullptr, nullptr,
                     static_cast<ElementD const*>(g.bias), g.alpha, g.beta};
    args.scheduler.max_workers = g.max_workers;
    args.sm_count = g.sm_count;
    return args;
  }

  // TMA's rules for X and Y (16 B aligned bases, 16 B multiple strides), 16 B aligned scale
  // atoms (bulk copies), K % 32 for packed e2m1 rows, D's extent.
  static bool can_implement(GemmArgs const& g) {
    if (g.m < 1 || g.n < 1 || g.k < 1 || g.scale_mode != ScaleMode::Block32) return false;
    if (!g.a || !g.b || !g.d || !g.scale_a || !g.scale_b) return false;
    if (!aligned16(g.a) || !aligned16(g.b) || !aligned16(g.scale_a) || !aligned16(g.scale_b)) return false;
    int64_t const x_bytes = kE2m1 ? g.k / 2 : g.k;
    if (kE2m1 && g.k % 32) return false;
    if (g.lda < x_bytes || g.ldb < g.k || g.lda % 16 || g.ldb % 16) return false;
    if (g.ldd < (SwapAB ? g.m : g.n)) return false;
    return Kernel::can_implement(make_arguments(g));
  }

  static size_t workspace_bytes(GemmArgs const&) { return 0; }  // no split-K here

  // Never throws; cudaErrorInvalidValue for a problem this instantiation cannot run.
  static cudaError_t run(GemmArgs const& g, cudaStream_t stream) noexcept {
    if (!can_implement(g)) return cudaErrorInvalidValue;
    return launch_sm90_persistent<Kernel>(make_arguments(g), stream);
  }
};

}  // namespace persistent_gemm::kernel
