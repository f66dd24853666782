// The boundary between the dispatch module (_C) and the per-arch kernel modules (_C_sm90a,
// _C_sm100a). Plain C++ and C types only: the two sides are separate shared objects, built by
// different compilers, and meet through a versioned table handed over in a PyCapsule.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace persistent_gemm {

// Bumped whenever GemmArgs, KernelEntry or KernelTable change layout; a mismatch refuses to register.
constexpr int kRegistryAbiVersion = 16;

enum class DType : int32_t { BF16 = 0, FP16 = 1, FP32 = 2, E4M3 = 3, E8M0 = 4, E2M1 = 5 };

// How scale_a / scale_b (fp32) multiply the accumulator in the epilogue.
enum class ScaleMode : int32_t {
  None = 0,       // plain mm
  Tensorwise = 1, // scale_a[0] * scale_b[0]
  Rowwise = 2,    // scale_a[m] * scale_b[n]
  Block32 = 3,    // e8m0 per 1x32 block along K, applied in the mainloop (MX formats)
};

// One GEMM D(M,N) = A(M,K) @ B(K,N), D row-major. Element strides; every extent >= 1.
struct GemmArgs {
  int32_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;         // stride of the non-unit dimension of A
  bool a_k_major = true;   // A row-major (K contiguous); else column-major (M contiguous)
  const void* b = nullptr;
  int64_t ldb = 0;
  bool b_k_major = true;   // B column-major (K contiguous); else row-major (N contiguous)
  void* d = nullptr;
  int64_t ldd = 0;
  // D's columns [N, ldd) are the caller's scratch. A TMA store writes whole 16-byte chunks at
  // the N edge, so without this a TMA-store kernel refuses an N whose row bytes are not a
  // multiple of 16 (it would overwrite the caller's data there).
  bool d_pad_writable = false;
  const void* scale_a = nullptr;  // fp32 for Tensorwise/Rowwise, e8m0 (M, ceil(K/32)) for Block32
  const void* scale_b = nullptr;  // fp32 for Tensorwise/Rowwise, e8m0 (N, ceil(K/32)) for Block32
  // Block32 scales are blocked (128 x 4 atoms) except where a kernel reads plain rows: then these
  // are their row strides in bytes (the Gemv style's activation scales; 0: blocked).
  int64_t ld_scale_a = 0, ld_scale_b = 0;
  ScaleMode scale_mode = ScaleMode::None;
  int32_t sm_count = 0;     // multiprocessors of the device (persistent grid size)
  int32_t max_workers = 0;  // 0: fill the GPU
  // Split-K kernels: KernelEntry::workspace(args) bytes, 256 B aligned, owned by the caller for
  // the launch (the kernel zeroes what must start zeroed, on the launch stream).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Epilogue: D = alpha * scale * (A @ B) + beta * bias[n], in fp32, rounded once. bias has N
  // elements of D's type (nullptr: none) and indexes D's columns (a swap-AB kernel's rows).
  // Only kernels whose entry says fused_bias read these; the dispatcher never hands the others
  // a bias or alpha != 1.
  const void* bias = nullptr;
  float alpha = 1.0f, beta = 1.0f;
  // Grouped GEMMs (MoE experts; kernels whose geometry says grouped): `groups` problems sharing
  // N and K (in the kernel's swap-AB orientation: weight rows m, K), the weight of group e
  // `group_stride_a` bytes after group e-1's and its blocked scales `group_stride_scale_a` bytes
  // after. The activation rows of each group are read on the device from `group_rows`:
  // torch._grouped_mm's offs (cumulative row ends over the n rows, group_rows_ld == 0), or the
  // masked form's row counts, group e's rows starting at row e * group_rows_ld. D has a row per
  // activation row; bias then holds groups x m elements (one row per group).
  int32_t groups = 0;
  const int32_t* group_rows = nullptr;
  int64_t group_rows_ld = 0;
  int64_t group_stride_a = 0, group_stride_scale_a = 0;
};

// One plain -> blocked scale conversion (KernelTable::scale_to_blocked).
struct ScaleRelayout {
  const uint8_t* src = nullptr;
  int64_t rows = 0, blocks = 0, ld = 0;
  uint8_t* dst = nullptr;  // (ceil(rows/128) * ceil(blocks/4)) atoms of 512 bytes
};

// One MXFP8 (or rowwise e4m3) quantization (KernelTable::quantize_mxfp8): x (rows, K), row stride ldx elements,
// of x_dtype (BF16, FP16 or FP32) -> e4m3 data (rows, K), row stride ldd bytes, and e8m0 codes
// (rows, ceil(K/32)), row stride ld_scale bytes. quant.py's quantize_mxfp8, bit for bit.
struct QuantizeJob {
  const void* x = nullptr;
  DType x_dtype = DType::BF16;
  int64_t rows = 0, k = 0, ldx = 0;
  uint8_t* data = nullptr;
  int64_t ldd = 0;
  uint8_t* scale = nullptr;
  int64_t ld_scale = 0;
  bool rceil = false;  // the shared-exponent rule: false OCP floor, true round-up
  // Rowwise e4m3 instead (the fp8_rowwise Linear's activations): one float32 scale per row,
  // scale[row] = max(amax(|x_row|), 1e-12) / 448, data = clamp(x / scale, +-448) in e4m3 --
  // persistent_gemm.nn's _rowwise_e4m3, bit for bit; `scale` then points at rows floats.
  bool rowwise = false;
};

