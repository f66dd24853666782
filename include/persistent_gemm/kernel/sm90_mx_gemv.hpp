// The MX decode kernel (SM90, M <= 64 tokens): a stream-K tensor-core GEMV for mxfp8_mm,
// fp8_fp4_mm and weight_only_mm. No wgmma and no per-32 wait: each 1x32 block is one K=32
// mma.sync whose fp32 result is scaled and added (FFMA) while the next block's mma is already
// issued. e4m3 activations (the MX ops): two f16 k16 mmas on operands widened once -- up to 16
// tokens, 32 for FP4 -- else one e4m3 k32. bf16 activations (weight-only): two bf16 k16 mmas on
// the weight converted to bf16 in registers, the activations read as they are.
//
//   persistent_gemm::kernel::Sm90MxGemv<OperandW, OperandX, ElementD, Tokens>::run(GemmArgs const&, stream)
//
// GemmArgs in the swap-AB orientation of the MX kernels: a = the weight, (N rows, K) e4m3 or
// packed e2m1, 16-byte aligned rows (prepare_weight's operand); scale_a its blocked e8m0 scales
// (128-row x 4-block atoms); b = the activations (M <= Tokens rows, K): e4m3 (ldb in bytes) with
// scale_b their e8m0 scales, read as they come: plain (M, ceil(K/32)) rows of ld_scale_b bytes,
// or blocked when ld_scale_b == 0; or bf16 (ldb in elements) without scales.
// d = D (M, N) row-major.
//
// Work: the weight's 128-row strips x 256-byte K chunks, dealt to one CTA per SM as contiguous
// strip-major ranges (scheduler/strip_stream_k.hpp). Roles per CTA:
//   warp 8      loads each unit's weight (two 128 B x 128-row TMA boxes, 128B-swizzled, L2
//               evict-first), its scale atoms (one bulk copy) and the tokens' activation rows
//               (TMA boxes of M rows) into a ring of stages; the first stages' weight before
//               the PDL wait.
//   warp 9      copies the unit's activation scales into the stage (plain or blocked, so no
//               relayout kernel runs per call), one unit ahead in registers; idle for bf16.
//   warps 0..7  16 weight rows each: per block, LDS the A fragment (e4m3 -> f16; e2m1 -> f16 x
//               2^-14 by bit placement, or -> e4m3 for the k32 mma; e4m3 / e2m1 -> bf16 by bit
//               placement and one HMUL2), the tokens' B fragment, mma into a temporary,
//               acc += temp * (s_x * s_w) (bf16 activations: temp * s_w).
// Strips shared by CTAs are reduced in fixed order through per-warp fp32 slots and nonce flags
// (no memset, bitwise reproducible); docs/design/mx_decode_gemv.md has the protocol.
//
// Grouped (MoE experts, pg.grouped_mm): the weight is E experts' (N, K) stacked (a 3-D TMA map,
// its scales group_stride_scale_a bytes apart), the activations all experts' rows, and each
// expert's rows, read on the device from offs, are cut into items of up to Tokens rows
// (scheduler/grouped_rows.hpp): the work is items x strips x chunks, dealt as above. Only the
// experts that have rows are streamed; an expert with more than Tokens rows streams its weight
// once per item.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"

#include "persistent_gemm/generated/arch_limits.hpp"
#include "persistent_gemm/collective/mx_block_scales.hpp"
#include "persistent_gemm/kernel/activation_tags.hpp"
#include "persistent_gemm/kernel/cluster_launch.hpp"
#include "persistent_gemm/kernel/split_nonce.hpp"
#include "persistent_gemm/registry.h"
#include "persistent_gemm/scheduler/grouped_rows.hpp"
#include "persistent_gemm/scheduler/strip_stream_k.hpp"

