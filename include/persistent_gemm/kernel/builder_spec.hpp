// The named spec every kernel builder takes as its one template argument:
//
//   struct Spec {                       // written by codegen (python/persistent_gemm/codegen.py)
//     using ElementD = cutlass::bfloat16_t;
//     using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
//     ...
//     static constexpr int kStages = 0;
//   };
//   using Gemm = persistent_gemm::kernel::Sm90MxGemm<Spec>;
//
// Members are read by name, so a lowering cannot swap two of them by position. A detector per
// member name (spec::has_<Name>) lets a builder say which member is missing before it reads it:
// PGEMM_SPEC_REQUIRE(Spec, Name, "what it is") is a static_assert naming the member.
#pragma once

#include <type_traits>

namespace persistent_gemm::kernel::spec {

#define PGEMM_SPEC_TYPE(Name)                                                      \
  template <class S, class = void>                                                 \
  struct has_##Name : std::false_type {};                                          \
  template <class S>                                                               \
  struct has_##Name<S, std::void_t<typename S::Name>> : std::true_type {};
#define PGEMM_SPEC_VALUE(Name)                                                     \
  template <class S, class = void>                                                 \
  struct has_##Name : std::false_type {};                                          \
  template <class S>                                                               \
  struct has_##Name<S, std::void_t<decltype(S::Name)>> : std::true_type {};

PGEMM_SPEC_TYPE(ElementA)
PGEMM_SPEC_TYPE(ElementB)
PGEMM_SPEC_TYPE(ElementD)
PGEMM_SPEC_TYPE(OperandX)
PGEMM_SPEC_TYPE(OperandA)
PGEMM_SPEC_TYPE(OperandW)
PGEMM_SPEC_TYPE(TileShape)
PGEMM_SPEC_TYPE(ClusterShape)
PGEMM_SPEC_TYPE(ScheduleTag)
PGEMM_SPEC_TYPE(KernelStyle)
PGEMM_SPEC_TYPE(Accumulation)
PGEMM_SPEC_VALUE(kAKMajor)
PGEMM_SPEC_VALUE(kBKMajor)
PGEMM_SPEC_VALUE(kStages)
PGEMM_SPEC_VALUE(kScale)
PGEMM_SPEC_VALUE(kTmaStore)
PGEMM_SPEC_VALUE(kSwapAB)
PGEMM_SPEC_VALUE(kTokens)
PGEMM_SPEC_VALUE(kGrouped)

#undef PGEMM_SPEC_TYPE
#undef PGEMM_SPEC_VALUE

// The schedule and pipeline members every builder reads.
template <class S>
constexpr bool has_schedule = has_TileShape<S>::value && has_ClusterShape<S>::value && has_ScheduleTag<S>::value &&
                              has_KernelStyle<S>::value && has_kStages<S>::value;

}  // namespace persistent_gemm::kernel::spec

#define PGEMM_SPEC_REQUIRE(Spec, Name, what) \
  static_assert(::persistent_gemm::kernel::spec::has_##Name<Spec>::value, "the builder's Spec has no " #Name ": " what)

// Members a builder declares from its Spec, under the names its body uses: a macro, because a
// dependent base's members are not found by unqualified lookup in the builder's body.
// The schedule and pipeline members every builder but the GEMV reads:
#define PGEMM_SPEC_SCHEDULE_MEMBERS(Spec)                                                                     \
  static_assert(::persistent_gemm::kernel::spec::has_schedule<Spec>,                                          \
                "the builder's Spec needs TileShape, ClusterShape, ScheduleTag, KernelStyle and kStages (the " \
                "schedule and pipeline members codegen writes for every kernel)");                            \
  using TileShape = typename Spec::TileShape;                                                                 \
  using ClusterShape = typename Spec::ClusterShape;                                                           \
  using ScheduleTag = typename Spec::ScheduleTag;                                                             \
  using Style = typename Spec::KernelStyle;                                                                   \
  static constexpr int Stages = Spec::kStages
// The operands of the dense builders (Sm90Gemm, Sm100Gemm):
#define PGEMM_SPEC_OPERAND_MEMBERS(Spec)                                                               \
  PGEMM_SPEC_REQUIRE(Spec, ElementA, "the A operand's element (cutlass::bfloat16_t, half_t or float_e4m3_t)"); \
  PGEMM_SPEC_REQUIRE(Spec, ElementB, "the B operand's element");                                       \
  PGEMM_SPEC_REQUIRE(Spec, kAKMajor, "bool: A (M,K) row-major");                                       \
  PGEMM_SPEC_REQUIRE(Spec, kBKMajor, "bool: B (K,N) column-major");                                    \
  using ElementA = typename Spec::ElementA;                                                            \
  using ElementB = typename Spec::ElementB;                                                            \
  static constexpr bool AKMajor = Spec::kAKMajor, BKMajor = Spec::kBKMajor
// The SM90 MX builders' X operand (Sm90MxGemm, Sm90MxBf16Gemm) and their consumer layout:
#define PGEMM_SPEC_SM90_MX_MEMBERS(Spec, x_what)                          \
  PGEMM_SPEC_REQUIRE(Spec, OperandX, x_what);                             \
  using OperandX = typename Spec::OperandX;                               \
  static constexpr bool kCooperative = std::is_same_v<Style, Cooperative>
// D's element, which every builder reads:
#define PGEMM_SPEC_OUTPUT_MEMBERS(Spec)             \
  PGEMM_SPEC_REQUIRE(Spec, ElementD, "D's element"); \
  using ElementD = typename Spec::ElementD
