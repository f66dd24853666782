// SM90 mainloop for MX block-scaled GEMMs (1x32 e8m0 scales on both operands), fused.
//
// Hopper has no block-scaled MMA, so the scales are applied around FP8 wgmma: every 32-deep K
// block (one m64nNk32 e4m3 wgmma) lands in a temporary accumulator, which is then promoted into
// the fp32 accumulator with the block's two power-of-two scales,
//     acc[r][c] += T[r][c] * (sy[c] * sx[r])        (FMUL + FFMA per element; both exact),
// while the next block's wgmma runs. The operand bytes the kernel streams stay MX: e4m3 / packed
// e2m1 data by TMA, e8m0 scales by 1-D bulk copies of the blocked layout's 512-byte atoms
// (128 rows x 4 blocks: one tile-row band of one 128-deep K-tile), all into the same pipeline
// stage, counted in its transaction bytes.
//
//   X (the MMA's A side, kernel rows)     Y (the MMA's B side, kernel columns)
//   MxOperandE4m3: e4m3 in smem (SS)      e4m3 in smem, always
//   MxOperandE2m1: packed e2m1 in smem, converted to exact e4m3 in registers (RS wgmma) with a
//                  byte-permute LUT: 6 PRMT + 5 integer ops per 8 values; CUTLASS's e2m1
//                  NumericConverter is a per-element software path on sm_90a and is not used.
//   MxOperandE2m1Fold: the same, with the weight's block scale folded into the conversion
//                  exactly (the fold route, FP8 x FP4): per 16-row strip (one warp's rows of the
//                  fragment) and 32-K block, R = max code - 6, and each row's block converts
//                  through the LUT of e2m1 * 2^(code - R) (exact in e4m3 while the strip's codes
//                  span <= 14). The promotion's row factor is then the strip's 2^R: one FMUL per
//                  column and one FFMA per element, instead of FMUL + FFMA per element. A strip
//                  block whose codes span more (or hold a NaN code) converts plainly and promotes
//                  per row, as MxOperandE2m1 does: the branch is warp-uniform, and every weight
//                  is exact, foldable or not.
//
// Scales: once per K-tile the tile's consumer threads expand the stage's e8m0 atoms into fp32
// (code 0 -> 2^-127, 255 -> NaN, blocks past K -> 0 so zero-filled data never meets a padding
// NaN) in a per-stage buffer laid out for the accumulator fragment: a thread reads its column
// scales as float4s, conflict-free. A stage is released only after its last promotion.
//
// Two promotion schedules (Promotion template argument):
//   PerBlock  two temporaries alternate per 32-K block: the tensor core always has the next block
//             queued while the previous one is promoted. 3 accumulator sets.
//   PerKTile  for narrow (decode) tiles: two K-tiles' eight blocks go into eight temporaries;
//             the previous pair's eight are promoted while they run. 17 accumulator sets, so
//             only tiny tiles (64x16) qualify; the latency chain is paid once per two K-tiles.
//
// The rest of the collective interface (load_init/load/load_tail/mma/mma_tail, Params,
// TensorStorage) is what Sm90GemmPersistent composes; the persistent loop, roles and scheduler
// stay the kernel's.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/collective/builders/sm90_common.inl"
#include "cutlass/numeric_types.h"
#include "cutlass/pipeline/pipeline.hpp"

#include "persistent_gemm/collective/mx_block_scales.hpp"
#include "persistent_gemm/collective/sm90_mx_tma_operands.hpp"
#include "persistent_gemm/collective/sm90_mx_wgmma.hpp"