namespace persistent_gemm::kernel {

// The kernel-style tag of this family (catalogue kernel style "gemv"; KernelConfig.template_args'
// kernel_style), beside Cooperative / PingPong / Umma1Sm / Umma2Sm.
struct Gemv {};

// Weight operand tags of the decode kernel (what the weight's bytes are).
struct GemvWeightE4m3 {};
struct GemvWeightE2m1 {};

namespace gemv_detail {

constexpr int kStripRows = 128;     // one blocked-layout scale atom of rows
constexpr int kChunkBytes = 256;    // weight bytes per row per work unit
constexpr int kConsumerWarps = kStripRows / 16;
constexpr int kProducerWarp = kConsumerWarps, kScaleWarp = kConsumerWarps + 1;
constexpr int kThreads = (kConsumerWarps + 2) * 32;
constexpr int kSmemBytes = arch_limits::sm90a::kSmemBytes;  // SM90 opt-in dynamic shared memory per CTA
constexpr int kSmemPerSm = 233472;  // SM90 shared memory per SM; each resident CTA reserves 1 KB
constexpr int kMaxStages = 6;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PGEMM_GEMV_DEVICE 1
#endif

// By value: std::min's references would odr-use the constexpr members in device code.
CUTLASS_HOST_DEVICE constexpr int imin(int a, int b) { return a < b ? a : b; }

CUTLASS_DEVICE uint32_t smem_u32(void const* p) { return uint32_t(__cvta_generic_to_shared(p)); }

CUTLASS_DEVICE uint64_t evict_first_policy() {
  uint64_t policy = 0;
#ifdef PGEMM_GEMV_DEVICE
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// One 1-D bulk copy global -> shared with an L2 cache policy, completing `bytes` (a multiple of
// 16) on the mbarrier: the weight's scale atoms.
CUTLASS_DEVICE void bulk_g2s(void* dst, void const* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
#ifdef PGEMM_GEMV_DEVICE
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
      ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy) : "memory");
#endif
}

// D(16x8) += A(16x32 e4m3) . B(32x8 e4m3), fp32, starting from zero.
CUTLASS_DEVICE void mma_e4m3(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef PGEMM_GEMV_DEVICE
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
#endif
}

// Programmatic dependent launch (griddepcontrol): the kernel is launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, so it may start before the previous kernel
// on the stream has finished; nothing that kernel writes is read before wait_prerequisites().
CUTLASS_DEVICE void launch_dependents() {
#ifdef PGEMM_GEMV_DEVICE
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
CUTLASS_DEVICE void wait_prerequisites() {
#ifdef PGEMM_GEMV_DEVICE
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// D(16x8) = A(16x16) . B(16x8) + C, fp32, A and B f16 (kBf16 false) or bf16 (true): one asm
// statement for both, the macro spelling in the PTX type.
#define PGEMM_GEMV_MMA_M16N8K16(T)                                                                   \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
               "{%8,%9}, {%10,%11,%12,%13};"                                                          \
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                       \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]))
template <bool kBf16>
CUTLASS_DEVICE void mma_16bit(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                              uint32_t b1, float const (&c)[4]) {
#ifdef PGEMM_GEMV_DEVICE
  if constexpr (kBf16)
    PGEMM_GEMV_MMA_M16N8K16("bf16");
  else
    PGEMM_GEMV_MMA_M16N8K16("f16");
#endif
}
#undef PGEMM_GEMV_MMA_M16N8K16

// bf16x2 times 2^e (both halves), exactly where the product is a bf16: the bit placements of
// mx_detail (e2m1 x 2^-126, e4m3 x 2^-120) brought back to the values, subnormal 0.5 x 2^-126
// included (HFMA2.BF16 keeps subnormal inputs).
template <int E>
CUTLASS_DEVICE uint32_t bf16x2_times_pow2(uint32_t x) {
  static_assert(E > -127 && E < 128, "a normal bf16 power of two");
  uint32_t d = x;
#ifdef PGEMM_GEMV_DEVICE
  constexpr uint32_t kBits = uint32_t(E + 127) << 7;
  asm("{ .reg .b32 c; mov.b32 c, %2; mul.rn.bf16x2 %0, %1, c; }" : "=r"(d) : "r"(x), "n"(kBits | kBits << 16));
#endif
  return d;
}

