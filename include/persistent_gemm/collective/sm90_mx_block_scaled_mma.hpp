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

  static constexpr bool kGrouped = false;  // one problem (Sm90MxProducer)

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
  template <class MCoord, class NCoord, class LCoord>
  CUTLASS_DEVICE static auto scale_copies(Params const& params, TensorStorage& shared, MCoord m_coord, NCoord n_coord,
                                          LCoord) {
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

  // The consumer's steps (defined at the end of this file).
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

// ---- the consumer's steps: scale expansion, e2m1 conversion, mma() and its promotions -----------

// Expand this stage's e8m0 atoms into fp32, shared by the kMmaThreads threads of the tile.
template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_, class Promotion_>
CUTLASS_DEVICE void Sm90MxBlockScaledMma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Promotion_>::expand_scales(
    TensorStorage& shared, int stage, int kt, int m_off, int n_off, int thread_idx, Params const& params) const {
  float* f = shared.sf_f32[stage];
  int const first_block = kt * mx_detail::kBlocksPerTile;
  auto expand = [&](uint32_t word, int b) {
    uint32_t const code = (word >> (8 * b)) & 0xFFu;
    return first_block + b < params.k_blocks ? mx_detail::e8m0_to_float(code) : 0.0f;
  };
  CUTLASS_PRAGMA_UNROLL
  for (int r = thread_idx; r < kTileM; r += kMmaThreads) {
    int const rr = m_off + r;  // row inside the tile's atom(s)
    uint32_t const w = *reinterpret_cast<uint32_t const*>(
        shared.sf_x[stage] + (rr / 128) * mx_blocked::kAtomBytes + mx_blocked::atom_offset(rr % 128));
    if constexpr (kFold) {
      // The strip's largest and smallest code per block (bytes of w), over its 16 rows: 16
      // consecutive lanes, as kTileM and kMmaThreads are multiples of 32.
      uint32_t hi = w, lo = w;
      CUTLASS_PRAGMA_UNROLL
      for (int s = 1; s < mx_detail::kFoldStripRows; s *= 2) {
        hi = __vmaxu4(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, s));
        lo = __vminu4(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, s));
      }
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) {
        int const code = int((w >> (8 * b)) & 0xFFu), top = int((hi >> (8 * b)) & 0xFFu);
        int const bottom = int((lo >> (8 * b)) & 0xFFu);
        bool const in_k = first_block + b < params.k_blocks;
        bool const fold = in_k && top != 255 && top - bottom <= mx_detail::kFoldShiftMax - mx_detail::kFoldShiftMin;
        int const ref = top - mx_detail::kFoldShiftMax;  // R, in code units
        shared.fold_lut[stage][b * kTileM + r] = mx_detail::e2m1_fold_lut(fold ? code - ref : 0);
        f[b * kTileM + r] = !in_k ? 0.0f
                            : fold ? __uint_as_float(mx_detail::f32_pow2_bits(ref - 127))
                                   : mx_detail::e8m0_to_float(uint32_t(code));
        if (r % mx_detail::kFoldStripRows == 0) shared.fold_mode[stage][b * (kTileM / 16) + r / 16] = fold;
      }
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) f[b * kTileM + r] = expand(w, b);
    }
  }
  float* fc = f + mx_detail::kBlocksPerTile * kTileM;
  CUTLASS_PRAGMA_UNROLL
  for (int c = thread_idx; c < kTileN; c += kMmaThreads) {
    int const cc = n_off + c;
    uint32_t const w = *reinterpret_cast<uint32_t const*>(
        shared.sf_y[stage] + (cc / 128) * mx_blocked::kAtomBytes + mx_blocked::atom_offset(cc % 128));
    int const q = (c / 2) % 4, slot = (c / 8) * 2 + c % 2;
    CUTLASS_PRAGMA_UNROLL
    for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) fc[(b * 4 + q) * kColStride + slot] = expand(w, b);
  }
}

