// The operand side both SM90 MX mainloops share (Sm90MxBlockScaledMma, Sm90MxBf16Mma): X (the
// MMA's A side, kernel rows) and Y (its B side) by TMA, multicast across the cluster, one K-tile
// of each into a pipeline stage. The mainloops differ only in the scale bytes they add to the
// stage (and count in its transaction bytes), which they hand to load() as a callback.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cutlass/gemm/collective/builders/sm90_common.inl"

#include "persistent_gemm/collective/mx_block_scales.hpp"  // kBlockK

namespace persistent_gemm::collective {

// What X (the MMA's A side) holds, for the mainloops and their builders: e4m3 bytes, packed e2m1
// converted in registers, or packed e2m1 with its block scale folded into that conversion.
struct MxOperandE4m3 {};
struct MxOperandE2m1 {};
struct MxOperandE2m1Fold {};

}  // namespace persistent_gemm::collective

namespace persistent_gemm::collective::mx_detail {

// TileShape (BLK_M, BLK_N, BLK_K) of the MMA; X's tile is XBytesPerRow bytes deep (packed e2m1
// is half as many bytes as values). Stride: (rows, K, L), K contiguous, for both operands.
template <class ClusterShape, class TileShape, int XBytesPerRow, class SmemLayoutA, class SmemLayoutB, class Stride>
struct Sm90MxTmaOperands {
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  using GmemCopyX = decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(
      cute::size<1>(ClusterShape{})));
  using GmemCopyY = decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(
      cute::size<0>(ClusterShape{})));
  using TileShapeX = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::Int<XBytesPerRow>>;

  // X may be a stack of `groups` weights, `group_stride` bytes apart (a grouped kernel's L mode).
  template <class Ptr>
  static auto make_tma_x(Ptr ptr, int rows, int k_bytes, int64_t ld, int groups = 1, int64_t group_stride = 0) {
    auto t = cute::make_tensor(ptr, cute::make_layout(cute::make_shape(rows, k_bytes, groups),
                                                      Stride{ld, cute::_1{}, group_stride}));
    return cute::make_tma_copy_A_sm90(GmemCopyX{}, t, SmemLayoutA{}(cute::_, cute::_, cute::Int<0>{}), TileShapeX{},
                                      ClusterShape{});
  }
  template <class Ptr>
  static auto make_tma_y(Ptr ptr, int rows, int k, int64_t ld) {
    auto t = cute::make_tensor(ptr, cute::make_layout(cute::make_shape(rows, k, 1), Stride{ld, cute::_1{}, 0}));
    return cute::make_tma_copy_B_sm90(GmemCopyY{}, t, SmemLayoutB{}(cute::_, cute::_, cute::Int<0>{}), TileShape{},
                                      ClusterShape{});
  }

  // The Params fields both mainloops have (host side): the operands' TMA descriptors over X
  // (x_k: its K extent as stored) and Y (y_k), X's blocked scales, its 128-row scale bands and
  // the problem's K blocks; the caller fills in the rest.
  template <class Params, class ElementX, class ElementY>
  static Params make_params(ElementX const* x, int64_t ld_x, int m, int x_k, ElementY const* y, int64_t ld_y, int n,
                            int y_k, uint8_t const* sf_x, int k, int x_groups = 1, int64_t x_group_stride = 0) {
    Params p{make_tma_x(x, m, x_k, ld_x, x_groups, x_group_stride), make_tma_y(y, n, y_k, ld_y)};
    p.sf_x = sf_x;
    p.bands_x = (m + 127) / 128;
    p.k_blocks = (k + kBlockK - 1) / kBlockK;
    return p;
  }

  template <class Params>
  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_load_a.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_load_b.get_tma_descriptor());
  }

  // (BLK_M, BLK_K, m, k, l) and (BLK_N, BLK_K, n, k, l) over X (x_k: its K extent as stored; lx
  // its L) and Y (y_k, ly): the kernel counts K-tiles from the first.
  template <class Params, class LX, class LY>
  CUTLASS_DEVICE static auto load_init(Params const& params, int m, int x_k, int n, int y_k, LX lx, LY ly) {
    using namespace cute;
    Tensor mA = params.tma_load_a.get_tma_tensor(make_shape(m, x_k, lx));
    Tensor mB = params.tma_load_b.get_tma_tensor(make_shape(n, y_k, ly));
    Tensor gA = local_tile(mA, TileShapeX{}, make_coord(_, _, _), Step<_1, X, _1>{});
    Tensor gB = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
    return make_tuple(gA, gB);
  }

  // The producer (one elected thread): per K-tile, acquire a stage and TMA X and Y into it, then
  // scale_copies(bar, stage, kt) adds the mainloop's scale bytes. gA (BLK_M, BLK_K, k) and gB
  // (BLK_N, BLK_K, k) are the tile's slices of load_init's tensors (the caller picks the tile);
  // scale_copies is built once per tile, after the operands' setup.
  template <class Params, class Pipeline, class PipelineState, class TensorA, class TensorB, class KTileIterator,
            class ElementX, class ElementY, class MakeScaleCopies>
  CUTLASS_DEVICE static void load(Params const& params, Pipeline pipeline, PipelineState smem_pipe_write,
                                  TensorA const& gA, TensorB const& gB, KTileIterator k_tile_iter, int k_tile_count,
                                  uint32_t block_rank_in_cluster, ElementX* smem_a, ElementY* smem_b,
                                  MakeScaleCopies&& make_scale_copies) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(smem_a), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemLayoutB{});
    constexpr uint32_t cluster_x = size<0>(ClusterShape{});
    uint2 const cta = {block_rank_in_cluster % cluster_x, block_rank_in_cluster / cluster_x};
    auto block_tma_a = params.tma_load_a.get_slice(cta.y);
    auto block_tma_b = params.tma_load_b.get_slice(cta.x);
    Tensor tAgA = block_tma_a.partition_S(gA);
    Tensor tAsA = block_tma_a.partition_D(sA);
    Tensor tBgB = block_tma_b.partition_S(gB);
    Tensor tBsB = block_tma_b.partition_D(sB);

    uint16_t mcast_a = 0, mcast_b = 0;
    auto block_layout = Layout<ClusterShape>{};
    if constexpr (std::is_same_v<GmemCopyX, SM90_TMA_LOAD_MULTICAST>)
      for (int n = 0; n < size<1>(block_layout); ++n) mcast_a |= uint16_t(1) << block_layout(cta.x, n, Int<0>{});
    if constexpr (std::is_same_v<GmemCopyY, SM90_TMA_LOAD_MULTICAST>)
      for (int m = 0; m < size<0>(block_layout); ++m) mcast_b |= uint16_t(1) << block_layout(m, cta.y, Int<0>{});

    auto scale_copies = make_scale_copies();
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* bar = pipeline.producer_get_barrier(smem_pipe_write);
      int const stage = smem_pipe_write.index();
      int const kt = *k_tile_iter;
      copy(params.tma_load_a.with(*bar, mcast_a), tAgA(_, _, _, kt), tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(*bar, mcast_b), tBgB(_, _, _, kt), tBsB(_, _, _, stage));
      scale_copies(bar, stage, kt);
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE static void load_tail(Pipeline pipeline, PipelineState smem_pipe_write) {
    if (cute::elect_one_sync()) pipeline.producer_tail(smem_pipe_write);
  }
};

