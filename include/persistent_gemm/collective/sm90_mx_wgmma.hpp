// The wgmma operand setup both SM90 MX consumers (Sm90MxBlockScaledMma, Sm90MxBf16Mma) share.
#pragma once

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"

// The names both SM90 MX mainloops give their element, stride and dispatch types (the kernel and
// the builders read them as CollectiveMainloop::...): `Element` is what the tensor core multiplies
// (e4m3, or bf16 on the bf16 route); operands (rows, K, L) with K contiguous. A macro rather than
// a base: the mainloops' bodies use these names unqualified, which a dependent base would hide.
#define PGEMM_SM90_MX_MAINLOOP_TYPES(Element)            \
  struct DispatchPolicy {                                \
    using ClusterShape = ClusterShape_;                  \
    static constexpr int Stages = Stages_;               \
  };                                                     \
  using ClusterShape = ClusterShape_;                    \
  using ElementA = Element;                              \
  using ElementB = Element;                              \
  using ElementAccumulator = float;                      \
  using StrideA = cute::Stride<int64_t, cute::_1, int64_t>; \
  using StrideB = cute::Stride<int64_t, cute::_1, int64_t>

namespace persistent_gemm::collective::mx_detail {

// This thread's warpgroup's slice of a tiled wgmma: the index broadcast from lane 0, so the
// compiler knows it is warp-uniform.
template <class TiledMma>
CUTLASS_DEVICE auto warpgroup_slice(TiledMma const& tiled_mma, int thread_idx) {
  int const wg = __shfl_sync(0xFFFFFFFF, thread_idx / 128, 0);
  return tiled_mma.get_slice(wg * 128);
}

// An RS wgmma's A operand in registers, (MMA, MMA_M, MMA_K) over a TileM x TileK tile: shaped
// by a K-major 128 B swizzled smem layout that is never allocated (only its shape is read).
template <class ElementA, int TileM, int TileK, class ThreadMma>
CUTLASS_DEVICE auto register_fragment_a(ThreadMma const& thread_mma) {
  using namespace cute;
  auto dummy = make_tensor(make_smem_ptr(static_cast<ElementA*>(nullptr)),
                           tile_to_shape(GMMA::Layout_K_SW128_Atom<ElementA>{}, make_shape(Int<TileM>{}, Int<TileK>{})));
  return thread_mma.partition_fragment_A(dummy);
}

}  // namespace persistent_gemm::collective::mx_detail
