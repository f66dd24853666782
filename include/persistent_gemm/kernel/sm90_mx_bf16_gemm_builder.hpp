// Type builder + host runner for the SM90 MX bf16 route (collective/sm90_mx_bf16_mma.hpp):
// mxfp8_mm and fp8_fp4_mm with both block scales folded into bf16 operands, no promotion; and
// weight_only_mm, whose bf16 activations need no folding.
//
//   persistent_gemm::kernel::Sm90MxBf16Gemm<Spec>::run(GemmArgs const&, stream), Spec (builder_spec.hpp)
//   naming OperandX, OperandA, ElementD, TileShape, ClusterShape, ScheduleTag, KernelStyle and kStages.
//
// Always swap-AB: GemmArgs' a/m are the weight (X, K-major MX bytes, blocked scales) and b/n
// the activations (OperandA: e4m3, K-major, scales blocked or plain rows when ld_scale_b > 0;
// or bf16, K-major, ldb in elements, no scales); D is written transposed. run() is two launches
// on `stream`: the pre-pass (host/mx_bf16_prepass.cuh: row references and the activations as
// bf16 in the mainloop's K order, into GemmArgs::workspace) and the GEMM.
//
// Grouped (ScheduleTag::Grouped, pg.grouped_mm's prefill): GemmArgs' weight is the experts'
// stack (group_stride_a bytes apart, their blocked scales contiguous: group_stride_scale_a is one
// expert's whole bands), the activations every expert's rows (offs or the masked form's counts
// in group_rows, read on the device), bias one row per expert. The pre-pass takes the stack's
// scales as one matrix of E x whole bands, and the activations as they are; the kernel walks
// (expert, tile) ids (scheduler/tile_scheduler.hpp), a tile's tokens counted from its expert's
// first row, so no expert is padded and none straddles another.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/collective/detail.hpp"

#include "persistent_gemm/collective/sm90_mx_bf16_mma.hpp"
#include "persistent_gemm/epilogue/sm90_predicated_epilogue.hpp"
#include "persistent_gemm/host/mx_bf16_prepass.cuh"
#include "persistent_gemm/kernel/activation_tags.hpp"
#include "persistent_gemm/kernel/builder_common.hpp"
#include "persistent_gemm/kernel/builder_spec.hpp"
#include "persistent_gemm/kernel/cluster_launch.hpp"
#include "persistent_gemm/kernel/sm90_gemm_persistent.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

namespace sm90_mx_bf16_detail {

template <class OperandX, class TileShape>
constexpr int stage_bytes() {
  constexpr int tm = cute::size<0>(TileShape{}), tn = cute::size<1>(TileShape{});
  constexpr int x_row = std::is_same_v<OperandX, collective::MxOperandE2m1> ? 32 : 64;
  return tm * x_row + tn * 128 + 512 + 16 /* full/empty barriers */;
}

// GemmArgs::workspace: [weight refs][token refs][bf16 activations], each 256 B aligned. Grouped:
// the weight refs of every expert's whole bands.
struct Workspace {
  float* w_ref;
  float* a_ref;
  __nv_bfloat16* y;
  int64_t ldy;
  size_t bytes;
};
inline int64_t band_rows(GemmArgs const& g) { return (int64_t(g.m) + 127) / 128 * 128; }
inline Workspace carve(GemmArgs const& g) {
  int64_t const w_rows = band_rows(g) * (g.groups > 0 ? g.groups : 1);
  int64_t const ldy = (int64_t(g.k) + 31) / 32 * 32;
  size_t const w_bytes = align256(size_t(w_rows) * 4), a_bytes = align256(size_t(g.n) * 4);
  auto* base = static_cast<char*>(g.workspace);
  return {reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + w_bytes),
          reinterpret_cast<__nv_bfloat16*>(base + w_bytes + a_bytes), ldy,
          w_bytes + a_bytes + size_t(g.n) * size_t(ldy) * 2};
}

}  // namespace sm90_mx_bf16_detail

template <class Spec>
struct Sm90MxBf16Gemm {
  PGEMM_SPEC_SCHEDULE_MEMBERS(Spec);
  PGEMM_SPEC_OUTPUT_MEMBERS(Spec);
  PGEMM_SPEC_SM90_MX_MEMBERS(Spec, "the weight's bytes: MxOperandE4m3 or MxOperandE2m1");
  PGEMM_SPEC_REQUIRE(Spec, OperandA, "the activations: ActivationsE4m3 or ActivationsBf16");
  using OperandA = typename Spec::OperandA;
  static constexpr bool kGrouped = ScheduleTag::Grouped;
  static constexpr bool kE2m1 = std::is_same_v<OperandX, collective::MxOperandE2m1>;
  static constexpr bool kBf16A = std::is_same_v<OperandA, ActivationsBf16>;
  static_assert(kBf16A || std::is_same_v<OperandA, ActivationsE4m3>, "OperandA: ActivationsE4m3 or ActivationsBf16");
  static_assert(!ScheduleTag::ReducesK, "the MX bf16 route has no split-K or stream-K (its K loop is the whole K)");
  static_assert(kBf16A || cute::size(ClusterShape{}) == 1,
                "the MX bf16 route with e4m3 activations runs on 1x1 clusters only (2x1 and 1x2 failed to launch)");
  static constexpr int kStages =
      Stages > 0 ? Stages
                 : sm90_mx_auto_stages(sm90_mx_bf16_detail::stage_bytes<OperandX, TileShape>(),
                                       kGrouped ? int(sizeof(scheduler::GroupTable)) : 0);