// The leading Params fields of both mainloops: the operands' TMA descriptors, the bytes a stage
// expects, X's blocked scales. A prefix, so each mainloop's Params keeps its layout (and the
// kernels their constant-bank offsets) with its own fields after it.
template <class TmaX, class TmaY, uint32_t TransactionBytes>
struct Sm90MxOperandParams {
  TmaX tma_load_a;
  TmaY tma_load_b;
  uint32_t tma_transaction_bytes = TransactionBytes;
  uint8_t const* sf_x = nullptr;
};

// The producer side of the collective interface Sm90GemmPersistent calls, once for both
// mainloops (CRTP): Mainloop supplies TmaOperands, Params, ElementXStorage / ElementB (the
// operands' stored elements), their K extents x_extent(K) / y_extent(K), set_scale_params and
// scale_copies(params, shared, m_coord, n_coord, l_coord), the per-K-tile scale copies.
//
// Grouped mainloops (Mainloop::kGrouped, MoE experts): X is a stack of the groups' weights (its
// L mode the group, Params::groups of them) and Y all the groups' rows, a tile's rows counted from
// its group's first (set_group_tile, before each tile's load).
template <class Mainloop>
struct Sm90MxProducer {
  // Params from the problem and the Arguments: the fields both mainloops have here, then
  // Mainloop::set_scale_params(p, args, n, k) their own scale fields.
  template <class ProblemShape, class Arguments>
  static auto to_underlying_arguments(ProblemShape const& problem, Arguments const& args, void*) {
    auto const [m, n, k, l] = problem;
    (void)l;
    int groups = 1;
    int64_t group_stride = 0;
    if constexpr (Mainloop::kGrouped) groups = args.groups, group_stride = args.group_stride_x;
    auto p = Mainloop::TmaOperands::template make_params<typename Mainloop::Params>(
        static_cast<typename Mainloop::ElementXStorage const*>(args.ptr_x), args.ld_x, m, Mainloop::x_extent(k),
        static_cast<typename Mainloop::ElementB const*>(args.ptr_y), args.ld_y, n, Mainloop::y_extent(k), args.sf_x, k,
        groups, group_stride);
    Mainloop::set_scale_params(p, args, n, k);
    return p;
  }