// Two e4m3 (the low and high byte of `x`) -> f16x2, exactly (every e4m3 value is an f16).
CUTLASS_DEVICE uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t d = 0;
#ifdef PGEMM_GEMV_DEVICE
  asm("{ .reg .b16 lo; cvt.u16.u32 lo, %1; cvt.rn.f16x2.e4m3x2 %0, lo; }" : "=r"(d) : "r"(x));
#endif
  return d;
}

// Eight e2m1 codes (nibble i = K 8t + i) -> four f16x2 holding each code times 2^-14, exactly:
// the code's 3 magnitude bits placed at f16 bits 9..11 and its sign at 15 give e2m1 x 2^-14 for
// every code (subnormal 0.5 included), with no conversion instruction. Register j holds nibbles
// j and j + 4 (K 8t + j, 8t + j + 4): the activations are widened in the same K order.
CUTLASS_DEVICE void e2m1x8_to_f16x8_scaled(uint32_t q, uint32_t (&h)[4]) {
  constexpr uint32_t kSign = 0x80008000u, kMag = 0x0E000E00u;
  h[0] = ((q << 12) & kSign) | ((q << 9) & kMag);
  h[1] = ((q << 8) & kSign) | ((q << 5) & kMag);
  h[2] = ((q << 4) & kSign) | ((q << 1) & kMag);
  h[3] = (q & kSign) | ((q >> 3) & kMag);
}

// f16x2 times 2^7, exactly (every e4m3 value times 128 is a finite f16: 448 * 128 < 65504).
CUTLASS_DEVICE uint32_t f16x2_times_128(uint32_t x) {
  uint32_t d = x;
#ifdef PGEMM_GEMV_DEVICE
  asm("{ .reg .b32 c; mov.b32 c, 0x58005800; mul.rn.f16x2 %0, %1, c; }" : "=r"(d) : "r"(x));
#endif
  return d;
}

CUTLASS_DEVICE uint64_t ld_acquire(uint64_t const* p) {
  uint64_t v = 0;
#ifdef PGEMM_GEMV_DEVICE
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#endif
  return v;
}
CUTLASS_DEVICE void st_release(uint64_t* p, uint64_t v) {
#ifdef PGEMM_GEMV_DEVICE
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

}  // namespace gemv_detail