// Packed e2m1 rows of this thread -> the RS wgmma's A fragment of one 32-K block.
// smem row r of a stage is 64 bytes, 64 B-swizzled by TMA: 16 B chunk j of a row sits at
// j ^ (address bits 7..8 of the row). The hardware swizzles absolute shared-memory addresses,
// so the XOR is taken from the row's address, not its index (the buffer need not be 512 B aligned).
// Fold: `lut` holds this stage's per-(block, row) conversion LUTs (FoldStorage::fold_lut).
template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_, class Promotion_>
template <class FragA>
CUTLASS_DEVICE void Sm90MxBlockScaledMma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Promotion_>::load_x_block(
    FragA&& frag, uint8_t const* stage_base, int thread_idx, int block, uint64_t const* lut) {
  using namespace cute;
  int const q = thread_idx % 4;
  uint32_t const half = (q & 1) ? 0x7632u : 0x5410u;
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kMmaM; ++mi) {
    auto regs = recast<uint32_t>(frag(_, mi));  // 4 registers: (r, k 4q..), (r+8, ..), (r, k 16+4q..), (r+8, ..)
    CUTLASS_PRAGMA_UNROLL
    for (int v1 = 0; v1 < 2; ++v1) {
      int const r = fragment_row(thread_idx, mi, v1);
      uint8_t const* row_start = stage_base + r * 64;
      uint32_t const row_addr = cute::cast_smem_ptr_to_uint(row_start);
      uint8_t const* row = row_start + ((block ^ ((row_addr >> 7) & 3)) << 4);
      uint32_t const w0 = *reinterpret_cast<uint32_t const*>(row + 4 * (q >> 1));      // k 4q..4q+3
      uint32_t const w1 = *reinterpret_cast<uint32_t const*>(row + 8 + 4 * (q >> 1));  // k 16+4q..
      uint32_t lo, hi;
      if constexpr (kFold) {
        uint64_t const l = lut[block * kTileM + r];
        mx_detail::e2m1x8_to_e4m3x8(__byte_perm(w0, w1, half), lo, hi, uint32_t(l), uint32_t(l >> 32));
      } else {
        mx_detail::e2m1x8_to_e4m3x8(__byte_perm(w0, w1, half), lo, hi);
      }
      regs(v1) = lo;
      regs(2 + v1) = hi;
    }
  }
}