  template <class Params>
  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    Mainloop::TmaOperands::prefetch_tma_descriptors(params);
  }

  // (BLK_M, BLK_K, m, k, l) and (BLK_N, BLK_K, n, k, l): the kernel counts K-tiles from the first.
  template <class ProblemShapeMNKL, class Params>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem, Params const& params) const {
    auto [M, N, K, L] = problem;
    if constexpr (Mainloop::kGrouped)
      return Mainloop::TmaOperands::load_init(params, M, Mainloop::x_extent(K), N, Mainloop::y_extent(K), params.groups,
                                              cute::Int<1>{});
    else
      return Mainloop::TmaOperands::load_init(params, M, Mainloop::x_extent(K), N, Mainloop::y_extent(K), L, L);
  }

  template <class Params, class Pipeline, class PipelineState, class TensorA, class TensorB, class BlockCoord,
            class KTileIterator, class TensorStorage>
  CUTLASS_DEVICE void load(Params const& params, Pipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*lane*/, uint32_t block_rank_in_cluster,
                           TensorStorage& shared) {
    using namespace cute;
    auto const m_coord = get<0>(blk_coord);
    auto const n_coord = get<1>(blk_coord);
    auto const l_coord = get<3>(blk_coord);
    auto const& gA = get<0>(load_inputs);
    auto const& gB = get<1>(load_inputs);
    auto copy_tiles = [&](auto const& gA_tile, auto const& gB_tile) {
      Mainloop::TmaOperands::load(params, pipeline, smem_pipe_write, gA_tile, gB_tile, k_tile_iter, k_tile_count,
                                  block_rank_in_cluster, shared.smem_A.data(), shared.smem_B.data(), [&]() {
                                    return Mainloop::scale_copies(params, shared, m_coord, n_coord, l_coord);
                                  });
    };
    if constexpr (Mainloop::kGrouped) {
      // The group's weight; Y's rows counted from the group's first (not a multiple of BLK_N):
      // rows past the group's end load and are never stored.
      int32_t const row0 = static_cast<Mainloop const*>(this)->group_row_begin();
      copy_tiles(gA(_, _, m_coord, _, l_coord), domain_offset(make_coord(row0, 0, 0), gB(_, _, n_coord, _, 0)));
    } else {
      copy_tiles(gA(_, _, m_coord, _, l_coord), gB(_, _, n_coord, _, l_coord));
    }
  }

  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE void load_tail(Pipeline pipeline, PipelineState smem_pipe_write) {
    Mainloop::TmaOperands::load_tail(pipeline, smem_pipe_write);
  }
};

}  // namespace persistent_gemm::collective::mx_detail