// CtasPerSm resident CTAs share an SM (each with its own ring): more consumer warps per
// scheduler to hide the per-block LDS -> convert -> mma -> FFMA latency, fewer stages each.
// The library instantiates 1 only. Two measured 10 % faster for FP4 at 8 tokens (H100 probe,
// benchmarks/results/issue21 at 7d1ac21) but fit only some token tiles (16-token FP4 rings do not fit half
// an SM; 32/64 tokens spill), and a worker count that differs between token tiles changes the
// stream-K split, so a token's bits would depend on the batch it came in (the test of
// batch-invariant results forbids it). The probe keeps the experiment runnable.
template <class OperandW, class OperandX, class ElementD, int Tokens, int CtasPerSm = 1, bool Grouped = false>
struct Sm90MxGemv {
  static constexpr bool kE2m1 = std::is_same_v<OperandW, GemvWeightE2m1>;
  static_assert(kE2m1 || std::is_same_v<OperandW, GemvWeightE4m3>, "OperandW: GemvWeightE4m3 or GemvWeightE2m1");
  static constexpr bool kBf16X = std::is_same_v<OperandX, ActivationsBf16>;
  static_assert(kBf16X || std::is_same_v<OperandX, ActivationsE4m3>, "OperandX: ActivationsE4m3 or ActivationsBf16 (activation_tags.hpp)");
  static constexpr int kXElemBytes = kBf16X ? 2 : 1;
  static_assert(Tokens == 8 || Tokens == 16 || Tokens == 32 || Tokens == 64,
                "MX decode kernel: Tokens must be 8, 16, 32 or 64 (whole n8 MMA tiles, at most 8)");
  static_assert(std::is_same_v<ElementD, cutlass::bfloat16_t> || std::is_same_v<ElementD, cutlass::half_t> ||
                    std::is_same_v<ElementD, float>,
                "MX decode kernel: D is bf16, fp16 or fp32");
  static_assert(CtasPerSm == 1 || CtasPerSm == 2, "MX decode kernel: CtasPerSm is 1 or 2");
  static constexpr int kCtasPerSm = CtasPerSm;
  static constexpr bool kGrouped = Grouped;
  static_assert(!Grouped || CtasPerSm == 1, "MX decode kernel: the grouped walk runs one CTA per SM");
  using GroupTable = scheduler::GroupTable;
  static constexpr int kTableBytes = Grouped ? int(sizeof(GroupTable) + 15) / 16 * 16 : 0;
  static constexpr int kSmemBudget =
      CtasPerSm == 1 ? gemv_detail::kSmemBytes : gemv_detail::kSmemPerSm / CtasPerSm - 1024;
  using Schedule = scheduler::StripStreamK;
  static constexpr int kNTiles = Tokens / 8;
  static constexpr int kChunkK = kE2m1 ? 2 * gemv_detail::kChunkBytes : gemv_detail::kChunkBytes;
  static constexpr int kBlocks = kChunkK / 32;  // 1x32 scale blocks per unit: 8 (e4m3), 16 (e2m1)
  static constexpr int kAtoms = kBlocks / 4;    // blocked-layout atoms per unit
  // A stage: the unit's weight as two 128 B x 128-row TMA boxes, the activations as
  // kXBoxes 128 B x Tokens-row boxes (128B swizzle: 16-byte chunk c of row r sits at c ^ r % 8,
  // so the fragment loads below hit distinct banks), the weight's scale atoms, the activation
  // scales widened to fp32 [block][token] (none for bf16 activations).
  static constexpr int kBox = 128;
  static constexpr int kWBytes = 2 * kBox * gemv_detail::kStripRows;
  static constexpr int kXChunkBytes = kChunkK * kXElemBytes;  // one token's activations per unit
  static constexpr int kXBoxes = kXChunkBytes / kBox;
  static constexpr int kXBox = kBox * Tokens;
  static constexpr int kXBytes = kXBoxes * kXBox;
  static constexpr int kSBytes = kAtoms * 512;
  static constexpr int kXSBytes = kBf16X ? 0 : kBlocks * Tokens * 4;
  static constexpr int kStageBytes = (kWBytes + kXBytes + kSBytes + kXSBytes + 1023) / 1024 * 1024;
  // Outside the ring, converted once per unit by the consumers instead of once per mma (SM90 runs
  // an e4m3 mma.sync as f16 HMMAs behind per-operand conversions): each warp's weight scales in
  // fp32 [row][block], and for up to 16 tokens (32 for FP4) the activations in f16 (two buffers, unit parity;
  // rows padded by 64 B so a quarter-warp's LDS.128 of two tokens hits distinct banks).
  static constexpr int kWsfBytes = gemv_detail::kConsumerWarps * 16 * kBlocks * 4;
  // FP4 widens 32 tokens too: its f16 path (bit-placed weights, no F2FP) is what makes it fast,
  // and two stages of 32 KB still fit beside the buffers. 64 tokens would leave one stage.
  static constexpr bool kHalfX = !kBf16X && (Tokens <= 16 || (kE2m1 && Tokens <= 32));
  static constexpr int kX16Row = 2 * kChunkK + 64;
  static constexpr int kX16Bytes = kHalfX ? 2 * Tokens * kX16Row : 0;
  static constexpr int kStages = gemv_detail::imin(
      gemv_detail::kMaxStages,
      (kSmemBudget - 1024 - 2 * gemv_detail::kMaxStages * 8 - kWsfBytes - kX16Bytes - kTableBytes) / kStageBytes);
  static_assert(kStages >= 2, "MX decode kernel: fewer than two stages fit in shared memory");
  // The full barrier's arrivals: the producer's expect-tx, and the scale warp's lanes where
  // there are activation scales to widen.
  static constexpr int kFullArrivals = 1 + (kBf16X ? 0 : 32);
  // Blocks unrolled together in a unit: all of them (the loads of later blocks issue early), but
  // 64 bf16 tokens hold 8 B fragments of 4 registers each, and a whole unit of them spills.
  static constexpr int kBlockUnroll = kBf16X && Tokens == 64 ? (kE2m1 ? 4 : 2) : kBlocks;
  static constexpr int SharedStorageSize =
      kStages * kStageBytes + kWsfBytes + kX16Bytes + 2 * kStages * 8 + kTableBytes + 1024;  // + alignment slack
  static_assert(SharedStorageSize <= kSmemBudget, "MX decode kernel: shared storage over the per-CTA budget");