namespace persistent_gemm::collective {

namespace mx_fold_detail {
// The fold's per-stage shared memory (per row and block its conversion LUT; per strip and block
// whether it folds); empty for the other operands, so their storage does not change. It is the
// TensorStorage's base, so it comes first: sized in whole 1024 B so the 128B-swizzled TMA
// destinations after it stay 1024-byte aligned (unpadded, the first fold kernel faulted with a
// misaligned shared address at its first TMA load).
template <bool Fold, int Stages, int TileM>
struct FoldStorage {};
template <int Stages, int TileM>
struct alignas(1024) FoldStorage<true, Stages, TileM> {
  alignas(16) uint64_t fold_lut[Stages][mx_detail::kBlocksPerTile * TileM];
  uint8_t fold_mode[Stages][mx_detail::kBlocksPerTile * TileM / mx_detail::kFoldStripRows];
};
}  // namespace mx_fold_detail
// Promotion schedules.
struct PromotePerBlock {};
struct PromotePerKTile {};

template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_,
          class Promotion_ = PromotePerBlock>
struct Sm90MxBlockScaledMma
    : mx_detail::Sm90MxProducer<
          Sm90MxBlockScaledMma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Promotion_>> {
  using OperandX = OperandX_;
  using Promotion = Promotion_;
  using TileShape = TileShape_;
  static constexpr bool kCooperative = Cooperative_;
  static constexpr bool kFold = std::is_same_v<OperandX, MxOperandE2m1Fold>;
  static constexpr bool kRegisterX = kFold || std::is_same_v<OperandX, MxOperandE2m1>;
  static constexpr bool kPerKTile = std::is_same_v<Promotion, PromotePerKTile>;
  static constexpr int Stages = Stages_;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static_assert(cute::size<2>(TileShape{}) == mx_detail::kTileK,
                "MX mainloop: tile_k must be 128 (four 1x32 scale blocks = one blocked-layout atom column)");
  static_assert(kTileM % 64 == 0 && (kTileM <= 128 ? 128 % kTileM == 0 : kTileM % 128 == 0),
                "MX mainloop: tile_m must be 64, 128 or 256 (whole wgmma rows; atoms of 128 scale rows)");
  static_assert(kTileN % 16 == 0 && (kTileN <= 128 ? 128 % kTileN == 0 : kTileN % 128 == 0),
                "MX mainloop: tile_n must divide 128 or be a multiple of it, in steps of 16");
  static_assert(!kCooperative || kTileM % 128 == 0, "cooperative MX tiles split tile_m over two warpgroups");
  static_assert(Stages >= 2, "MX mainloop needs at least two stages");
  static_assert(!kFold || kTileM % 32 == 0,
                "MX fold: a strip's reference is reduced over 16 lanes of a warp; tile_m must be a multiple of 32");

  PGEMM_SM90_MX_MAINLOOP_TYPES(cutlass::float_e4m3_t);  // e2m1 weights are converted to e4m3 first

  // ---- MMA -----------------------------------------------------------------------------------
  using AtomLayoutMNK = std::conditional_t<kCooperative, cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>,
                                           cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>>;
  static constexpr auto mma_op() {
    if constexpr (kRegisterX)
      return cute::GMMA::rs_op_selector<ElementA, ElementB, float, TileShape, cute::GMMA::Major::K,
                                        cute::GMMA::Major::K>();
    else
      return cute::GMMA::ss_op_selector<ElementA, ElementB, float, TileShape, cute::GMMA::Major::K,
                                        cute::GMMA::Major::K>();
  }
  using TiledMma = decltype(cute::make_tiled_mma(mma_op(), AtomLayoutMNK{}));
  static constexpr int kMmaThreads = int(cute::size(TiledMma{}));
  static constexpr int kAtomN = cute::size<1>(typename TiledMma::AtomShape_MNK{});
  static_assert(kAtomN % 16 == 0, "wgmma N of the MX mainloop must be a multiple of 16");
  static constexpr int kMmaM = kTileM / (64 * (kCooperative ? 2 : 1));  // atoms along M per thread
  static constexpr int kMmaN = kTileN / kAtomN;

  // ---- shared memory -------------------------------------------------------------------------
  // X: e4m3 (tile_m x 128 B, 128 B swizzle) or packed e2m1 (tile_m x 64 B, 64 B swizzle).
  using SmemLayoutAtomX = std::conditional_t<kRegisterX, cute::GMMA::Layout_K_SW64_Atom<uint8_t>,
                                             cute::GMMA::Layout_K_SW128_Atom<ElementA>>;
  using ElementXStorage = std::conditional_t<kRegisterX, uint8_t, ElementA>;
  static constexpr int kXBytesPerRow = kRegisterX ? mx_detail::kTileK / 2 : mx_detail::kTileK;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemLayoutAtomX{}, cute::make_shape(cute::Int<kTileM>{}, cute::Int<kXBytesPerRow>{}, cute::Int<Stages>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<ElementB>{},
      cute::make_shape(cute::Int<kTileN>{}, cute::Int<mx_detail::kTileK>{}, cute::Int<Stages>{})));

