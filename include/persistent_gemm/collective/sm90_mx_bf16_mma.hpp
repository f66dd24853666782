// SM90 mainloop of the MX "bf16 route": no per-32 promotion at all.
//
// The per-block promotion of sm90_mx_block_scaled_mma.hpp costs FMUL + FFMA per accumulator
// element per 32-deep K block, as many issue slots as the bf16 tensor core's whole time. Here
// both block scales are applied to the operands *before* the MMA, exactly, and the tensor core
// accumulates in fp32 over the whole K:
//   X (the weight, the wgmma's A side: always swap-AB) arrives by TMA as its MX bytes (e4m3, or
//     packed e2m1) with its blocked e8m0 atoms; each consumer thread converts its A fragment to
//     bf16 in registers by bit placement (mx_block_scales.hpp) and one HMUL2 by 2^(e - r_row)
//     (times the placement's power of two): e the block's code, r_row the row's reference
//     exponent (its largest code, so every multiplier is <= 1 and every product is a normal bf16
//     unless the row's codes span more than ~124 binades).
//   Y (the activations) arrives as bf16 written by the pre-pass (host/mx_bf16_prepass.cuh):
//     e4m3 * 2^(e - r_token), K permuted inside each 32-block to match the A fragment's order.
//   The epilogue multiplies by 2^(r_row - 127) * 2^(r_token - 127) (the Rowwise predicated
//   epilogue's two fp32 vectors, both exact powers of two).
// Products are exact (bf16 holds e4m3 * 2^k and e2m1 * 2^k), accumulation is fp32.
//
// Per K-tile of 64 (two scale blocks) a thread converts its rows' bytes of the stage while the
// previous K-tile's wgmmas run (two A fragment buffers), then issues four k16 wgmmas.
//
// Grouped (MoE experts): X is the experts' stacked weights (the tile's L coordinate is its
// expert), each expert's blocked scales group_stride_sf_x bytes after the previous one's and its
// row references a whole number of 128-row bands after; Y holds every expert's rows, and a tile
// reads its rows from its expert's first (set_group_tile).
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

namespace bf16_route {
constexpr int kTileK = 64;                          // two 1x32 blocks: half a scale atom column
constexpr int kBlocksPerTile = kTileK / mx_detail::kBlockK;
}  // namespace bf16_route