  struct Params {
    CUtensorMap w_map;       // the weight (n, K) rows of bytes, 128 B x 128-row boxes
    CUtensorMap x_map;       // the activations (m, K) e4m3 or bf16 as bytes, 128 B x m-row boxes
    uint8_t const* w_scale;  // blocked
    uint8_t const* x_scale;  // plain rows ld_x_scale bytes apart, or blocked (ld_x_scale == 0); bf16: none
    int64_t ld_x_scale;
    ElementD* d;
    int64_t ldd;
    ElementD const* bias;
    float alpha, beta;
    int32_t n, m, k, k_blocks, k_atoms;
    Schedule sched;
    uint64_t* flags;  // [worker][consumer warp]
    float* slots;     // [worker][consumer warp][kNTiles * 4][32]
    uint64_t nonce;
    // Grouped: where each expert's rows are, and the bytes between experts' scales. sched then
    // holds one expert's strips; the device multiplies them by the items it finds.
    scheduler::GroupRows groups;
    int64_t w_scale_group_stride;
  };

  // One work unit as every role reads it: its global strip (the reduction's key), the strip in
  // its expert's weight, its K chunk, and the expert's rows it multiplies (dense: all m tokens).
  struct Unit {
    int32_t gs, strip, chunk, group, row0, rows;
  };

  // ---- host ------------------------------------------------------------------------------
  static Schedule schedule(GemmArgs const& g) {
    int32_t const strips = (g.m + gemv_detail::kStripRows - 1) / gemv_detail::kStripRows;
    int32_t const row_bytes = kE2m1 ? g.k / 2 : g.k;
    int32_t const chunks = (row_bytes + gemv_detail::kChunkBytes - 1) / gemv_detail::kChunkBytes;
    int32_t const slots = g.sm_count * CtasPerSm;
    int32_t const sms = g.max_workers > 0 ? std::min(g.max_workers, slots) : slots;
    // Grouped: the items are known on the device only, so every SM gets a worker.
    if constexpr (Grouped) return {strips, chunks, std::max(sms, 1)};
    return {strips, chunks, Schedule::workers_for(strips, chunks, std::max(sms, 1))};
  }

  static size_t workspace_bytes(GemmArgs const& g) {
    if (g.m < 1 || g.k < 1) return 0;
    Schedule const s = schedule(g);
    size_t const per_worker = gemv_detail::kConsumerWarps * (8 + size_t(kNTiles) * 4 * 32 * 4);
    return (size_t(s.workers) * per_worker + 255) / 256 * 256;
  }

  // Bulk copies need 16-byte aligned sources and sizes: aligned bases and row strides, K % 32
  // (whole scale blocks; 16-byte rows of packed e2m1). bf16 activations: ldb in elements, no
  // scale_b.
  static bool can_implement(GemmArgs const& g) {
    if (g.scale_mode != ScaleMode::Block32 || g.m < 1 || g.n < 1 || g.k < 32 || g.k % 32) return false;
    if (Grouped ? (g.groups < 1 || g.groups > scheduler::kMaxGroups || !g.group_rows || g.group_rows_ld < 0 ||
                   (!kBf16X && g.ld_scale_b <= 0) || int64_t(g.groups) * g.group_rows_ld > g.n)
                : (g.groups != 0 || g.n > Tokens))
      return false;
    if (!g.a || !g.b || !g.d || !g.scale_a || (!kBf16X && !g.scale_b) || g.sm_count < 1) return false;
    if (!aligned16(g.a) || !aligned16(g.b) || !aligned16(g.scale_a)) return false;
    if (g.lda % 16 || (g.ldb * kXElemBytes) % 16 || g.lda < (kE2m1 ? g.k / 2 : g.k) || (g.n > 1 && g.ldb < g.k))
      return false;
    if (g.ldd < g.m || (!kBf16X && g.ld_scale_b != 0 && g.n > 1 && g.ld_scale_b < (g.k + 31) / 32)) return false;
    return g.workspace_bytes >= workspace_bytes(g) && (g.workspace || workspace_bytes(g) == 0);
  }

