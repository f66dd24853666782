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
//
// Grouped (ScheduleTag::Grouped, pg.grouped_mm's MXFP8 and FP8 x FP4 on SM100; compiled, not run here): GemmArgs'
// a/m are every expert's activation rows (offs or the masked form's counts in group_rows, read on
// the device) with plain e8m0 scale_a rows (ld_scale_a), b the experts' stacked weights
// (group_stride_a bytes apart) and their blocked scales (group_stride_scale_a apart, one expert's
// whole bands), bias one row per expert. run() is three launches: the in pass (band-aligned copies
// of the activations and their scales), the GEMM on them (the scheduler's grouped walk, the
// mainloop's load_grouped below) into an fp32 D per padded row, and the out pass (alpha, the
// expert's bias, one rounding into D); host/sm100_grouped_bands.cuh says why and how. The copies
// live in GemmArgs::workspace: for R rows over E experts, (ceil(R/128) + min(E, R)) bands of
// 128 rows x (K bytes + K/32 scales + 4 N bytes). e2m1 weights as the dense kernels take them (K %
// 128 == 0, 32-byte rows), and the experts 32 bytes apart: the dispatcher cannot pad K through a
// stack (grouped_mm runs the reference for another K).
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
#include "persistent_gemm/host/sm100_grouped_bands.cuh"
#include "persistent_gemm/kernel/builder_common.hpp"
#include "persistent_gemm/kernel/builder_spec.hpp"
#include "persistent_gemm/kernel/sm100_builder_common.hpp"
#include "persistent_gemm/kernel/sm100_gemm_persistent.hpp"
#include "persistent_gemm/kernel/sm100_launch.hpp"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"
#include "persistent_gemm/layout/mx_blocked.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

// The grouped walk's producer over CUTLASS's block-scaled mainloop: A and its scales (the
// band-aligned copies) at the padded band and L 0, the weight and its scales at the N tile and
// L = the expert. The collective's own load() addresses all four by one (m, n, k, l); this is its
// producer loop with the two coordinates, over the same load_init tensors, pipeline and masks.
template <class Base>
struct Sm100GroupedMxMainloop : Base {
  using Base::Base;

  template <class LoadInputs, class KTileIterator>
  CUTLASS_DEVICE auto load_grouped(typename Base::MainloopPipeline pipeline, typename Base::MainloopPipelineState state,
                                   LoadInputs const& inputs, int32_t band, int32_t n_tile, int32_t expert,
                                   KTileIterator k_iter, int k_tiles) {
    using cute::_;
    auto const& [unused_k_tiles, gA, gB, sA, sB, gSFA, gSFB, sSFA, sSFB, mask_a, mask_b, mask_sfa, mask_sfb] = inputs;
    static_assert(cute::size(typename Base::TiledMma::AtomThrID{}) == 1, "1-SM MMAs: a band is one CTA's rows");
    auto a = gA(_, band, _, 0);
    auto sfa = gSFA(_, band, _, 0);
    auto b = gB(_, n_tile, _, expert);
    auto sfb = gSFB(_, n_tile, _, expert);
    auto token = pipeline.producer_try_acquire(state);
    for (; k_tiles > 0; --k_tiles, ++k_iter) {
      pipeline.producer_acquire(state, token);  // the stage is free; its full barrier expects the bytes
      auto* full = pipeline.producer_get_barrier(state);
      int const stage = state.index();
      ++state;
      token = pipeline.producer_try_acquire(state);
      if (cute::elect_one_sync()) {
        cute::copy(this->observed_tma_load_a_->with(*full, mask_a), a(_, *k_iter), sA(_, stage));
        cute::copy(this->observed_tma_load_b_->with(*full, mask_b), b(_, *k_iter), sB(_, stage));
        cute::copy(this->observed_tma_load_sfa_->with(*full, mask_sfa), sfa(_, *k_iter), sSFA(_, stage));
        cute::copy(this->observed_tma_load_sfb_->with(*full, mask_sfb), sfb(_, *k_iter), sSFB(_, stage));
      }
    }
    return cute::make_tuple(state, k_iter);
  }
};