template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_, class Promotion_>
template <class FrgTensorC>
CUTLASS_DEVICE void Sm90MxBlockScaledMma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Promotion_>::mma(
    MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count, int thread_idx,
    TensorStorage& shared, Params const& params) {
  using namespace cute;
  static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
  static_assert(size<0>(FrgTensorC{}) == kAtomN / 2, "unexpected wgmma accumulator fragment");
  static_assert(size<1>(FrgTensorC{}) == kMmaM && size<2>(FrgTensorC{}) == kMmaN, "unexpected accumulator tiling");

  Tensor sA = make_tensor(make_smem_ptr(shared.smem_A.data()), SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), SmemLayoutB{});
  TiledMma tiled_mma;
  auto wg_mma = mx_detail::warpgroup_slice(tiled_mma, thread_idx);
  Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
  auto thread_mma = tiled_mma.get_slice(thread_idx);
  // The X operand: smem descriptors (SS), or a register fragment filled per block (RS).
  auto x_fragment = [&]() {
    if constexpr (kRegisterX) {
      return mx_detail::register_fragment_a<ElementA, kTileM, mx_detail::kTileK>(thread_mma);
    } else {
      return wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    }
  };
  auto tCrA = x_fragment();
  int const q = thread_idx % 4;

  // The packed e2m1 bytes of block b of `stage`, converted into `frag_a` (RS only).
  auto load_x = [&](auto& frag_a, int stage, int b) {
    if constexpr (kFold)
      load_x_block(frag_a(_, _, b), &shared.smem_A[stage * kTileM * kXBytesPerRow], thread_idx, b,
                   shared.fold_lut[stage]);
    else
      load_x_block(frag_a(_, _, b), &shared.smem_A[stage * kTileM * kXBytesPerRow], thread_idx, b);
  };
  // One wgmma of block b of `stage` into `temp`, zero-initialised; the caller commits.
  auto mma_block = [&](auto& temp, int stage, int b, auto& frag_a) {
    warpgroup_fence_operand(temp);
    warpgroup_arrive();
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    if constexpr (kRegisterX)
      cute::gemm(tiled_mma, frag_a(_, _, b), tCrB(_, _, b, stage), temp);
    else
      cute::gemm(tiled_mma, tCrA(_, _, b, stage), tCrB(_, _, b, stage), temp);
  };
  // Block b of the current stage into `temp` as its own wgmma batch.
  auto issue_block = [&](auto& temp, int stage, int b, auto& frag_a) {
    if constexpr (kRegisterX) {
      load_x(frag_a, stage, b);
      warpgroup_fence_operand(frag_a);
    }
    mma_block(temp, stage, b, frag_a);
    warpgroup_commit_batch();
    // Keeps the compiler from moving reads of `temp` into the window where the wgmma owns it.
    warpgroup_fence_operand(temp);
  };
  // acc += temp * col_scale * row_scale for block b of `stage`. Folded strips (both of a
  // thread's rows carry the strip's factor) take one FMUL per column instead of one per element.
  // The warp-uniform branch sits inside the column loop: around the whole loop, the two bodies'
  // register allocation spilled.
  auto promote = [&](auto& temp, int stage, int b) {
    float const* f = shared.sf_f32[stage];
    float rs[kMmaM][2];
    bool folded = kFold;
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kMmaM; ++mi) {
      int const r0 = fragment_row(thread_idx, mi, 0);
      rs[mi][0] = f[b * kTileM + r0];
      rs[mi][1] = f[b * kTileM + fragment_row(thread_idx, mi, 1)];
      if constexpr (kFold) folded = folded && shared.fold_mode[stage][b * (kTileM / 16) + r0 / 16];
    }
    float const* fc = f + mx_detail::kBlocksPerTile * kTileM + (b * 4 + q) * kColStride;
    warpgroup_fence_operand(temp);
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_UNROLL
    for (int ni = 0; ni < kMmaN; ++ni) {
      CUTLASS_PRAGMA_UNROLL
      for (int v2 = 0; v2 < kAtomN / 8; v2 += 2) {
        // slots ni * kAtomN/4 + 2 v2 + {0,1} and 2 (v2+1) + {0,1}: columns 8 v2 + 2q + {0,1}, 8 (v2+1) + ...
        float4 const cs = *reinterpret_cast<float4 const*>(fc + ni * (kAtomN / 4) + 2 * v2);
        float const c[4] = {cs.x, cs.y, cs.z, cs.w};
        // The scale product first, so `temp` (a wgmma accumulator) is only read, never written,
        // outside the wgmma. (ptxas still serializes this kernel's wgmmas, C7514, when the
        // promotion reads a temporary under wait<1>: docs/design/sm90_mx_mainloop.md.)
        auto columns = [&](auto shared_row) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) {
            int const v0 = j % 2, vv2 = v2 + j / 2;
            CUTLASS_PRAGMA_UNROLL
            for (int mi = 0; mi < kMmaM; ++mi) {
              float const s0 = c[j] * rs[mi][0];
              CUTLASS_PRAGMA_UNROLL
              for (int v1 = 0; v1 < 2; ++v1) {
                int const v = v0 + 2 * v1 + 4 * vv2;
                float const scale = decltype(shared_row)::value || v1 == 0 ? s0 : c[j] * rs[mi][1];
                accum(v, mi, ni) = fmaf(temp(v, mi, ni), scale, accum(v, mi, ni));
              }
            }
          }
        };
        if (folded)  // warp-uniform: a warp's rows are one strip per mi
          columns(cute::true_type{});
        else
          columns(cute::false_type{});
      }
    }
    warpgroup_fence_operand(accum);
  };

  // One barrier per tile owner: both warpgroups (cooperative) or this one (ping-pong).
  // NamedBarrier offsets user ids past CUTLASS's reserved ones itself.
  int const owner = kCooperative ? 0 : cutlass::canonical_warp_group_idx() - 1;
  cutlass::arch::NamedBarrier scale_barrier(kMmaThreads, owner);
  // Wait for a stage, expand its scales for every thread of the tile.
  int kt = 0;
  auto acquire_unsynced = [&]() {
    pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
    int const stage = smem_pipe_read.index();
    expand_scales(shared, stage, kt, tile_m_off_, tile_n_off_, thread_idx, params);
    ++kt;
    ++smem_pipe_read;
    return stage;
  };
  auto acquire = [&]() {
    int const stage = acquire_unsynced();
    scale_barrier.sync();
    return stage;
  };
  PipelineState smem_pipe_release = smem_pipe_read;
  auto release = [&]() {
    pipeline.consumer_release(smem_pipe_release);
    ++smem_pipe_release;
  };

  clear(accum);
  if constexpr (!kPerKTile) {
    Tensor t0 = make_fragment_like(accum);
    Tensor t1 = make_fragment_like(accum);
    // Block b of a K-tile goes into t[b % 2]; block 3's promotion is the next K-tile's first.
    // A K-tile's second half (block 1 in flight), the same in the first K-tile and the loop. A
    // macro, not a lambda: the lambda changed the RS kernel's register allocation (2.9k SASS
    // lines of sm90a_e4m3xe2m1_128x128x128 differed), the macro is the same code token for token.
#define PGEMM_MX_PROMOTE_BLOCKS_0_TO_2(stage) \
    warpgroup_wait<1>();                      \
    promote(t0, stage, 0);                    \
    issue_block(t0, stage, 2, tCrA);          \
    warpgroup_wait<1>();                      \
    promote(t1, stage, 1);                    \
    issue_block(t1, stage, 3, tCrA);          \
    warpgroup_wait<1>();                      \
    promote(t0, stage, 2)
    int stage = acquire();
    issue_block(t0, stage, 0, tCrA);
    issue_block(t1, stage, 1, tCrA);
    PGEMM_MX_PROMOTE_BLOCKS_0_TO_2(stage);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k = 1; k < k_tile_count; ++k) {
      int const prev = stage;
      stage = acquire();
      issue_block(t0, stage, 0, tCrA);
      warpgroup_wait<1>();
      promote(t1, prev, 3);
      release();
      issue_block(t1, stage, 1, tCrA);
      PGEMM_MX_PROMOTE_BLOCKS_0_TO_2(stage);
    }
