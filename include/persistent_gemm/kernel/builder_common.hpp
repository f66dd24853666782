// What every builder shares around CUTLASS's collective builders.
#pragma once

#include <type_traits>

#include "cutlass/gemm/collective/collective_builder.hpp"

namespace persistent_gemm::kernel {

// The mainloop's stage count for a spec's kStages: 0 fills the shared memory left after
// CarveoutBytes (the epilogue's and the kernel's own), else exactly Stages.
template <int Stages, int CarveoutBytes>
using StageCountFor =
    std::conditional_t<Stages == 0, cutlass::gemm::collective::StageCountAutoCarveout<CarveoutBytes>,
                       cutlass::gemm::collective::StageCount<(Stages > 0 ? Stages : 2)>>;

}  // namespace persistent_gemm::kernel