// One MX dequantization to bf16 (KernelTable::dequantize_mx): (rows, K) e4m3 data (row stride
// ld bytes) or packed e2m1 (ld bytes per row of K/2), plain e8m0 scales (rows, ceil(K/32)) of
// row stride ld_scale bytes -> bf16 (rows, K), row stride ldo elements; 2^(code - 127), code
// 255 NaN, rounded to nearest once. The "dequantize, then torch.mm" baseline of the benchmarks.
struct DequantizeJob {
  const uint8_t* data = nullptr;
  bool e2m1 = false;
  int64_t rows = 0, k = 0, ld = 0;
  const uint8_t* scale = nullptr;
  int64_t ld_scale = 0;
  void* out = nullptr;
  int64_t ldo = 0;
};

// MoE routing on the device (host/moe_routing.cuh; the ops of csrc/moe_routing.cpp).
// moe_dispatch's most experts: its counts table (experts x at least one warp, int32) in 46 KB of
// static shared memory.
constexpr int32_t kMoeMaxExperts = 11776;
// One byte matrix gathered by moe_dispatch: dst row slot_rows[s] = src row s / top_k.
struct MoeGather {
  const void* src = nullptr;
  int64_t ld_src = 0;  // bytes
  void* dst = nullptr; // rows of row_bytes, back to back
  int64_t row_bytes = 0;
};

// KernelTable::moe_dispatch: router_indices (tokens, top_k) int32 or int64, contiguous; slot
// s = t * top_k + j. The slots sorted stably by expert: offs (experts,) int32 cumulative row
// ends, slot_rows (tokens * top_k,) int32 the sorted row of each slot, and up to two matrices
// gathered into that order. An index outside [0, experts) prints its slot and fails the launch.
struct MoeDispatchJob {
  const void* indices = nullptr;
  bool indices_64 = false;
  int64_t tokens = 0;
  int32_t top_k = 0, experts = 0;
  int32_t* offs = nullptr;
  int32_t* slot_rows = nullptr;
  MoeGather gather[2];
  int32_t gathers = 0;
  int32_t sm_count = 0;
};

// KernelTable::moe_combine: out[t] = sum over j = 0 .. top_k - 1, in order, of
// float(weights[t][j]) * float(y[slot_rows[t * top_k + j]]), in fp32, rounded once.
// Element strides; y BF16 / FP16 / FP32, weights and out BF16 / FP16 / FP32.
struct MoeCombineJob {
  const void* y = nullptr;
  DType y_dtype = DType::BF16;
  int64_t ld_y = 0;
  const int32_t* slot_rows = nullptr;
  const void* weights = nullptr;
  DType w_dtype = DType::FP32;
  int64_t ld_w = 0;
  void* out = nullptr;
  DType out_dtype = DType::BF16;
  int64_t ld_out = 0;
  int64_t tokens = 0, top_k = 0, d = 0;
  int64_t y_rows = 0;  // a slot_rows entry outside [0, y_rows) prints its slot and fails the launch
};

// KernelTable::moe_activation: h (rows, 2 * inter), gate columns [0, inter), up [inter, 2 inter)
// -> out (rows, inter) in fp32, rounded once: SiLU(gate) * up, or gpt-oss's clamped SwiGLU
// (gate <= limit, |up| <= limit, (up + 1) * gate * sigmoid(alpha * gate)). Element strides.
struct MoeActivationJob {
  const void* h = nullptr;
  DType h_dtype = DType::BF16;
  int64_t ld_h = 0;
  void* out = nullptr;
  DType out_dtype = DType::BF16;
  int64_t ld_out = 0;
  int64_t rows = 0, inter = 0;
  bool gpt_oss = false;
  float alpha = 0.0f, limit = 0.0f;
};

// The kernel style of a config (kernel_config.py's `kernel`).
// Gemv: the MX decode kernel (kernel/sm90_mx_gemv.hpp), stream-K over 128-row weight strips; it
// reads the activations' e8m0 scales as they come (plain rows of GemmArgs::ld_scale_b bytes).
enum class KernelStyle : int32_t { Cooperative = 0, PingPong = 1, Umma1Sm = 2, Umma2Sm = 3, Gemv = 4 };