#undef PGEMM_MX_PROMOTE_BLOCKS_0_TO_2
    warpgroup_wait<0>();
    promote(t1, stage, 3);
    release();
  } else {
    // (Measured on the H200: 44.8 us at 1 x 8192 x 8192. A one-K-tile step with four temporaries
    // per set measured 36.2 us in an earlier run, before the named-barrier and fence fixes; it
    // is the next thing to bring back, with a GPU run to validate it.)
    // A step is two K-tiles (8 blocks, one wgmma batch per K-tile) into one set of eight
    // temporaries; the previous step's set is promoted while this one runs. Two K-tiles per
    // wait halve the latency chain (wait, expand, barrier, issue, promote) per byte, which is
    // what a decode tile is bound by; RS tiles load all their e2m1 bytes before converting.
    Tensor a0 = make_fragment_like(accum), a1 = make_fragment_like(accum), a2 = make_fragment_like(accum),
           a3 = make_fragment_like(accum), a4 = make_fragment_like(accum), a5 = make_fragment_like(accum),
           a6 = make_fragment_like(accum), a7 = make_fragment_like(accum);
    Tensor b0 = make_fragment_like(accum), b1 = make_fragment_like(accum), b2 = make_fragment_like(accum),
           b3 = make_fragment_like(accum), b4 = make_fragment_like(accum), b5 = make_fragment_like(accum),
           b6 = make_fragment_like(accum), b7 = make_fragment_like(accum);
    // RS: one X fragment per K-tile in flight, so a conversion never overwrites registers a
    // pending wgmma reads.
    auto tCrA1 = x_fragment();
    auto tCrA2 = x_fragment();
    auto tCrA3 = x_fragment();
    auto issue_tile = [&](auto& t0, auto& t1, auto& t2, auto& t3, int stage, auto& frag_a) {
      if constexpr (kRegisterX) {
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < mx_detail::kBlocksPerTile; ++b) load_x(frag_a, stage, b);
        warpgroup_fence_operand(frag_a);
      }
      mma_block(t0, stage, 0, frag_a);
      mma_block(t1, stage, 1, frag_a);
      mma_block(t2, stage, 2, frag_a);
      mma_block(t3, stage, 3, frag_a);
      warpgroup_commit_batch();  // one batch per K-tile (the hardware tracks at most 8)
      warpgroup_fence_operand(t0);
      warpgroup_fence_operand(t1);
      warpgroup_fence_operand(t2);
      warpgroup_fence_operand(t3);
    };
    auto promote_tile = [&](auto& t0, auto& t1, auto& t2, auto& t3, int stage) {
      promote(t0, stage, 0);
      promote(t1, stage, 1);
      promote(t2, stage, 2);
      promote(t3, stage, 3);
      release();
    };
    // Issue step k-tiles [k, k+1) or [k, k+2) into one set; returns how many.
    int stage_lo[2], stage_hi[2];
    auto issue_step = [&](int k, int set, auto& t0, auto& t1, auto& t2, auto& t3, auto& t4, auto& t5, auto& t6,
                          auto& t7, auto& fa, auto& fb) {
      bool const two = k + 1 < k_tile_count;
      stage_lo[set] = acquire_unsynced();
      if (two) stage_hi[set] = acquire_unsynced();
      scale_barrier.sync();
      issue_tile(t0, t1, t2, t3, stage_lo[set], fa);
      if (two) issue_tile(t4, t5, t6, t7, stage_hi[set], fb);
      return two;
    };
    auto promote_step = [&](bool two, int set, auto& t0, auto& t1, auto& t2, auto& t3, auto& t4, auto& t5,
                            auto& t6, auto& t7) {
      promote_tile(t0, t1, t2, t3, stage_lo[set]);
      if (two) promote_tile(t4, t5, t6, t7, stage_hi[set]);
    };
    // After issuing a step, the previous one is done once at most this step's batches remain.
    auto wait_previous = [&](bool two_now) {
      if (two_now)
        warpgroup_wait<2>();
      else
        warpgroup_wait<1>();
    };
    bool two_a = issue_step(0, 0, a0, a1, a2, a3, a4, a5, a6, a7, tCrA, tCrA1);
    int k = 2;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k < k_tile_count; k += 4) {
      bool const two_b = issue_step(k, 1, b0, b1, b2, b3, b4, b5, b6, b7, tCrA2, tCrA3);
      wait_previous(two_b);
      promote_step(two_a, 0, a0, a1, a2, a3, a4, a5, a6, a7);
      if (k + 2 >= k_tile_count) {
        warpgroup_wait<0>();
        promote_step(two_b, 1, b0, b1, b2, b3, b4, b5, b6, b7);
        return;
      }
      two_a = issue_step(k + 2, 0, a0, a1, a2, a3, a4, a5, a6, a7, tCrA, tCrA1);
      wait_previous(two_a);
      promote_step(two_b, 1, b0, b1, b2, b3, b4, b5, b6, b7);
    }
    warpgroup_wait<0>();
    promote_step(two_a, 0, a0, a1, a2, a3, a4, a5, a6, a7);
  }
}

}  // namespace persistent_gemm::collective
