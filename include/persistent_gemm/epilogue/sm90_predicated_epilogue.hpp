// A shared-memory-free SM90 epilogue: every consumer thread scales its own accumulator
// fragment and writes it straight to global memory with per-element bounds predicates.
//
// Why it exists next to the TMA epilogue: a TMA store needs a 16-byte aligned base and leading
// dimension, so an output like (8191 x 8191) row-major cannot use it. This path needs nothing
// but element alignment, costs no shared memory (more mainloop stages), and implements every
// ScaleMode the TMA path does, so the dispatcher never has to refuse a problem for its D.
//
// It plugs into the kernel through CUTLASS's Sm90TmaWarpSpecializedAdapter, which supplies the
// (empty) load/store pipeline interface the warp-specialized kernels expect; this class is the
// per-tile operator the adapter calls.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/array.h"
#include "cutlass/numeric_conversion.h"

#include "persistent_gemm/registry.h"

namespace persistent_gemm::epilogue {

// D = alpha * scale * acc + beta * bias[n] in fp32, rounded once (bias: N elements of
// ElementD, nullptr for none; the dispatcher drops it when beta == 0, as addmm ignores the input).
//
// TransposeD: the kernel computes D^T (swap-AB: the weight is the MMA's A operand), so its
// element (m, n) is D's (n, m). Scales are indexed in the kernel's orientation (the dispatcher
// hands the weight's rowwise scale in as scale_a). Block32 (MX) scales were applied in the
// mainloop: nothing to do.
//
// Grouped (MoE experts, TransposeD): a tile's n counts its group's rows from the group's first
// (set_group_tile), which bound its stores; its row scale and bias are its group's
// (group_stride_scale_a floats and M elements after the previous group's).
template <class ElementD_, persistent_gemm::ScaleMode Scale, bool TransposeD = false, bool Grouped = false>
class Sm90PredicatedEpilogue {
  static_assert(Scale == ScaleMode::None || Scale == ScaleMode::Tensorwise || Scale == ScaleMode::Rowwise ||
                    Scale == ScaleMode::Block32,
                "Sm90PredicatedEpilogue: unknown scale mode");
  static_assert(!Grouped || TransposeD, "Sm90PredicatedEpilogue: grouped D is written transposed (a row per token)");

 public:
  using ElementD = ElementD_;
  using ElementC = void;  // no source operand: D = alpha * scale * (A @ B) + beta * bias
  using ElementOutput = ElementD;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using StrideD = cute::Stride<int64_t, cute::_1, int64_t>;  // row-major (M, N, L)
  using StrideC = StrideD;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;

  struct SharedStorage {};

  struct Arguments {
    ElementD* ptr_D = nullptr;
    int64_t ldd = 0;
    float const* scale_a = nullptr;  // Tensorwise: [0]; Rowwise: [m]
    float const* scale_b = nullptr;  // Tensorwise: [0]; Rowwise: [n]
    ElementD const* bias = nullptr;  // [n] of D (the kernel's [m] when TransposeD)
    float alpha = 1.0f, beta = 1.0f;
    int64_t group_stride_scale_a = 0;  // grouped: floats between two groups' row scales
  };

  struct Params {
    ElementD* ptr_D = nullptr;
    int64_t ldd = 0;
    float const* scale_a = nullptr;
    float const* scale_b = nullptr;
    ElementD const* bias = nullptr;
    float alpha = 1.0f, beta = 1.0f;
    // Adjacent accumulator columns may be written as one 2-element store only when every row
    // start keeps that alignment; decided once on the host.
    bool paired_stores = false;
    int64_t group_stride_scale_a = 0;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    constexpr int64_t pair_bytes = 2 * int64_t(sizeof(ElementD));
    bool const paired = !TransposeD && (args.ldd % 2 == 0) &&
                        (reinterpret_cast<uintptr_t>(args.ptr_D) % pair_bytes == 0);
    return {args.ptr_D, args.ldd, args.scale_a, args.scale_b, args.bias, args.alpha, args.beta, paired,
            args.group_stride_scale_a};
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto const n = TransposeD ? cute::get<0>(problem_shape) : cute::get<1>(problem_shape);
    bool ok = args.ptr_D != nullptr && args.ldd >= n;
    if constexpr (Scale == ScaleMode::Tensorwise || Scale == ScaleMode::Rowwise)
      ok = ok && args.scale_a != nullptr && args.scale_b != nullptr;
    return ok;
  }

  CUTLASS_HOST_DEVICE explicit Sm90PredicatedEpilogue(Params const& params, SharedStorage const& = {})
      : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() const { return false; }

  // Grouped: the next tile's group and rows (scheduler::GroupedTile), before its store.
  template <class GroupedTile>
  CUTLASS_DEVICE void set_group_tile(GroupedTile const& tile) {
    static_assert(Grouped, "set_group_tile: a grouped epilogue's");
    group_ = tile.group, row_begin_ = tile.row_begin, row_end_ = tile.row_end;
  }