// MX mainloop routes (config_fields.py MX_ROUTES).
enum class MxRoute : int32_t {
  // FP8 wgmma per 32-K block into a temporary, promoted with both scales (FMUL + FFMA per element).
  Promote,
  // swap_ab: both block scales folded into bf16 operands by the kernel (the weight) and its
  // pre-pass (the activations, into GemmArgs::workspace); bf16 wgmma, fp32 accumulation over the
  // whole K. It reads the activations' scales blocked or plain (GemmArgs::ld_scale_b), the weight's blocked.
  Bf16,
  // FP8 x FP4, swap_ab: Promote with the weight's scale folded into its e4m3 conversion per
  // 16-row strip and block (one FFMA per element per block); exact for every weight.
  Fold,
};

// A config's geometry, written by codegen beside the name so the dispatcher's cost model never
// parses names on the hot path.
struct KernelGeometry {
  int32_t tile_m, tile_n, tile_k;  // the tile one CTA owns (2-SM UMMA: half the MMA tile's M)
  int32_t cluster_m, cluster_n;
  KernelStyle style;
  int32_t split_k;  // K ranges per output tile (the schedule's split_k; 1: none)
  bool stream_k;    // data-parallel waves, then the rest shared out in K-tiles (split_k is 1)
  bool grouped;     // walks (group, tile) over GemmArgs::groups problems (MoE experts), decided on the device
};

// What a kernel variant can run. The dispatcher matches a problem against these fields.
// codegen writes each row with designated initialisers (.config = ..., in this order; the kernel
// table is a C++20 .cpp), so a new field is named where it is filled.
struct KernelEntry {
  const char* config;   // canonical catalogue name, e.g. sm90a_bf16_128x256x64_c2x1_sw8_row_coop
  const char* family;   // its dtype field (bf16, e4m3, mxfp8, e4m3xe2m1, bf16xe2m1, ...): what op it serves
  DType a_dtype, b_dtype, d_dtype;
  bool a_k_major, b_k_major;
  ScaleMode scale_mode;
  bool tma_store;       // true: D must be 16-byte aligned (pointer and ldd); false: predicated stores
  // FP8 only: partial sums stay in the tensor core's reduced-precision accumulator for the
  // whole K loop (CUTLASS FastAccum; torch._scaled_mm's use_fast_accum=True). false: they are
  // promoted into an fp32 accumulator every K-tile, as torch's default does.
  bool fast_accum;
  // The kernel computes D^T = B^T A^T: GemmArgs' a/m are the weight (b^T, N rows) and b/n the
  // activations; D is written transposed. The MX decode and FP8 x FP4 kernels (geometry then
  // describes the kernel's own M' = N, N' = M tiles).
  bool swap_ab;
  // The epilogue applies GemmArgs::bias / alpha / beta (SM90). Otherwise the dispatcher applies
  // them after the kernel, unfused.
  bool fused_bias;
  // How an MX kernel (scale_mode Block32) meets its block scales (MxRoute); Promote elsewhere.
  MxRoute route;
  KernelGeometry geometry;
  // Returns cudaSuccess or the launch error; never throws across the module boundary.
  cudaError_t (*run)(GemmArgs const& args, cudaStream_t stream);
  // Bytes of GemmArgs::workspace this problem needs (0: none; split-K kernels).
  size_t (*workspace)(GemmArgs const& args);
};

// The dispatcher's cost-model constants for one arch (python/persistent_gemm/archs.py CostModel,
// written by codegen; cost_model.cpp says what each bounds).
struct ArchCost {
  double clock_ghz, flops_per_clk_16bit, mma_eff_max, stage_overhead_clk;
  double sm_load_bytes_per_us, dram_bytes_per_us, l2_bytes_per_us, launch_us;
  bool mx_scales_in_alu;  // SM90: MX scales are FMUL + FFMA per 32-K block; SM100: in the MMA
  bool measured;          // fitted on this hardware by the project (false: published peaks)
};

struct KernelTable {
  int32_t abi_version;
  const char* arch;  // "sm90a" / "sm100a"
  int32_t sm_major, sm_minor;
  int32_t count;
  KernelEntry const* entries;
  // Plain (rows, blocks) e8m0 scales, row stride ld bytes -> the blocked layout (128 x 4 atoms,
  // padded rows/blocks = 0x7F, i.e. 1.0), one launch on `stream` for up to two scale tensors.
  cudaError_t (*scale_to_blocked)(ScaleRelayout const* jobs, int count, cudaStream_t stream);
  cudaError_t (*quantize_mxfp8)(QuantizeJob const& job, cudaStream_t stream);
  cudaError_t (*dequantize_mx)(DequantizeJob const& job, cudaStream_t stream);
  cudaError_t (*moe_dispatch)(MoeDispatchJob const& job, cudaStream_t stream);
  cudaError_t (*moe_combine)(MoeCombineJob const& job, cudaStream_t stream);
  cudaError_t (*moe_activation)(MoeActivationJob const& job, cudaStream_t stream);
  ArchCost cost;
  int32_t reference_sm_count;  // multiprocessors of the part the constants describe
  // false: the project compiled these kernels but never ran them on such a GPU; the dispatcher
  // self-checks each one on its first use in a process (csrc/self_check.cpp).
  bool validated_on_hardware;
};

}  // namespace persistent_gemm