  using CollectiveMainloop =
      collective::Sm90MxBf16Mma<OperandX, TileShape, ClusterShape, kStages, kCooperative, kGrouped>;
  // The row and token references come back as the Rowwise epilogue's two fp32 vectors.
  using EpilogueOp = epilogue::Sm90PredicatedEpilogue<ElementD, ScaleMode::Rowwise, /*TransposeD=*/true, kGrouped>;
  using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp>;
  using Kernel = Sm90GemmPersistent<CollectiveMainloop, CollectiveEpilogue, ScheduleTag, Style>;
  using Arguments = typename Kernel::Arguments;

  static Arguments make_arguments(GemmArgs const& g, sm90_mx_bf16_detail::Workspace const& w) {
    Arguments args{};
    args.problem = cute::make_shape(int(g.m), int(g.n), int(g.k), 1);
    args.mainloop = {g.a, g.lda, w.y, w.ldy, static_cast<uint8_t const*>(g.scale_a), w.w_ref};
    args.epilogue = {static_cast<ElementD*>(g.d), int64_t(g.ldd), w.w_ref, w.a_ref,
                     static_cast<ElementD const*>(g.bias), g.alpha, g.beta};
    if constexpr (kGrouped) {
      args.mainloop.groups = g.groups;
      args.mainloop.group_stride_x = g.group_stride_a;
      args.mainloop.group_stride_sf_x = g.group_stride_scale_a;
      args.epilogue.group_stride_scale_a = sm90_mx_bf16_detail::band_rows(g);
      args.scheduler.group_rows = {g.group_rows, g.groups, g.n, g.group_rows_ld};
    }
    args.scheduler.max_workers = g.max_workers;
    args.sm_count = g.sm_count;
    return args;
  }

  static size_t workspace_bytes(GemmArgs const& g) { return sm90_mx_bf16_detail::carve(g).bytes; }

  // TMA's rules for the weight (16 B aligned base and stride), a blocked weight scale (bulk
  // copies of its atoms), K % 32 for packed e2m1 rows, D's extent, the workspace.
  static bool can_implement(GemmArgs const& g) {
    if (g.m < 1 || g.n < 1 || g.k < 1 || g.scale_mode != ScaleMode::Block32) return false;
    if constexpr (kGrouped) {
      // The experts' scales are one stack of whole bands (the pre-pass reads them as one matrix).
      int64_t const expert_scale_bytes = sm90_mx_bf16_detail::band_rows(g) / 128 * ((g.k + 127) / 128) * 512;
      if (g.groups < 1 || g.groups > scheduler::kMaxGroups || !g.group_rows || g.group_rows_ld < 0 ||
          int64_t(g.groups) * g.group_rows_ld > g.n || g.group_stride_a % 16 ||
          (g.groups > 1 && (g.group_stride_a < int64_t(g.m) * g.lda || g.group_stride_scale_a != expert_scale_bytes)))
        return false;
    } else if (g.groups != 0) {
      return false;
    }
    if (!g.a || !g.b || !g.d || !g.scale_a || (!kBf16A && !g.scale_b) || g.ld_scale_a != 0) return false;
    if (!aligned16(g.a) || !aligned16(g.scale_a)) return false;
    int64_t const x_bytes = kE2m1 ? g.k / 2 : g.k;
    if (kE2m1 && g.k % 32) return false;
    if (g.lda < x_bytes || g.lda % 16 || g.ldb < g.k) return false;
    if (g.ldd < g.m) return false;
    if (g.workspace == nullptr || g.workspace_bytes < workspace_bytes(g) || reinterpret_cast<uintptr_t>(g.workspace) % 256)
      return false;
    return Kernel::can_implement(make_arguments(g, sm90_mx_bf16_detail::carve(g)));
  }

  // Never throws; cudaErrorInvalidValue for a problem this instantiation cannot run.
  static cudaError_t run(GemmArgs const& g, cudaStream_t stream) noexcept {
    if (!can_implement(g)) return cudaErrorInvalidValue;
    auto const w = sm90_mx_bf16_detail::carve(g);
    host::MxBf16PrepassJob job;
    job.k = g.k;
    job.w_scale = static_cast<uint8_t const*>(g.scale_a);
    job.w_scale_ld = 0;
    job.w_rows = kGrouped ? int32_t(sm90_mx_bf16_detail::band_rows(g) * g.groups) : g.m;
    job.w_ref = w.w_ref;
    job.a = static_cast<uint8_t const*>(g.b);
    job.a_bf16 = kBf16A;
    job.lda = g.ldb;
    job.a_scale = kBf16A ? nullptr : static_cast<uint8_t const*>(g.scale_b);
    job.a_scale_ld = g.ld_scale_b;
    job.a_rows = g.n;
    job.a_ref = w.a_ref;
    job.y = w.y;
    job.ldy = w.ldy;
    if constexpr (kGrouped) job.groups = {g.group_rows, g.groups, g.n, g.group_rows_ld};
    if (cudaError_t e = host::mx_bf16_prepass(job, stream); e != cudaSuccess) return e;
    return launch_sm90_persistent<Kernel>(make_arguments(g, w), stream);
  }
};

}  // namespace persistent_gemm::kernel