namespace sm100_grouped_detail {

// GemmArgs::workspace of the grouped kernel: [A copy][its blocked scales][fp32 D], 256 B aligned.
struct Workspace {
  uint8_t* a_pad;
  uint8_t* sfa_pad;
  float* d_pad;
  int64_t bands, ld_d;
  size_t bytes;
};
inline Workspace carve(GemmArgs const& g) {
  int64_t const bands = host::sm100_bands::bands_bound(g.m, g.groups);
  int64_t const rows = bands * host::sm100_bands::kBandRows;
  int64_t const ld_d = (int64_t(g.n) + 3) / 4 * 4;  // whole 16-byte chunks for the TMA store
  size_t const a_bytes = align256(size_t(rows) * size_t(g.k));
  size_t const sf_bytes = align256(size_t(mx_blocked::bytes(rows, g.k / 32)));
  auto* base = static_cast<char*>(g.workspace);
  return {reinterpret_cast<uint8_t*>(base), reinterpret_cast<uint8_t*>(base + a_bytes),
          reinterpret_cast<float*>(base + a_bytes + sf_bytes), bands, ld_d,
          a_bytes + sf_bytes + size_t(rows) * size_t(ld_d) * 4};
}

}  // namespace sm100_grouped_detail

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
  static constexpr bool kGrouped = ScheduleTag::Grouped;
  // Grouped: the kernel writes the fp32 band copy of D; the out pass writes ElementD.
  using ElementKernelD = std::conditional_t<kGrouped, float, ElementD>;

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
  static constexpr int kAlignD = 16 / sizeof(ElementKernelD);

  using MainloopSchedule = std::conditional_t<k2Sm, cutlass::gemm::KernelTmaWarpSpecialized2SmMxf8f6f4Sm100,
                                              cutlass::gemm::KernelTmaWarpSpecialized1SmMxf8f6f4Sm100>;
  using EpilogueSchedule = std::conditional_t<k2Sm, cutlass::epilogue::TmaWarpSpecialized2Sm,
                                              cutlass::epilogue::TmaWarpSpecialized1Sm>;

  // No source C: D = 1 * acc (the scales are already applied by the MMA).
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD, kAlignD, ElementKernelD, LayoutD, kAlignD, EpilogueSchedule>::CollectiveOp;

  // The stages fill what the epilogue (and a grouped kernel's table) leave.
  using StageCountType = StageCountFor<Stages, static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage)) +
                                                   (kGrouped ? int(sizeof(scheduler::GroupTable)) : 0)>;

  using BlockScaledMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementPairA, LayoutA, kAlignA,
      ElementPairB, LayoutB, kAlignB, ElementAccumulator, MmaTileShape, ClusterShape, StageCountType,
      MainloopSchedule>::CollectiveOp;
  using CollectiveMainloop =
      std::conditional_t<kGrouped, Sm100GroupedMxMainloop<BlockScaledMainloop>, BlockScaledMainloop>;
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

  // Grouped: the copies' problem (padded bands x N x K, L = E experts); see the header comment.
  static typename Kernel::Arguments make_grouped_arguments(GemmArgs const& g, sm100_grouped_detail::Workspace const& w) {
    typename Kernel::Arguments args;
    int const rows = int(w.bands * host::sm100_bands::kBandRows);
    auto const problem = cute::make_shape(rows, int(g.n), int(g.k), int(g.groups));
    args.problem_shape = problem;
    args.mainloop.ptr_A = reinterpret_cast<ElementA const*>(w.a_pad);
    args.mainloop.dA = sm100_row_stride<typename Strides::A>(g.k, rows);  // L 0 only: its batch stride is nominal
    args.mainloop.ptr_B = static_cast<ElementB const*>(g.b);
    // GemmArgs counts bytes of the packed storage; CUTLASS counts elements.
    args.mainloop.dB = sm100_row_stride<typename Strides::B>(kE2m1 ? 2 * g.ldb : g.ldb, g.n);
    cute::get<2>(args.mainloop.dB) = kE2m1 ? 2 * g.group_stride_a : g.group_stride_a;  // expert e's (N, K) rows
    args.mainloop.ptr_SFA = reinterpret_cast<ElementSF const*>(w.sfa_pad);
    args.mainloop.layout_SFA = BlkScaledConfig::tile_atom_to_shape_SFA(problem);
    args.mainloop.ptr_SFB = static_cast<ElementSF const*>(g.scale_b);
    args.mainloop.layout_SFB = BlkScaledConfig::tile_atom_to_shape_SFB(problem);  // an expert's bands apart
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sm100_row_stride<typename Strides::C>(w.ld_d, rows);
    args.epilogue.ptr_D = w.d_pad;
    args.epilogue.dD = sm100_row_stride<typename Strides::D>(w.ld_d, rows);
    args.sm_count = g.sm_count;
    args.max_workers = g.max_workers;
    args.group_rows = {g.group_rows, g.groups, g.m, g.group_rows_ld};
    return args;
  }

  static size_t workspace_bytes(GemmArgs const& g) {
    if constexpr (kGrouped) return sm100_grouped_detail::carve(g).bytes;
    else return 0;
  }

  // Grouped: every operand the three launches read or write (the out pass stores D element by
  // element: any ldd >= N), the experts' strides, the workspace, then CUTLASS's checks.
  static bool can_implement_grouped(GemmArgs const& g) {
    if (g.scale_mode != ScaleMode::Block32 || !g.a_k_major || !g.b_k_major) return false;
    if (g.m < 1 || g.n < 1 || g.k < 1 || g.k % 32) return false;
    if (g.groups < 1 || g.groups > scheduler::kMaxGroups || !g.group_rows || g.group_rows_ld < 0 ||
        int64_t(g.groups) * g.group_rows_ld > g.m)
      return false;
    if (!g.a || !g.b || !g.d || !g.scale_a || !g.scale_b) return false;
    // The weight by TMA: 16-byte rows and experts (e2m1: 32-byte, and K % 128; sm100_mx's rules).
    int64_t const w_align = kE2m1 ? sm100_mx::kFp4TmaAlign : 16, w_row = kE2m1 ? g.k / 2 : g.k;
    if (kE2m1 && g.k % sm100_mx::kFp4KAlign) return false;
    if (!aligned16(g.a) || reinterpret_cast<uintptr_t>(g.b) % w_align || !aligned16(g.scale_b)) return false;
    if (g.lda < g.k || g.lda % 16 || g.ldb < w_row || g.ldb % w_align || g.ld_scale_a < g.k / 32 || g.ldd < g.n)
      return false;
    if (g.groups > 1 && (g.group_stride_a % w_align || g.group_stride_a < int64_t(g.n) * g.ldb ||
                         g.group_stride_scale_a != mx_blocked::bytes(g.n, g.k / 32)))
      return false;
    if (g.workspace == nullptr || g.workspace_bytes < workspace_bytes(g) || reinterpret_cast<uintptr_t>(g.workspace) % 256)
      return false;
    return Kernel::can_implement(make_grouped_arguments(g, sm100_grouped_detail::carve(g)));
  }

  // Dense: the same rule set as sm100_mx::rejection (host-testable, sm100_tile_mapping.hpp), then
  // CUTLASS's own checks.
  static bool can_implement(GemmArgs const& g) {
    if constexpr (kGrouped) {
      return can_implement_grouped(g);
    } else {
      if (g.groups != 0) return false;  // one problem's kernel: a grouped call is not its to run
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
  }

  // Never throws; cudaErrorInvalidValue for a problem this instantiation cannot run. Grouped:
  // the in pass, the GEMM, the out pass, on `stream`.
  static cudaError_t run(GemmArgs const& g, cudaStream_t stream) noexcept {
    if constexpr (!kGrouped) {
      return Sm100Host<Sm100MxGemm>::run(g, stream);
    } else {
      if (!can_implement(g)) return cudaErrorInvalidValue;
      auto const w = sm100_grouped_detail::carve(g);
      scheduler::GroupRows const rows{g.group_rows, g.groups, g.m, g.group_rows_ld};
      host::GroupedBandsIn in;
      in.rows = rows;
      in.k = g.k;
      in.a = static_cast<uint8_t const*>(g.a);
      in.lda = g.lda;
      in.scale_a = static_cast<uint8_t const*>(g.scale_a);
      in.ld_scale = g.ld_scale_a;
      in.a_pad = w.a_pad;
      in.sfa_pad = w.sfa_pad;
      in.bands = w.bands;
      if (cudaError_t e = host::sm100_grouped_bands_in(in, stream); e != cudaSuccess) return e;
      if (cudaError_t e = launch_sm100_persistent<Kernel>(Sm100Host<Sm100MxGemm>::entry(), make_grouped_arguments(g, w),
                                                          stream);
          e != cudaSuccess)
        return e;
      host::GroupedBandsOut<ElementD> out;
      out.rows = rows;
      out.n = g.n;
      out.d_pad = w.d_pad;
      out.ld_pad = w.ld_d;
      out.d = static_cast<ElementD*>(g.d);
      out.ldd = g.ldd;
      out.bias = static_cast<ElementD const*>(g.bias);
      out.alpha = g.alpha;
      out.beta = g.beta;
      out.bands = w.bands;
      return host::sm100_grouped_bands_out(out, stream);
    }
  }

  // entry(): Sm100Host.
};

}  // namespace persistent_gemm::kernel
