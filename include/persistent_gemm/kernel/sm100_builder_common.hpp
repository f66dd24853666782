// The half of an SM100 builder (Sm100Gemm, Sm100MxGemm) that does not depend on its operands:
// the operand strides its collectives declare, and the host entry points over its Kernel,
// make_arguments and can_implement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/device_kernel.h"

#include "persistent_gemm/kernel/sm100_launch.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::kernel {

template <class CollectiveMainloop, class CollectiveEpilogue>
struct Sm100Strides {
  using A = typename CollectiveMainloop::StrideA;
  using B = typename CollectiveMainloop::StrideB;
  using C = typename CollectiveEpilogue::StrideC;
  using D = typename CollectiveEpilogue::StrideD;
};

// The (row stride, 1, batch stride) of a 2-D operand whose second mode is contiguous (K-major
// A and B, row-major C and D); the batch stride is only nominal (L == 1).
template <class Stride>
Stride sm100_row_stride(int64_t ld, int64_t rows) {
  static_assert(cute::is_static_v<std::remove_cv_t<std::remove_reference_t<decltype(cute::get<1>(Stride{}))>>>,
                "K-major (N-contiguous) strides expected");
  Stride s{};
  cute::get<0>(s) = ld;
  cute::get<2>(s) = ld * rows;
  return s;
}

// CRTP base: Builder (complete when these are instantiated) supplies Kernel, make_arguments
// and can_implement.
template <class Builder>
struct Sm100Host {
  static void const* entry() { return reinterpret_cast<void const*>(&cutlass::device_kernel<typename Builder::Kernel>); }

  static size_t workspace_bytes(GemmArgs const&) { return 0; }  // no split-K here

  // D (row-major, ldd; no source C) and the persistent grid's knobs, alike in both builders.
  template <class Arguments>
  static void set_output(Arguments& args, GemmArgs const& g) {
    using Strides = typename Builder::Strides;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sm100_row_stride<typename Strides::C>(g.ldd, g.m);
    args.epilogue.ptr_D = static_cast<typename Builder::ElementD*>(g.d);
    args.epilogue.dD = sm100_row_stride<typename Strides::D>(g.ldd, g.m);
    args.sm_count = g.sm_count;
    args.max_workers = g.max_workers;
  }

  // Never throws; cudaErrorInvalidValue for a problem this instantiation cannot run.
  static cudaError_t run(GemmArgs const& g, cudaStream_t stream) noexcept {
    if (!Builder::can_implement(g)) return cudaErrorInvalidValue;
    return launch_sm100_persistent<typename Builder::Kernel>(entry(), Builder::make_arguments(g), stream);
  }
};

}  // namespace persistent_gemm::kernel
