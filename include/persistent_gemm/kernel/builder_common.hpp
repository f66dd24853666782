// What every builder shares around CUTLASS's collective builders.
#pragma once

#include <cstddef>
#include <type_traits>

#include "cutlass/gemm/collective/collective_builder.hpp"

#include "persistent_gemm/generated/arch_limits.hpp"

namespace persistent_gemm::kernel {

// The SM90 MX builders' stage count for kStages == 0 (they size their own stages: scale atoms
// and staging beside the operand tiles): as many stages of `stage_bytes` as fit in the opt-in
// shared memory beside the kernel's own 1 KB (barriers, ordering barriers, section padding) and
// `extra_bytes`, at most 16.
constexpr int sm90_mx_auto_stages(int stage_bytes, int extra_bytes = 0) {
  int const stages = (arch_limits::sm90a::kSmemBytes - 1024 - extra_bytes) / stage_bytes;
  return stages > 16 ? 16 : stages;
}

// The mainloop's stage count for a spec's kStages: 0 fills the shared memory left after
// CarveoutBytes (the epilogue's and the kernel's own), else exactly Stages.
template <int Stages, int CarveoutBytes>
using StageCountFor =
    std::conditional_t<Stages == 0, cutlass::gemm::collective::StageCountAutoCarveout<CarveoutBytes>,
                       cutlass::gemm::collective::StageCount<(Stages > 0 ? Stages : 2)>>;

// GemmArgs::workspace's parts start 256 bytes apart (the caller's buffer is 256 B aligned).
inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace persistent_gemm::kernel