template <class OperandX_, class TileShape_, class ClusterShape_, int Stages_, bool Cooperative_, bool Grouped_ = false>
struct Sm90MxBf16Mma
    : mx_detail::Sm90MxProducer<Sm90MxBf16Mma<OperandX_, TileShape_, ClusterShape_, Stages_, Cooperative_, Grouped_>> {
  using OperandX = OperandX_;
  using TileShape = TileShape_;
  static constexpr bool kCooperative = Cooperative_;
  static constexpr bool kGrouped = Grouped_;
  static constexpr bool kE2m1 = std::is_same_v<OperandX, MxOperandE2m1>;
  static_assert(kE2m1 || std::is_same_v<OperandX, MxOperandE4m3>, "OperandX: MxOperandE4m3 or MxOperandE2m1");
  static constexpr int Stages = Stages_;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static_assert(cute::size<2>(TileShape{}) == bf16_route::kTileK,
                "MX bf16 route: tile_k must be 64 (two 1x32 blocks; one 128 B swizzled bf16 row)");
  static_assert(kTileM == 64 || kTileM == 128, "MX bf16 route: tile_m (weight rows) must be 64 or 128");
  static_assert(!kCooperative || kTileM == 128, "MX bf16 route: cooperative tiles split 128 weight rows over two warpgroups");
  static_assert(kTileN % 16 == 0 && kTileN <= 256, "MX bf16 route: tile_n (tokens) must be a multiple of 16, at most 256");
  static_assert(Stages >= 2, "MX bf16 route needs at least two stages");

  PGEMM_SM90_MX_MAINLOOP_TYPES(cutlass::bfloat16_t);  // both operands converted to bf16

  // ---- MMA -------------------------------------------------------------------------------------
  using AtomLayoutMNK = std::conditional_t<kCooperative, cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>,
                                           cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>>;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<ElementA, ElementB, float, TileShape, cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      AtomLayoutMNK{}));
  static constexpr int kMmaThreads = int(cute::size(TiledMma{}));
  static constexpr int kKSteps = bf16_route::kTileK / 16;  // k16 wgmmas per K-tile

  // ---- shared memory ---------------------------------------------------------------------------
  // X bytes are only read by this thread's LDS, never by a descriptor: the swizzle is there to
  // spread a warp's eight rows over the banks. 64 B rows (e4m3) / 32 B rows (packed e2m1).
  static constexpr int kXBytesPerRow = kE2m1 ? bf16_route::kTileK / 2 : bf16_route::kTileK;
  using SmemLayoutAtomX = std::conditional_t<kE2m1, cute::GMMA::Layout_K_SW32_Atom<uint8_t>,
                                             cute::GMMA::Layout_K_SW64_Atom<uint8_t>>;
  static constexpr uint32_t kXSwizzleMask = kE2m1 ? 1u : 3u;  // 16 B chunk ^= address bits 7.. (SW32 / SW64)
  using SmemLayoutA = decltype(cute::tile_to_shape(
      SmemLayoutAtomX{}, cute::make_shape(cute::Int<kTileM>{}, cute::Int<kXBytesPerRow>{}, cute::Int<Stages>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<ElementB>{},
      cute::make_shape(cute::Int<kTileN>{}, cute::Int<bf16_route::kTileK>{}, cute::Int<Stages>{})));

  using ElementXStorage = uint8_t;
  struct TensorStorage : cute::aligned_struct<128, cute::_0> {
    cute::array_aligned<ElementXStorage, cute::cosize_v<SmemLayoutA>> smem_A;
    cute::array_aligned<ElementB, cute::cosize_v<SmemLayoutB>> smem_B;
    alignas(128) uint8_t sf_x[Stages][mx_blocked::kAtomBytes];  // the band's atom of this K-tile's column
  };
  using MainloopPipeline = cutlass::PipelineTmaAsync<Stages>;
  using PipelineState = cutlass::PipelineState<Stages>;
  using PipelineStorage = typename MainloopPipeline::SharedStorage;
  static constexpr int NumProducerThreadEvents = 1;
  static constexpr int kAccumulatorCopies = 1;

  static constexpr uint32_t TmaTransactionBytes =
      uint32_t(kTileM * kXBytesPerRow + kTileN * bf16_route::kTileK * 2 + mx_blocked::kAtomBytes);

  // ---- TMA ---------------------------------------------------------------------------------------
  using TmaOperands = mx_detail::Sm90MxTmaOperands<ClusterShape, TileShape, kXBytesPerRow, SmemLayoutA, SmemLayoutB, StrideA>;
  using TmaX = decltype(TmaOperands::make_tma_x(static_cast<ElementXStorage const*>(nullptr), 1, 1, 1));
  using TmaY = decltype(TmaOperands::make_tma_y(static_cast<ElementB const*>(nullptr), 1, 1, 1));

  // ---- host interface ----------------------------------------------------------------------------
  // The activations' K extent is padded to whole 32-blocks (the permutation mixes a block).
  CUTLASS_HOST_DEVICE static int padded_k(int k) { return (k + mx_detail::kBlockK - 1) / mx_detail::kBlockK * mx_detail::kBlockK; }

  struct Arguments {
    void const* ptr_x = nullptr;     // (rows_x, K) e4m3 or (rows_x, K/2) packed e2m1, K contiguous
    int64_t ld_x = 0;                // bytes
    void const* ptr_y = nullptr;     // (rows_y, padded_k(K)) bf16 from the pre-pass
    int64_t ld_y = 0;                // elements
    uint8_t const* sf_x = nullptr;   // blocked e8m0 scales of X
    float const* ref_x = nullptr;    // 2^(r_row - 127) per X row, padded to whole 128-row bands
    // Grouped: X's groups, the bytes between two groups' weights and between their blocked scales.
    int32_t groups = 1;
    int64_t group_stride_x = 0, group_stride_sf_x = 0;
  };

  struct Params : mx_detail::Sm90MxOperandParams<TmaX, TmaY, TmaTransactionBytes> {
    float const* ref_x = nullptr;
    int32_t bands_x = 1;     // 128-row scale bands
    int32_t atom_cols = 1;   // atoms per band along K (ceil(K / 128))
    int32_t k_blocks = 1;    // ceil(K / 32): blocks past it are padding
    int32_t groups = 1;      // grouped: X's groups (the L extent of its TMA tensor)
    int64_t group_stride_sf_x = 0;
  };

  static void set_scale_params(Params& p, Arguments const& args, int /*n*/, int k) {
    p.ref_x = args.ref_x;
    p.atom_cols = (k + mx_detail::kTileK - 1) / mx_detail::kTileK;
    p.groups = args.groups;
    p.group_stride_sf_x = args.group_stride_sf_x;
  }

  // ---- producer (Sm90MxProducer) -------------------------------------------------------------
  CUTLASS_HOST_DEVICE static int x_extent(int k) { return kE2m1 ? k / 2 : k; }
  CUTLASS_HOST_DEVICE static int y_extent(int k) { return padded_k(k); }
  // The tile's 128-row scale band (clamped for a tail CTA past the grid, whose results are never
  // stored) of its group's scales; K-tile kt reads half of atom column kt / 2, the whole atom is copied.
  template <class MCoord, class NCoord, class LCoord>
  CUTLASS_DEVICE static auto scale_copies(Params const& params, TensorStorage& shared, MCoord m_coord, NCoord,
                                          LCoord l_coord) {
    int const band = max(min(int(m_coord) * kTileM / mx_blocked::kAtomRows, params.bands_x - 1), 0);
    uint8_t const* sfx = params.sf_x + int64_t(band) * params.atom_cols * mx_blocked::kAtomBytes;
    if constexpr (kGrouped) sfx += int64_t(l_coord) * params.group_stride_sf_x;
    return [=, &shared](auto* bar, int stage, int kt) {
      cute::SM90_BULK_COPY_G2S::copy(sfx + int64_t(kt / 2) * mx_blocked::kAtomBytes, bar, shared.sf_x[stage],
                                     mx_blocked::kAtomBytes);
    };
  }

  // ---- consumer ------------------------------------------------------------------------------
  // Row (inside the tile) of value half v1 of this thread's A fragment: CuTe's ALayout_64x16,
  // rows 16 warp + lane / 4 (+ 8), plus the warpgroup's 64 rows in a cooperative tile.
  CUTLASS_DEVICE static int fragment_row(int thread_idx, int v1) {
    int const t = thread_idx % 128;
    return (kCooperative ? (thread_idx / 128) * 64 : 0) + (t / 32) * 16 + (t % 32) / 4 + 8 * v1;
  }

  // bf16x2 multiplier of block b (0, 1) of K-tile kt for a row whose atom word (4 codes of the
  // atom column) is `codes` and whose reference exponent is r: 2^(fix + e - r), NaN for code
  // 255, 0 past K (zero-filled bytes never meet a padding code).
  CUTLASS_DEVICE static uint32_t multiplier(uint32_t codes, int kt, int b, int r, int k_blocks) {
    constexpr int kFix = kE2m1 ? 126 : 120;  // the bit placement's 2^-126 / 2^-120
    int const block = kt * bf16_route::kBlocksPerTile + b;
    int const e = int((codes >> (8 * ((kt % 2) * 2 + b))) & 0xFFu);
    uint32_t bits = mx_detail::bf16_pow2_bits(kFix + e - r);
    bits = e == 255 ? 0x7FC0u : bits;
    bits = block < k_blocks ? bits : 0u;
    return bits | (bits << 16);
  }

  // This thread's A fragment of K-tile kt in `stage`, bf16 with the scales folded.
  template <class FragA>
  CUTLASS_DEVICE void convert(FragA& frag, TensorStorage& shared, int stage, int kt, int thread_idx,
                              Params const& params) const {
    using namespace cute;
    int const q = thread_idx % 4;
    uint8_t const* base = &shared.smem_A[stage * kTileM * kXBytesPerRow];
    CUTLASS_PRAGMA_UNROLL
    for (int v1 = 0; v1 < 2; ++v1) {
      int const r = fragment_row(thread_idx, v1);
      uint32_t const codes =
          *reinterpret_cast<uint32_t const*>(shared.sf_x[stage] + mx_blocked::atom_offset((tile_m_off_ + r) % 128));
      uint8_t const* row = base + r * kXBytesPerRow;
      uint32_t const swz = (cute::cast_smem_ptr_to_uint(row) >> 7) & kXSwizzleMask;
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < bf16_route::kBlocksPerTile; ++b) {
        uint32_t const mul_bits = multiplier(codes, kt, b, row_ref_[v1], params.k_blocks);
        __nv_bfloat162 const mul = reinterpret_cast<__nv_bfloat162 const&>(mul_bits);
        uint32_t pair[4];
        if constexpr (kE2m1) {
          // block b: 16 B chunk b; lane q's 8 codes are bytes 4q .. 4q+3 of it.
          uint32_t const w = *reinterpret_cast<uint32_t const*>(row + ((b ^ swz) << 4) + 4 * q);
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) pair[j] = mx_detail::e2m1_pair_to_bf16x2(w, j);
        } else {
          // block b: 16 B chunks 2b, 2b+1; lane q's 8 bytes are at 8q of the block.
          uint2 const w = *reinterpret_cast<uint2 const*>(row + (((2 * b + q / 2) ^ swz) << 4) + 8 * (q % 2));
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) pair[j] = mx_detail::e4m3_pair_to_bf16x2(w.x, w.y, j);
        }
        // register j = 2 kk + half of the block's two k16 steps; fragment registers of one k16
        // step: (row, lo k), (row + 8, lo k), (row, hi k), (row + 8, hi k).
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) {
          __nv_bfloat162 const v = __hmul2(reinterpret_cast<__nv_bfloat162 const&>(pair[j]), mul);
          auto regs = recast<uint32_t>(frag(_, 0, 2 * b + j / 2));
          regs(2 * (j % 2) + v1) = reinterpret_cast<uint32_t const&>(v);
        }
      }
    }
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared, Params const& params) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    Tensor sB = make_tensor(make_smem_ptr(shared.smem_B.data()), SmemLayoutB{});
    TiledMma tiled_mma;
    auto wg_mma = mx_detail::warpgroup_slice(tiled_mma, thread_idx);
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    auto thread_mma = tiled_mma.get_slice(thread_idx);
    auto a_fragment = [&]() {  // (MMA, MMA_M = 1, MMA_K = 4) registers
      return mx_detail::register_fragment_a<ElementA, kTileM, bf16_route::kTileK>(thread_mma);
    };
    auto fa0 = a_fragment();
    auto fa1 = a_fragment();
    static_assert(size<1>(decltype(fa0){}) == 1 && size<2>(decltype(fa0){}) == kKSteps, "unexpected A fragment");

    // The rows' reference exponents, from the fp32 2^(r - 127) the epilogue also reads (a
    // grouped tile's group's: whole bands of rows per group).
    float const* ref_x = params.ref_x;
    if constexpr (kGrouped) ref_x += int64_t(group_) * params.bands_x * mx_blocked::kAtomRows;
    CUTLASS_PRAGMA_UNROLL
    for (int v1 = 0; v1 < 2; ++v1)
      row_ref_[v1] = int(__float_as_uint(__ldg(ref_x + min(tile_row0_ + fragment_row(thread_idx, v1),
                                                        params.bands_x * mx_blocked::kAtomRows - 1))) >> 23);

    PipelineState smem_pipe_release = smem_pipe_read;
    int kt = 0;
    auto stage_in = [&](auto& frag) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      int const stage = smem_pipe_read.index();
      convert(frag, shared, stage, kt, thread_idx, params);
      ++kt;
      ++smem_pipe_read;
      return stage;
    };
    auto issue = [&](auto& frag, int stage) {
      warpgroup_fence_operand(frag);
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kKSteps; ++k) {
        cute::gemm(tiled_mma, frag(_, _, k), tCrB(_, _, k, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(accum);
    };
    auto release = [&]() {
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;  // the tile's first k16 step overwrites
    issue(fa0, stage_in(fa0));
    // Two K-tiles per trip: the next tile converts into the other buffer while this one's
    // wgmmas read theirs; wait<1> retires the one before.
    int k = 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tile_count; k += 2) {
      issue(fa1, stage_in(fa1));
      warpgroup_wait<1>();
      warpgroup_fence_operand(fa0);
      release();
      issue(fa0, stage_in(fa0));
      warpgroup_wait<1>();
      warpgroup_fence_operand(fa1);
      release();
    }
    if (k < k_tile_count) {
      issue(fa1, stage_in(fa1));
      warpgroup_wait<1>();
      release();
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(accum);
    release();
  }

  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}

  template <class BlockCoord>
  CUTLASS_DEVICE void set_tile(BlockCoord const& blk_coord) {
    tile_row0_ = int(cute::get<0>(blk_coord)) * kTileM;
    tile_m_off_ = kTileM < 128 ? tile_row0_ % 128 : 0;
    if constexpr (kGrouped) group_ = int(cute::get<3>(blk_coord));
  }

  // Grouped, the producer: the tile's group's rows of Y (scheduler::GroupedTile).
  template <class GroupedTile>
  CUTLASS_DEVICE void set_group_tile(GroupedTile const& tile) {
    static_assert(kGrouped, "set_group_tile: a grouped mainloop's");
    y_row0_ = tile.row_begin;
  }
  CUTLASS_DEVICE int group_row_begin() const { return y_row0_; }

 private:
  int tile_row0_ = 0;
  int tile_m_off_ = 0;
  int row_ref_[2] = {127, 127};
  int group_ = 0;   // grouped: the tile's group (consumers)
  int y_row0_ = 0;  // grouped: its group's first row of Y (producer)
};

}  // namespace persistent_gemm::collective