  // Called once per output tile by every consumer thread (thread_idx within the TiledMma).
  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) const {
    using namespace cute;
    static_assert(is_static<FrgLayout>::value, "accumulator layout must be static");

    int const M = int(get<0>(problem_shape_mnkl));
    int N = int(get<1>(problem_shape_mnkl));
    auto const m_coord = get<0>(blk_coord_mnkl);
    auto const n_coord = get<1>(blk_coord_mnkl);
    float const* scale_a = params_.scale_a;
    float const* scale_b = params_.scale_b;
    ElementD const* bias = params_.bias;
    ElementD* base = params_.ptr_D;
    if constexpr (Grouped) {
      // The group's rows as the tile's whole N, from its first: D rows, token scales; its row
      // scales and bias row.
      N = row_end_ - row_begin_;
      base += int64_t(row_begin_) * params_.ldd;
      if (scale_b != nullptr) scale_b += row_begin_;
      if (scale_a != nullptr) scale_a += group_ * params_.group_stride_scale_a;
      if (bias != nullptr) bias += int64_t(group_) * M;
    }

    // Coordinates of every accumulator element this thread owns, from the MMA's own C partition,
    // so the mapping is right for any atom / warpgroup layout the builder picked.
    Tensor cD = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_mnk),
                           make_coord(m_coord, n_coord));                       // (BLK_M, BLK_N) -> (m, n)
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);      // (MMA, MMA_M, MMA_N)
    CUTE_STATIC_ASSERT_V(size(tCcD) == size(accumulators));
    static_assert(decltype(size(accumulators))::value % 2 == 0, "accumulator fragment must hold column pairs");

    // alpha folds into the per-tile scalar: one multiply per element either way.
    float tensor_scale = params_.alpha;
    if constexpr (Scale == ScaleMode::Tensorwise) tensor_scale *= __ldg(scale_a) * __ldg(scale_b);

    // Row / column scale with the bound check folded in (never reads past M or N).
    auto row_scale = [&](int m) CUTLASS_LAMBDA_FUNC_INLINE {
      if constexpr (Scale == ScaleMode::Rowwise) return m < M ? tensor_scale * __ldg(scale_a + m) : 0.0f;
      else return tensor_scale;
    };
    auto col_scale = [&](int n) CUTLASS_LAMBDA_FUNC_INLINE {
      if constexpr (Scale == ScaleMode::Rowwise) return n < N ? __ldg(scale_b + n) : 0.0f;
      else return 1.0f;
    };

    // The bias indexes D's columns: the kernel's n, or its m when it writes D transposed. A
    // null bias is a uniform branch; its loads are per element, L1-resident across the tile.
    float const beta = params_.beta;
    auto bias_at = [&](int m, int n) CUTLASS_LAMBDA_FUNC_INLINE {
      int const j = TransposeD ? m : n;
      return (bias != nullptr && j < (TransposeD ? M : N)) ? beta * float(bias[j]) : 0.0f;
    };

    cutlass::NumericConverter<ElementD, float, cutlass::FloatRoundStyle::round_to_nearest> convert;
    using Pair = cutlass::AlignedArray<ElementD, 2>;
    int64_t const ldd = params_.ldd;
    auto offset = [&](int m, int n) CUTLASS_LAMBDA_FUNC_INLINE {
      return TransposeD ? int64_t(n) * ldd + m : int64_t(m) * ldd + n;
    };

    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accumulators); i += 2) {
      // The identity tensor's offsets are static, so both coordinates and the adjacency test
      // below fold to constants plus the tile origin.
      auto const c0 = tCcD(i);
      auto const c1 = tCcD(i + 1);
      int const m0 = get<0>(c0), n0 = get<1>(c0);
      int const m1 = get<0>(c1), n1 = get<1>(c1);
      float const v0 = float(accumulators(i)) * row_scale(m0) * col_scale(n0) + bias_at(m0, n0);
      float const v1 = float(accumulators(i + 1)) * row_scale(m1) * col_scale(n1) + bias_at(m1, n1);
      bool const adjacent = (m1 == m0) && (n1 == n0 + 1);
      if (adjacent && params_.paired_stores && m0 < M && n1 < N) {
        Pair p;
        p[0] = convert(v0);
        p[1] = convert(v1);
        *reinterpret_cast<Pair*>(base + int64_t(m0) * ldd + n0) = p;
      } else {
        if (m0 < M && n0 < N) base[offset(m0, n0)] = convert(v0);
        if (m1 < M && n1 < N) base[offset(m1, n1)] = convert(v1);
      }
    }
  }

 private:
  Params params_;
  int group_ = 0, row_begin_ = 0, row_end_ = 0;  // grouped: the tile's (set_group_tile)
};

}  // namespace persistent_gemm::epilogue
