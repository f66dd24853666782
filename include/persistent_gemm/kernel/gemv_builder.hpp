// Sm90MxGemvBuilder<Spec>: the MX decode GEMV (kernel/sm90_mx_gemv.hpp) lowered by named spec,
// as every other kernel family is (builder_spec.hpp). Spec names OperandW (the weight's bytes:
// GemvWeightE4m3 / GemvWeightE2m1), OperandX (the activations: ActivationsE4m3 / ActivationsBf16),
// ElementD, kTokens (tokens per launch, whole n8 MMA tiles) and kGrouped (MoE experts). The kernel
// type is Sm90MxGemv<OperandW, OperandX, ElementD, kTokens, 1, kGrouped> itself.
#pragma once

#include "persistent_gemm/kernel/builder_spec.hpp"
#include "persistent_gemm/kernel/sm90_mx_gemv.hpp"

namespace persistent_gemm::kernel {

namespace gemv_detail {
// The checks run before the base class is named, so a missing member is reported by name.
template <class Spec>
struct CheckedSpec : Spec {
  PGEMM_SPEC_REQUIRE(Spec, OperandW, "the weight's bytes: GemvWeightE4m3 or GemvWeightE2m1");
  PGEMM_SPEC_REQUIRE(Spec, OperandX, "the activations: ActivationsE4m3 or ActivationsBf16");
  PGEMM_SPEC_REQUIRE(Spec, ElementD, "D's element");
  PGEMM_SPEC_REQUIRE(Spec, kTokens, "int: tokens per launch (8, 16, 32 or 64)");
  PGEMM_SPEC_REQUIRE(Spec, kGrouped, "bool: walks (expert, strip) items decided on the device (TileSchedule.grouped)");
};
}  // namespace gemv_detail

template <class Spec, class S = gemv_detail::CheckedSpec<Spec>>
struct Sm90MxGemvBuilder
    : Sm90MxGemv<typename S::OperandW, typename S::OperandX, typename S::ElementD, S::kTokens, 1, S::kGrouped> {};

}  // namespace persistent_gemm::kernel