  static Params make_params(GemmArgs const& g) {
    Params p{};
    p.w_scale = static_cast<uint8_t const*>(g.scale_a);
    p.x_scale = static_cast<uint8_t const*>(g.scale_b);
    p.ld_x_scale = g.ld_scale_b;
    p.d = static_cast<ElementD*>(g.d);
    p.ldd = g.ldd;
    p.bias = static_cast<ElementD const*>(g.bias);
    p.alpha = g.alpha;
    p.beta = g.beta;
    p.n = g.m;  // the weight's rows (grouped: one expert's)
    p.m = Grouped ? std::min(g.n, Tokens) : g.n;  // tokens (grouped: an item's most, the activation box's rows)
    p.k = g.k;
    p.k_blocks = g.k / 32;
    p.k_atoms = (p.k_blocks + 3) / 4;
    p.sched = schedule(g);
    p.flags = static_cast<uint64_t*>(g.workspace);
    p.slots = reinterpret_cast<float*>(p.flags + size_t(p.sched.workers) * gemv_detail::kConsumerWarps);
    p.nonce = next_split_nonce();
    if constexpr (Grouped) {
      p.groups = {g.group_rows, g.groups, g.n, g.group_rows_ld};
      p.w_scale_group_stride = g.group_stride_scale_a;
    }
    return p;
  }

  // A map of (groups, rows, cols) bytes, rows `ld` bytes apart and groups `group_ld` (0: a 2-D
  // map of one group), boxes of 128 B x box_rows (x 1 group), 128B swizzle.
  static bool encode(CUtensorMap& map, void const* base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                     int64_t groups = 1, int64_t group_ld = 0) {
    cuuint64_t const dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(groups)};
    cuuint64_t const strides[2] = {cuuint64_t(rows > 1 ? ld : (cols + 15) / 16 * 16), cuuint64_t(group_ld)};
    cuuint32_t const box[3] = {cuuint32_t(kBox), cuuint32_t(box_rows), 1};
    cuuint32_t const unit[3] = {1, 1, 1};
    CUresult const r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
        &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, group_ld > 0 ? 3 : 2, const_cast<void*>(base), dims, strides, box, unit,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
  }

  static cudaError_t run(GemmArgs const& g, cudaStream_t stream) noexcept;

  // ---- device ----------------------------------------------------------------------------
  CUTLASS_DEVICE static void kernel_body(Params const& p, uint8_t* smem);
  CUTLASS_DEVICE static Unit unit(Params const& p, Schedule const& sched, GroupTable const* table, int64_t u);
  CUTLASS_DEVICE static void producer(Params const& p, Schedule const& sched, GroupTable const* table, uint8_t* smem,
                                      uint64_t* full, uint64_t* empty);
  CUTLASS_DEVICE static void scale_loader(Params const& p, Schedule const& sched, GroupTable const* table,
                                          uint8_t* smem, uint64_t* full, uint64_t* empty);
  CUTLASS_DEVICE static void consumer(Params const& p, Schedule const& sched, GroupTable const* table, uint8_t* smem,
                                      uint64_t* full, uint64_t* empty);
};

template <class Kernel>
__global__ void __launch_bounds__(gemv_detail::kThreads, Kernel::kCtasPerSm)
    sm90_mx_gemv_kernel(__grid_constant__ typename Kernel::Params const p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // 128B-swizzled TMA boxes need 1024-byte aligned destinations. Offsetting the shared array
  // (not a round trip through an integer) keeps every access an LDS: the compiler must still see
  // the shared window.
  uint32_t const misalign = gemv_detail::smem_u32(smem_raw) % 1024;
  uint8_t* smem = smem_raw + (misalign ? 1024 - misalign : 0);
  Kernel::kernel_body(p, smem);
}

}  // namespace persistent_gemm::kernel

#include "persistent_gemm/kernel/sm90_mx_gemv_impl.hpp"