  static constexpr int kAtomsX = kTileM <= 128 ? 1 : kTileM / 128;
  static constexpr int kAtomsY = kTileN <= 128 ? 1 : kTileN / 128;
  // fp32 scales of one stage: rows [block][tile_m], columns [block][q][tile_n/4 + pad].
  static constexpr int kColStride = kTileN / 4 + 4;  // +4 floats: the four q rows hit distinct banks
  static constexpr int kScaleFloats = mx_detail::kBlocksPerTile * (kTileM + 4 * kColStride);

  static_assert(sizeof(mx_fold_detail::FoldStorage<kFold, Stages, kTileM>) % 1024 == 0 || !kFold,
                "the fold's storage precedes the swizzled operand tiles: it must keep them 1024-byte aligned");
  struct TensorStorage : cute::aligned_struct<128, cute::_0>, mx_fold_detail::FoldStorage<kFold, Stages, kTileM> {
    cute::array_aligned<ElementXStorage, cute::cosize_v<SmemLayoutA>> smem_A;
    cute::array_aligned<ElementB, cute::cosize_v<SmemLayoutB>> smem_B;
    alignas(128) uint8_t sf_x[Stages][kAtomsX * mx_blocked::kAtomBytes];
    alignas(128) uint8_t sf_y[Stages][kAtomsY * mx_blocked::kAtomBytes];
    alignas(16) float sf_f32[Stages][kScaleFloats];
  };
  using MainloopPipeline = cutlass::PipelineTmaAsync<Stages>;
  using PipelineState = cutlass::PipelineState<Stages>;
  using PipelineStorage = typename MainloopPipeline::SharedStorage;
  static constexpr int NumProducerThreadEvents = 1;
  // Accumulator-sized register sets a consumer holds (the kernel's register split reads it).
  static constexpr int kAccumulatorCopies = kPerKTile ? 1 + 4 * mx_detail::kBlocksPerTile : 3;

  static constexpr uint32_t kScaleBytes = uint32_t(kAtomsX + kAtomsY) * mx_blocked::kAtomBytes;
  static constexpr uint32_t TmaTransactionBytes =
      uint32_t(kTileM * kXBytesPerRow + kTileN * mx_detail::kTileK) + kScaleBytes;

  // ---- TMA -------------------------------------------------------------------------------------
  using TmaOperands = mx_detail::Sm90MxTmaOperands<ClusterShape, TileShape, kXBytesPerRow, SmemLayoutA, SmemLayoutB, StrideA>;
  using TmaX = decltype(TmaOperands::make_tma_x(static_cast<ElementXStorage const*>(nullptr), 1, 1, 1));
  using TmaY = decltype(TmaOperands::make_tma_y(static_cast<ElementB const*>(nullptr), 1, 1, 1));

  // ---- host interface --------------------------------------------------------------------------
  struct Arguments {
    void const* ptr_x = nullptr;  // (rows_x, K) e4m3 or (rows_x, K/2) packed e2m1, K contiguous
    int64_t ld_x = 0;             // elements (e4m3) or bytes (packed e2m1)
    void const* ptr_y = nullptr;  // (rows_y, K) e4m3, K contiguous
    int64_t ld_y = 0;
    uint8_t const* sf_x = nullptr;  // blocked e8m0 scales of X, (ceil(rows_x/128) x ceil(K/128)) atoms
    uint8_t const* sf_y = nullptr;
  };

  struct Params : mx_detail::Sm90MxOperandParams<TmaX, TmaY, TmaTransactionBytes> {
    uint8_t const* sf_y = nullptr;
    int32_t bands_x = 1, bands_y = 1;  // 128-row scale bands (the last one may be partial)
    int32_t k_tiles = 1;               // atoms per band along K
    int32_t k_blocks = 1;              // ceil(K / 32): blocks past it are padding
  };

  static void set_scale_params(Params& p, Arguments const& args, int n, int k) {
    p.sf_y = args.sf_y;
    p.bands_y = (n + 127) / 128;
    p.k_tiles = (k + mx_detail::kTileK - 1) / mx_detail::kTileK;
  }

