// The SM90 epilogue collectives the persistent GEMM composes, chosen by Sm90EpilogueSelector:
// the TMA-store epilogue with its fusion tree (alpha, the op's scales, bias) and the predicated
// one (sm90_predicated_epilogue.hpp) for what a TMA store cannot write. Kept apart from the
// builder (kernel/sm90_gemm_builder.hpp) so that every epilogue lives under epilogue/.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"

#include "persistent_gemm/epilogue/sm90_predicated_epilogue.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::epilogue {

using RowMajor = cutlass::layout::RowMajor;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;  // every compute node's rounding

// The epilogue as a visitor tree over the accumulator:
//   D = alpha * scale * acc + beta * bias[n]   (fp32, rounded once to ElementD)
// The bias is a row broadcast of D's type whose null pointer reads as 0 (no loads), so one
// kernel serves mm and addmm; alpha and beta are host scalars in the kernel parameters.
namespace fusion = cutlass::epilogue::fusion;

// A host scalar (alpha, beta), or with Count > 1 the product of several scalars / device pointers.
template <int Count = 1>
using ScalarNode = fusion::Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>, Count>;

template <class ElementD, class TileShape>
struct BiasTerm {  // beta * bias[n]
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, ElementD, float, cute::Stride<cute::_0, cute::_1, int64_t>, 1>;
  using Beta = ScalarNode<>;
  using type = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Beta, Bias>;
  static typename type::Arguments make(GemmArgs const& g) {
    typename Beta::Arguments beta{};
    beta.scalars[0] = g.beta;
    typename Bias::Arguments bias{};
    bias.ptr_row = static_cast<ElementD const*>(g.bias);
    return {beta, bias, {}};
  }
};

// scale * acc + beta * bias, where `Scaled` is the tree of scale * acc and `Factor` the node
// it is multiplied by last.
template <class ElementD, class TileShape, class Factor, class Scaled>
using MulAddBias = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float, kRound>,
                                   Factor, Scaled, typename BiasTerm<ElementD, TileShape>::type>;
using Scalars3 = ScalarNode<3>;

template <class ElementD, ScaleMode Scale, class TileShape>
struct TmaFusion;

// alpha * acc + beta * bias.
template <class ElementD, class TileShape>
struct TmaFusion<ElementD, ScaleMode::None, TileShape> {
  using Alpha = ScalarNode<>;
  using type = MulAddBias<ElementD, TileShape, Alpha, fusion::Sm90AccFetch>;
  static typename type::Arguments make(GemmArgs const& g) {
    typename Alpha::Arguments alpha{};
    alpha.scalars[0] = g.alpha;
    return {alpha, {}, BiasTerm<ElementD, TileShape>::make(g), {}};
  }
};

// (scale_a[0] * scale_b[0] * alpha) * acc + beta * bias: one scalar broadcast reducing two
// device pointers and a host value, read on the device per tile, so no host synchronisation.
template <class ElementD, class TileShape>
struct TmaFusion<ElementD, ScaleMode::Tensorwise, TileShape> {
  using type = MulAddBias<ElementD, TileShape, Scalars3, fusion::Sm90AccFetch>;
  static typename type::Arguments make(GemmArgs const& g) {
    typename Scalars3::Arguments s{};
    s.scalar_ptrs[0] = static_cast<float const*>(g.scale_a);
    s.scalar_ptrs[1] = static_cast<float const*>(g.scale_b);
    s.scalars[2] = g.alpha;
    return {s, {}, BiasTerm<ElementD, TileShape>::make(g), {}};
  }
};

// scale_a[m] * (scale_b[n] * alpha * acc) + beta * bias. Column broadcast for a (one value per
// row m), row broadcast for b. Alignment 1: the vectors have M and N entries, any M, N, all
// loads predicated.
template <class ElementD, class TileShape>
struct TmaFusion<ElementD, ScaleMode::Rowwise, TileShape> {
  using ColScale = fusion::Sm90ColBroadcast<0, TileShape, float, float, cute::Stride<cute::_1, cute::_0, int64_t>, 1>;
  using RowScale = fusion::Sm90RowBroadcast<0, TileShape, float, float, cute::Stride<cute::_0, cute::_1, int64_t>, 1>;
  using Alpha = ScalarNode<>;
  using AlphaAcc = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, Alpha,
                                   fusion::Sm90AccFetch>;
  using Inner = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, RowScale, AlphaAcc>;
  using type = MulAddBias<ElementD, TileShape, ColScale, Inner>;
  static typename type::Arguments make(GemmArgs const& g) {
    typename ColScale::Arguments col{};
    col.ptr_col = static_cast<float const*>(g.scale_a);
    typename RowScale::Arguments row{};
    row.ptr_row = static_cast<float const*>(g.scale_b);
    typename Alpha::Arguments alpha{};
    alpha.scalars[0] = g.alpha;
    return {col, {row, {alpha, {}, {}}, {}}, BiasTerm<ElementD, TileShape>::make(g), {}};
  }
};

// Epilogue selection, lazily: only the chosen collective is ever instantiated. TmaStore: CUTLASS's
// TMA warp-specialized epilogue over TmaFusion; otherwise Sm90PredicatedEpilogue.
template <bool TmaStore, class ElementD, class TileShape, class ClusterShape, bool Coop, ScaleMode Scale,
          bool TransposeD>
struct Sm90EpilogueSelector {
  static_assert(!TransposeD, "a transposed D is written by the predicated epilogue (TmaStore = false)");
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using Fusion = TmaFusion<ElementD, Scale, TileShape>;
  using Schedule = std::conditional_t<Coop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                      cutlass::epilogue::TmaWarpSpecialized>;
  using Collective = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, RowMajor, kAlignD, ElementD, RowMajor,
      kAlignD, Schedule, typename Fusion::type>::CollectiveOp;

  static typename Collective::Arguments make(GemmArgs const& g) {
    typename Collective::Arguments e{};
    e.thread = Fusion::make(g);
    e.ptr_C = nullptr;
    e.ptr_D = static_cast<ElementD*>(g.d);
    e.dD = cute::make_stride(int64_t(g.ldd), cute::_1{}, int64_t(0));
    return e;
  }
};

template <class ElementD, class TileShape, class ClusterShape, bool Coop, ScaleMode Scale, bool TransposeD>
struct Sm90EpilogueSelector<false, ElementD, TileShape, ClusterShape, Coop, Scale, TransposeD> {
  using Op = Sm90PredicatedEpilogue<ElementD, Scale, TransposeD>;
  using Collective = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Op>;

  static typename Collective::Arguments make(GemmArgs const& g) {
    return {static_cast<ElementD*>(g.d), int64_t(g.ldd), static_cast<float const*>(g.scale_a),
            static_cast<float const*>(g.scale_b), static_cast<ElementD const*>(g.bias), g.alpha, g.beta};
  }
};

}  // namespace persistent_gemm::epilogue
