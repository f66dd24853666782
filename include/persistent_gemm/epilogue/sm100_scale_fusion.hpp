// The SM100 epilogue's fusion for Sm100Gemm (kernel/sm100_gemm_builder.hpp): the op's scales on
// the fp32 accumulator, as a tree of CUTLASS's SM90 visitor nodes, which the SM100 TMA epilogue
// runs as its fusion callbacks; rounded once to ElementD. Bias / alpha / beta are not fused here
// (archs.py: sm100a fused_bias=False): the dispatcher applies them after the kernel. Kept apart
// from the builder so that every epilogue lives under epilogue/ (the SM90 tree:
// sm90_tma_fusion.hpp).
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"

#include "persistent_gemm/registry.h"

namespace persistent_gemm::epilogue::sm100 {

namespace fusion = cutlass::epilogue::fusion;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// The fusion for a scale mode: `type` for CUTLASS's epilogue builder, `set` to fill its
// arguments. CtaTile is the per-CTA tile (2-SM: half the MMA tile's rows), the tile CUTLASS's
// builder hands the callbacks.
template <class ElementD, ScaleMode Scale, class CtaTile>
struct ScaleFusion;

// D = acc: the builder's default linear combination (alpha 1, no C).
template <class ElementD, class CtaTile>
struct ScaleFusion<ElementD, ScaleMode::None, CtaTile> {
  using type = fusion::LinearCombination<ElementD, float, void, float>;
  template <class Thread>  // the callbacks' arguments (a tag has none of its own)
  static void set(Thread& t, GemmArgs const&) {
    t.alpha = 1.0f;
    t.beta = 0.0f;
  }
};

// D = (scale_a[0] * scale_b[0]) * acc: one scalar broadcast reducing two device pointers, read
// on the device, so no host synchronisation.
template <class ElementD, class CtaTile>
struct ScaleFusion<ElementD, ScaleMode::Tensorwise, CtaTile> {
  using Scalars = fusion::Sm90ScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int64_t>, 2>;
  using type = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>, Scalars,
                               fusion::Sm90AccFetch>;
  template <class Thread>
  static void set(Thread& t, GemmArgs const& g) {
    typename Scalars::Arguments s{};
    s.scalar_ptrs[0] = static_cast<float const*>(g.scale_a);
    s.scalar_ptrs[1] = static_cast<float const*>(g.scale_b);
    t = {s, {}, {}};
  }
};

// D = scale_a[m] * (scale_b[n] * acc): a column broadcast of a (one value per row m), a row
// broadcast of b. Alignment 1: the vectors have M and N entries, any M, N, loads predicated.
template <class ElementD, class CtaTile>
struct ScaleFusion<ElementD, ScaleMode::Rowwise, CtaTile> {
  using ColScale = fusion::Sm90ColBroadcast<0, CtaTile, float, float, cute::Stride<cute::_1, cute::_0, int64_t>, 1>;
  using RowScale = fusion::Sm90RowBroadcast<0, CtaTile, float, float, cute::Stride<cute::_0, cute::_1, int64_t>, 1>;
  using Inner = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, RowScale,
                                fusion::Sm90AccFetch>;
  using type = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>, ColScale, Inner>;
  template <class Thread>
  static void set(Thread& t, GemmArgs const& g) {
    typename ColScale::Arguments col{};
    col.ptr_col = static_cast<float const*>(g.scale_a);
    typename RowScale::Arguments row{};
    row.ptr_row = static_cast<float const*>(g.scale_b);
    t = {col, {row, {}, {}}, {}};
  }
};

}  // namespace persistent_gemm::epilogue::sm100