  // ---- producer (Sm90MxProducer) -------------------------------------------------------------
  CUTLASS_HOST_DEVICE static int x_extent(int k) { return kRegisterX ? k / 2 : k; }
  CUTLASS_HOST_DEVICE static int y_extent(int k) { return k; }
  // The scale atoms of this tile: its 128-row bands (clamped for a tail CTA past the grid, whose
  // results are never stored), then one atom per K-tile.
  template <class MCoord, class NCoord>
  CUTLASS_DEVICE static auto scale_copies(Params const& params, TensorStorage& shared, MCoord m_coord, NCoord n_coord) {
    int const band_x = min(int(m_coord) * kTileM / mx_blocked::kAtomRows, params.bands_x - kAtomsX);
    int const band_y = min(int(n_coord) * kTileN / mx_blocked::kAtomRows, params.bands_y - kAtomsY);
    uint8_t const* sfx = params.sf_x + int64_t(max(band_x, 0)) * params.k_tiles * mx_blocked::kAtomBytes;
    uint8_t const* sfy = params.sf_y + int64_t(max(band_y, 0)) * params.k_tiles * mx_blocked::kAtomBytes;
    int64_t const band_stride = int64_t(params.k_tiles) * mx_blocked::kAtomBytes;
    return [=, &shared](auto* bar, int stage, int kt) {
      CUTLASS_PRAGMA_UNROLL
      for (int a = 0; a < kAtomsX; ++a)
        cute::SM90_BULK_COPY_G2S::copy(sfx + a * band_stride + int64_t(kt) * mx_blocked::kAtomBytes, bar,
                                       shared.sf_x[stage] + a * mx_blocked::kAtomBytes, mx_blocked::kAtomBytes);
      CUTLASS_PRAGMA_UNROLL
      for (int a = 0; a < kAtomsY; ++a)
        cute::SM90_BULK_COPY_G2S::copy(sfy + a * band_stride + int64_t(kt) * mx_blocked::kAtomBytes, bar,
                                       shared.sf_y[stage] + a * mx_blocked::kAtomBytes, mx_blocked::kAtomBytes);
    };
  }

  // ---- consumer ------------------------------------------------------------------------------
  // Thread-fragment geometry of the wgmma accumulator (CuTe's CLayout_64xN): value
  // v = v0 + 2 v1 + 4 v2 of atom (mi, ni) sits at row 16 warp + lane/4 + 8 v1 (+ the atom's and
  // the warpgroup's row offsets) and column 2 (lane % 4) + v0 + 8 v2 (+ ni * atom N).
  CUTLASS_HOST_DEVICE static int fragment_row(int thread_idx, int mi, int v1) {
    int const wg = thread_idx / 128, t = thread_idx % 128;
    return mi * 64 * (kCooperative ? 2 : 1) + wg * 64 + (t / 32) * 16 + (t % 32) / 4 + 8 * v1;
  }

  // The consumer's steps, defined in sm90_mx_block_scaled_mma_consumer.hpp (included below).
  // Expand this stage's e8m0 atoms into fp32, shared by the kMmaThreads threads of the tile.
  CUTLASS_DEVICE void expand_scales(TensorStorage& shared, int stage, int kt, int m_off, int n_off, int thread_idx,
                                    Params const& params) const;
  // Packed e2m1 rows of this thread -> the RS wgmma's A fragment of one 32-K block.
  template <class FragA>
  CUTLASS_DEVICE static void load_x_block(FragA&& frag, uint8_t const* stage_base, int thread_idx, int block,
                                          uint64_t const* lut = nullptr);
  // The tile's K-tiles into `accum`, by the Promotion schedule.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared, Params const& params);

  // mma() retired every wgmma and released every stage it read.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}

  // The kernel tells the consumer which tile it works on before mma(): rows/columns of a tile
  // narrower than 128 start inside their scale atom.
  template <class BlockCoord>
  CUTLASS_DEVICE void set_tile(BlockCoord const& blk_coord) {
    tile_m_off_ = kTileM < 128 ? (int(cute::get<0>(blk_coord)) * kTileM) % 128 : 0;
    tile_n_off_ = kTileN < 128 ? (int(cute::get<1>(blk_coord)) * kTileN) % 128 : 0;
  }

 private:
  int tile_m_off_ = 0, tile_n_off_ = 0;
};

}  // namespace persistent_gemm::collective

// The consumer's member definitions.
#include "persistent_gemm/collective/sm90_mx_block_scaled_mma_consumer.hpp"
