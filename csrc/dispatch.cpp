// CUDA dispatch: validate, describe the problem, choose a kernel (heuristics.h), adapt the
// operands to what that kernel can read, launch on the current stream.
#include "dispatch.h"

#include <atomic>
#include <deque>
#include <cstdio>
#include <limits>
#include <mutex>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "checks.h"
#include "text.h"
#include "device_info.h"
#include "heuristics.h"
#include "reference.h"
#include "self_check.h"
#include "persistent_gemm/host/catalogue.h"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"  // sm100_mx: what the SM100 MX kernels accept
#include "persistent_gemm/layout/mx_blocked.hpp"

namespace persistent_gemm {
namespace {

std::atomic<bool> g_poison_outputs{false};


bool aligned16(void const* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The leading dimension TMA would read `t` (rows, cols) with, `cols` being the dimension meant
// to be contiguous; -1 when TMA cannot read the tensor as it is: no unit stride there, a
// misaligned base, a stride that is not a 16-byte multiple, or rows that overlap (stride-0
// broadcast views such as x.expand(M, K)). Those operands are copied (k_major_copy).
int64_t tma_ld(at::Tensor const& t, int unit_dim) {
  int const other = 1 - unit_dim;
  int64_t const contig = t.size(unit_dim), elem = int64_t(t.element_size());
  if (t.stride(unit_dim) != 1 && contig != 1) return -1;
  // A single line's stride is never followed: give TMA the smallest legal one.
  int64_t const ld = t.size(other) == 1 ? (contig * elem + 15) / 16 * 16 / elem : t.stride(other);
  if (!aligned16(t.data_ptr()) || ld < contig || (ld * elem) % 16 != 0) return -1;
  return ld;
}
bool tma_readable(at::Tensor const& rows_by_k, bool k_major) { return tma_ld(rows_by_k, k_major ? 1 : 0) >= 0; }

// A K-major copy whose rows start 16-byte aligned: (alloc_rows, K) with ld rounded up, the
// first rows holding the operand. Only the first K columns are read (TMA bounds the box at K),
// and rows past the operand's feed only output rows the caller cuts off: both stay
// uninitialised.
at::Tensor k_major_copy(at::Tensor const& rows_by_k, int64_t alloc_rows) {
  int64_t const rows = rows_by_k.size(0), k = rows_by_k.size(1);
  int64_t const per16 = 16 / int64_t(rows_by_k.element_size());
  int64_t const ld = (k + per16 - 1) / per16 * per16;
  auto buf = at::empty({std::max(rows, alloc_rows), ld}, rows_by_k.options());
  auto view = buf.narrow(1, 0, k);
  if ((rows_by_k.stride(1) == 1 || k == 1) && (rows == 1 || rows_by_k.stride(0) >= k)) {
    // Already K-major (pad_m): one 2-D async memcpy, a fraction of the host time of copy_().
    int64_t const elem = int64_t(rows_by_k.element_size());
    int64_t const src_ld = rows > 1 ? rows_by_k.stride(0) : k;
    cudaError_t const err = cudaMemcpy2DAsync(buf.data_ptr(), size_t(ld * elem), rows_by_k.data_ptr(),
                                              size_t(src_ld * elem), size_t(k * elem), size_t(rows),
                                              cudaMemcpyDeviceToDevice,
                                              c10::cuda::getCurrentCUDAStream(rows_by_k.get_device()));
    TORCH_CHECK(err == cudaSuccess, msg("persistent_gemm: operand copy failed: ", cudaGetErrorString(err)));
  } else {
    view.narrow(0, 0, rows).copy_(rows_by_k);
  }
  return view;
}

// The rule of the builder's can_implement (sm90_gemm_builder.hpp) that `g` breaks, naming the
// argument; empty when they all hold. The dispatcher only launches what it has adapted, so a
// non-empty answer here is a dispatcher bug, but the message must still say what went wrong.
std::string broken_launch_rule(GemmArgs const& g, KernelEntry const& e, int64_t d_elem) {
  // GemmArgs' a is the op's b (the weight) in a swap-AB kernel. Packed e2m1 strides count bytes:
  // a K-major e2m1 row holds K / 2 of them.
  DType const a_dtype = e.swap_ab ? e.b_dtype : e.a_dtype;
  auto const a_contig = e.a_k_major ? (a_dtype == DType::E2M1 ? g.k / 2 : g.k) : g.m;
  auto const b_contig = e.b_k_major ? g.k : g.n;
  int64_t const ea = a_dtype == DType::E4M3 || a_dtype == DType::E2M1 ? 1 : 2;
  if (!aligned16(g.a)) return "a's data pointer is not 16-byte aligned (TMA)";
  if (!aligned16(g.b)) return "b's data pointer is not 16-byte aligned (TMA)";
  if (g.lda < a_contig) return msg("a's leading stride ", g.lda, " is smaller than its contiguous extent ", a_contig);
  if (g.ldb < b_contig) return msg("b's leading stride ", g.ldb, " is smaller than its contiguous extent ", b_contig);
  if ((g.lda * ea) % 16) return msg("a's leading stride ", g.lda, " is not a multiple of 16 bytes (TMA)");
  if ((g.ldb * ea) % 16) return msg("b's leading stride ", g.ldb, " is not a multiple of 16 bytes (TMA)");
  if (e.swap_ab ? g.ldd < g.m : g.ldd < g.n)  // a swap-AB kernel writes its D transposed
    return msg("D's leading stride ", g.ldd, " is smaller than its contiguous extent ", e.swap_ab ? g.m : g.n);
  if (e.tma_store && (!aligned16(g.d) || (g.ldd * d_elem) % 16))
    return "D is not 16-byte aligned (pointer or leading stride) for the TMA-store epilogue";
  if (e.tma_store && (g.n * d_elem) % 16 && !g.d_pad_writable)
    return msg("N = ", g.n, " leaves D rows that are not whole 16-byte chunks, which a TMA store overwrites");
  if (e.scale_mode != ScaleMode::None && (!g.scale_a || !g.scale_b)) return "scale_a/scale_b pointers are missing";
  if (e.workspace && g.workspace_bytes < e.workspace(g))
    return msg("the split-K workspace has ", g.workspace_bytes, " bytes, the kernel needs ", e.workspace(g));
  return {};
}

void check_launch(cudaError_t err, char const* op, KernelEntry const& e, GemmArgs const& g, int64_t d_elem) {
  if (err == cudaSuccess) return;
  std::string const rule = err == cudaErrorInvalidValue ? broken_launch_rule(g, e, d_elem) : std::string();
  TORCH_CHECK(false, msg(op, ": kernel ", e.config, " failed to launch for M = ", g.m, ", N = ", g.n, ", K = ",
              g.k, ": ", cudaGetErrorString(err), rule.empty() ? std::string() : "; " + rule,
              err == cudaErrorInvalidValue && rule.empty()
                  ? "; the operands meet every TMA rule, so the launch configuration (cluster shape, shared "
                    "memory) was refused: please report this with the shapes"
                  : std::string()));
}


// Split-K kernels reduce through a workspace the caller owns for the launch: from torch's caching
// allocator on the op's stream (its blocks are 512 B aligned), kept alive until the kernel ran.
at::Tensor attach_workspace(KernelEntry const& e, GemmArgs& args, at::TensorOptions const& options) {
  size_t const bytes = e.workspace ? e.workspace(args) : 0;
  if (bytes == 0) return {};
  auto ws = at::empty({int64_t(bytes)}, options.dtype(at::kByte));
  args.workspace = ws.data_ptr();
  args.workspace_bytes = bytes;
  return ws;
}

// The epilogue's GemmArgs: a fusing kernel gets bias (in its own output type), alpha and beta;
// for any other the dispatcher runs finish_epilogue on its output instead.
at::Tensor attach_epilogue(KernelEntry const& e, GemmArgs& args, Epilogue const& epi, at::ScalarType kernel_out) {
  if (!e.fused_bias) return {};
  args.alpha = float(epi.alpha);
  if (!epi.bias.defined()) return {};
  at::Tensor bias = epi.bias.to(kernel_out).contiguous();
  args.bias = bias.data_ptr();
  args.beta = float(epi.beta);
  return bias;
}

// D (the kernel's output, before any cast) after a kernel that did not fuse the epilogue.
at::Tensor finish_epilogue(KernelEntry const& e, at::Tensor d, Epilogue const& epi) {
  if (e.fused_bias || epi.trivial()) return d;
  return epilogue_reference(d.to(at::kFloat), epi, d.scalar_type());
}

// K == 0 (or the fallback): D = beta * bias broadcast over M rows, zeros without a bias.
at::Tensor empty_k_result(Problem const& p, at::Tensor const& a, Epilogue const& epi) {
  return epilogue_reference(at::zeros({p.m, p.n}, a.options().dtype(at::kFloat)), epi, p.out_dtype);
}

// An MX scale as the kernels read it: the blocked layout (layout/mx_blocked.hpp), 16-byte aligned.
// Plain scales are relaid out by the arch module's kernel, every pending one in one launch.
struct MxScales {
  at::Tensor a, b;
};
// keep_a: the kernel reads a's scales as they come (the Gemv style): only b's are relaid.
MxScales blocked_scales(char const* op, ArchModule const& mod, at::Tensor const& scale_a, int64_t m,
                        at::Tensor const& scale_b, int64_t n, int64_t k, ScaleLayouts layouts, cudaStream_t stream,
                        bool keep_a = false) {
  int64_t const blocks = mx_blocks(k);
  ScaleRelayout jobs[2];
  int count = 0;
  auto prepare = [&](at::Tensor const& s, int64_t rows, ScaleLayout layout) {
    if (layout == ScaleLayout::Blocked) return aligned16(s.data_ptr()) ? s : s.clone();
    auto out = at::empty({mx_blocked::bytes(rows, blocks)}, s.options().dtype(at::kByte));
    jobs[count++] = {static_cast<uint8_t const*>(s.data_ptr()), rows, blocks, s.size(0) > 1 ? s.stride(0) : blocks,
                     static_cast<uint8_t*>(out.data_ptr())};
    return out;
  };
  // An undefined scale_a (weight-only MX: bf16 activations) stays undefined.
  MxScales out{keep_a || !scale_a.defined() ? scale_a : prepare(scale_a, m, layouts.a), prepare(scale_b, n, layouts.b)};
  if (count) {
    cudaError_t const err = mod.table->scale_to_blocked(jobs, count, stream);
    TORCH_CHECK(err == cudaSuccess, msg(op, ": scale relayout failed: ", cudaGetErrorString(err)));
  }
  return out;
}

// A copy of the (rows, K) byte rows of an MX operand (`k_bytes` wide) zero-padded to `kp_bytes`,
// for the SM100 TMA rule on K (sm100_mx::padded_k): zeros past K contribute nothing.
at::Tensor k_padded_copy(at::Tensor const& rows_by_k, int64_t kp_bytes) {
  auto buf = at::zeros({rows_by_k.size(0), kp_bytes}, rows_by_k.options().dtype(at::kByte));
  buf.narrow(1, 0, rows_by_k.size(1)).copy_(rows_by_k.view(at::kByte));
  return buf;
}

at::ScalarType torch_dtype(DType d) {
  return d == DType::FP32 ? at::kFloat : d == DType::FP16 ? at::kHalf : at::kBFloat16;
}

// The kernels index tiles and elements with 32-bit extents.
void check_extents(char const* op, Problem const& p) {
  for (auto [what, v] : {std::pair<char const*, int64_t>{"M", p.m}, {"N", p.n}, {"K", p.k}})
    TORCH_CHECK_VALUE(v < (int64_t(1) << 31), msg(op, ": ", what, " = ", v, " exceeds the 2^31 the kernels index"));
}

}  // namespace

Request request_for(Problem const& p, DType a, DType b, ScaleMode scale, std::optional<c10::string_view> config) {
  return make_request(p.m, p.n, p.k, a, b, to_dtype(p.out_dtype), scale,
                      config ? std::optional<std::string>(std::string(config->data(), config->size())) : std::nullopt);
}

// The one launch path of every op: choose the kernel, adapt the operands to what it reads
// (aligned K-major copies, padded M or K, scale relayouts), launch on the current stream, and
// finish D (unfused epilogue, cast, narrowing). A swap-AB kernel runs D^T = W A^T: the weight is
// its A operand, the activations its B, and it writes D transposed, i.e. D row-major, no copy.
// Grouped (in.groups): the same, the kernel walking the groups' rows on the device.
at::Tensor launch(char const* op, ArchModule const& mod, Request req, Operands in, Problem const& p,
                  Epilogue const& epi) {
  bool const mx = req.scale == ScaleMode::Block32;
  req.sm_count = device_info(in.a.get_device()).sm_count;
  // Unaligned operands go through an aligned K-major copy: correctness first, then speed.
  if (!tma_readable(in.a, req.a_k_major)) req.a_k_major = true, req.a_needs_copy = true;
  if (!tma_readable(in.w, req.b_k_major)) req.b_k_major = true, req.b_needs_copy = true;
  // SM100 e2m1 weights by TMA need 32-byte bases and rows (sm100_mx::kFp4TmaAlign): a view at a
  // 16 mod 32 offset is copied, not handed to an encode that would fail and fault the kernel.
  if (mx && mod.table->sm_major >= 10 && req.b == DType::E2M1 &&
      (reinterpret_cast<uintptr_t>(in.w.data_ptr()) % kernel::sm100_mx::kFp4TmaAlign ||
       (in.w.size(0) > 1 && in.w.stride(0) % kernel::sm100_mx::kFp4TmaAlign)))
    req.b_k_major = true, req.b_needs_copy = true;
  Choice const c = choose_kernel_cached(op, *mod.table, req);
  KernelEntry const& e = *c.entry;
  self_check::ensure(op, mod, e, in.a.get_device());
  cudaStream_t const stream = c10::cuda::getCurrentCUDAStream(in.a.get_device());

  // pad_m: the kernel runs on whole M-tiles (see Choice::pad_m); D's extra rows are cut off.
  int64_t const m_run = c.pad_m ? (p.m + e.geometry.tile_m - 1) / e.geometry.tile_m * e.geometry.tile_m : p.m;
  int64_t k_run = p.k;
  bool const e2m1 = req.b == DType::E2M1;
  if (mx && mod.table->sm_major >= 10) {
    // tcgen05 kernels (SM100) load both MX operands by TMA with a K rule of their own: K % 128
    // for e2m1 (16U4_ALIGN16B rows), K % 16 for e4m3. Other K runs on zero-padded copies.
    k_run = kernel::sm100_mx::padded_k(p.k, e2m1);
  }
  // A grouped weight is the experts' stack seen through its first expert's rows: a copy of that
  // view would drop the others (grouped_mm hands over aligned stacks and whole 1x32 blocks).
  TORCH_CHECK(!in.groups || (k_run == p.k && !c.copy_b), op, ": internal error: ", e.config,
              " would copy the first expert's weight only (K = ", p.k, " run as ", k_run, "); please report");
  if (k_run != p.k) {
    in.a = k_padded_copy(in.a, k_run);
    in.w = k_padded_copy(in.w, e2m1 ? k_run / 2 : k_run);
  } else {
    if (c.copy_a || c.pad_m) in.a = k_major_copy(in.a, m_run);
    if (c.copy_b) in.w = k_major_copy(in.w, 0);
  }
  // Scales in the kernel's orientation (a swap-AB kernel's row scale is the weight's). MX: the
  // blocked layout, except what the decode GEMV reads as it comes (the activations' plain rows).
  // The bf16 route's pre-pass reads them either way too, and a grouped kernel's pass copies them
  // per expert (SM100: into band-aligned blocked scales).
  // Weight-only MX (bf16 activations) has no activation scales: scale_a is undefined.
  bool const plain_a = (e.geometry.style == KernelStyle::Gemv || e.route == MxRoute::Bf16 || e.geometry.grouped) &&
                       in.layouts.a == ScaleLayout::Plain && in.scale_a.defined();
  at::Tensor sa = in.scale_a, sb = in.scale_b;
  if (mx) {
    if (plain_a && sa.size(0) > 1 && sa.stride(1) != 1) sa = sa.contiguous();
    // The blocked scales of K and of k_run have the same atoms: k_run < K rounded up to 128.
    MxScales const sc = blocked_scales(op, mod, sa, p.m, sb, p.n, p.k, in.layouts, stream, plain_a);
    sa = sc.a, sb = sc.b;
  }

  at::ScalarType const kernel_out = torch_dtype(e.d_dtype);
  int64_t const kernel_elem = int64_t(c10::elementSize(kernel_out));
  // pad_d: a TMA store writes whole 16-byte chunks; D is then narrowed back to N columns.
  int64_t const ldd = c.pad_d ? (p.n * kernel_elem + 15) / 16 * 16 / kernel_elem : p.n;
  auto d_buf = at::empty({m_run, ldd}, in.a.options().dtype(kernel_out));
  // Test hook (and the self-check): NaN in every element the kernel is meant to write, so a
  // skipped tile shows. The masked grouped form's rows past each group's count are zeros, which
  // the kernel never writes.
  if (in.groups && in.groups->rows_ld > 0)
    d_buf.zero_();
  else if (poison_outputs())
    d_buf.fill_(std::numeric_limits<float>::quiet_NaN());

  GemmArgs args;
  at::Tensor const& x = e.swap_ab ? in.w : in.a;  // the kernel's A: (its M, K)
  at::Tensor const& y = e.swap_ab ? in.a : in.w;  // the kernel's B, as (its N, K)
  args.m = int32_t(e.swap_ab ? p.n : m_run);
  args.n = int32_t(e.swap_ab ? m_run : p.n);
  args.k = int32_t(k_run);
  args.a = x.data_ptr();
  args.a_k_major = e.a_k_major;
  args.lda = tma_ld(x, e.a_k_major ? 1 : 0);  // MX: bytes (e4m3, or packed e2m1 pairs)
  args.b = y.data_ptr();
  args.b_k_major = e.b_k_major;
  args.ldb = tma_ld(y, e.b_k_major ? 1 : 0);
  args.d = d_buf.data_ptr();
  args.ldd = ldd;
  args.d_pad_writable = c.pad_d;  // our own padded buffer: its tail columns are scratch
  args.scale_mode = e.scale_mode;
  at::Tensor const& sx = e.swap_ab ? sb : sa;
  at::Tensor const& sy = e.swap_ab ? sa : sb;
  if (sx.defined()) args.scale_a = sx.data_ptr();
  if (sy.defined()) args.scale_b = sy.data_ptr();
  if (plain_a)  // the activations' plain e8m0 rows, in place (the kernel's B scales when swap-AB)
    (e.swap_ab ? args.ld_scale_b : args.ld_scale_a) = sa.size(0) > 1 ? sa.stride(0) : std::max<int64_t>(1, sa.size(1));
  if (in.groups) {
    args.groups = int32_t(in.groups->count);
    args.group_rows = in.groups->rows.data_ptr<int32_t>();
    args.group_rows_ld = in.groups->rows_ld;
    args.group_stride_a = in.groups->weight_stride;
    args.group_stride_scale_a = in.groups->scale_stride;
  }
  args.sm_count = req.sm_count;
  args.max_workers = self_check::forced_workers();  // 0 (fill the GPU) but in a self-check's one-cluster pass
  at::Tensor const workspace = attach_workspace(e, args, in.a.options());
  at::Tensor const bias = attach_epilogue(e, args, epi, kernel_out);
  check_launch(e.run(args, stream), op, e, args, kernel_elem);

  at::Tensor d = c.pad_m ? d_buf.narrow(0, 0, p.m) : d_buf;  // leading rows: still contiguous
  if (c.pad_d) d = d.narrow(1, 0, p.n);
  d = finish_epilogue(e, d, epi);
  if (kernel_out != p.out_dtype) return d.to(p.out_dtype);
  return c.pad_d ? d.contiguous() : d;
}

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::FP16;
    case at::kFloat: return DType::FP32;
    case at::kFloat8_e4m3fn: return DType::E4M3;
    default: TORCH_CHECK(false, msg("persistent_gemm: internal error: no kernel dtype for ", t));
  }
}

void set_poison_outputs(bool on) { g_poison_outputs.store(on); }
bool poison_outputs() { return g_poison_outputs.load(std::memory_order_relaxed) || self_check::running(); }

at::Tensor mm_cuda(at::Tensor const& a, at::Tensor const& b, std::optional<at::ScalarType> out_dtype,
                   std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias, double alpha,
                   double beta) {
  char const* op = "persistent_gemm.mm";
  auto const [p, epi, kind, layouts] = checked_mm(op, a, b, out_dtype, config, bias, alpha, beta);
  c10::cuda::CUDAGuard guard(a.device());
  if (p.m == 0 || p.n == 0 || p.k == 0) return empty_k_result(p, a, epi);
  check_extents(op, p);
  auto const& mod = require_arch(op, a);
  if (self_check::use_fallback(mod)) return mm_cpu(a, b, out_dtype, std::nullopt, bias, alpha, beta);
  Request req = request_for(p, to_dtype(a.scalar_type()), to_dtype(a.scalar_type()), ScaleMode::None, config);
  req.a_k_major = a.stride(1) == 1 || a.size(1) == 1;
  req.b_k_major = b.stride(0) == 1 || b.size(0) == 1;
  return launch(op, mod, req, Operands{a, b.t()}, p, epi);
}

at::Tensor scaled_mm_cuda(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                          at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                          std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias,
                          double alpha, double beta) {
  char const* op = "persistent_gemm.scaled_mm";
  auto const [p, epi, kind, layouts] =
      checked_scaled_mm(op, a, b, scale_a, scale_b, out_dtype, use_fast_accum, config, bias, alpha, beta);
  c10::cuda::CUDAGuard guard(a.device());
  if (p.m == 0 || p.n == 0 || p.k == 0) return empty_k_result(p, a, epi);
  check_extents(op, p);
  auto const& mod = require_arch(op, a);
  if (self_check::use_fallback(mod))
    return scaled_mm_cpu(a, b, scale_a, scale_b, out_dtype, use_fast_accum, std::nullopt, bias, alpha, beta);
  Request req = request_for(p, DType::E4M3, DType::E4M3,
                            kind == ScaleKind::Tensorwise ? ScaleMode::Tensorwise : ScaleMode::Rowwise, config);
  req.a_k_major = req.b_k_major = true;
  req.fast_accum = use_fast_accum;
  return launch(op, mod, req, Operands{a, b.t(), scale_a.contiguous(), scale_b.contiguous()}, p, epi);
}

// mxfp8_mm (e2m1 = false) and fp8_fp4_mm (e2m1 = true): the weight goes to launch() as its (N, K)
// rows b^T (e4m3, or packed e2m1 (N, K/2) bytes).
at::Tensor mx_mm_cuda(bool e2m1, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                      at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype,
                      c10::string_view scale_layout, std::optional<c10::string_view> config,
                      std::optional<c10::string_view> scale_b_layout, std::optional<at::Tensor> const& bias) {
  char const* op = e2m1 ? "persistent_gemm.fp8_fp4_mm" : "persistent_gemm.mxfp8_mm";
  auto const [p, epi, kind, layouts] =
      checked_mx_mm(op, e2m1, a, b, scale_a, scale_b, out_dtype, scale_layout, config, scale_b_layout, bias);
  c10::cuda::CUDAGuard guard(a.device());
  if (p.m == 0 || p.n == 0 || p.k == 0) return empty_k_result(p, a, epi);
  check_extents(op, p);
  auto const& mod = require_arch(op, a);  // once, as every op's entry
  if (self_check::use_fallback(mod))
    return mx_mm_ref(e2m1, a, b, scale_a, scale_b, out_dtype, scale_layout, std::nullopt, scale_b_layout, bias);
  Request req = request_for(p, DType::E4M3, e2m1 ? DType::E2M1 : DType::E4M3, ScaleMode::Block32, config);
  return launch(op, mod, req, Operands{a, b.t(), scale_a, scale_b, layouts}, p, epi);
}

at::Tensor weight_only_mm_cuda(at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                               std::optional<at::ScalarType> out_dtype, c10::string_view scale_b_layout,
                               std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias) {
  char const* op = "persistent_gemm.weight_only_mm";
  auto const [p, epi, kind, layouts] =
      checked_weight_only_mm(op, a, b, scale_b, out_dtype, scale_b_layout, config, bias);
  bool const e2m1 = b.scalar_type() == at::kFloat4_e2m1fn_x2;
  c10::cuda::CUDAGuard guard(a.device());
  if (p.m == 0 || p.n == 0 || p.k == 0) return empty_k_result(p, a, epi);
  check_extents(op, p);
  auto const& mod = require_arch(op, a);
  Request req = request_for(p, to_dtype(a.scalar_type()), e2m1 ? DType::E2M1 : DType::E4M3, ScaleMode::Block32, config);
  // Hopper only so far (issue 24): on another arch the reference would run silently at a
  // fraction of the speed the user chose the format for.
  bool const fallback = self_check::use_fallback(mod);
  TORCH_CHECK_NOT_IMPLEMENTED(fallback || mod.table->sm_major == 9, op,
                              ": the weight-only MX kernels are Hopper-only (sm90a) so far; this GPU's module is ",
                              mod.table->arch, ". Use mxfp8_mm / fp8_fp4_mm (e4m3 activations, which have ",
                              mod.table->arch, " kernels), run on the CPU for the exact reference, or set "
                              "PGEMM_FALLBACK=torch to run that reference on this GPU.");
  // The fused kernels take bf16 activations: the decode GEMV (M <= 64 tokens) and the bf16 route
  // (prefill). fp16 activations, or a build without a fitting kernel, run the op's exact
  // reference, as explain() says. A forced config goes to the chooser, which says why it cannot run.
  if (fallback || (!config && !has_candidate(*mod.table, req))) {
    if (a.scalar_type() == at::kHalf) {  // the slow path an fp16 model takes silently otherwise
      TORCH_WARN_ONCE(op, ": fp16 activations run the exact reference on the GPU (dequantize the weight, fp32 "
                      "sums), many times slower than the fused kernels, which take bf16 activations (bf16 cannot "
                      "hold fp16 values exactly, so nothing converts them for you). Said once per process.");
    }
    return weight_only_mm_ref(a, b, scale_b, out_dtype, scale_b_layout, std::nullopt, bias);
  }
  return launch(op, mod, req, Operands{a, b.t(), at::Tensor(), scale_b, layouts}, p, epi);
}

}  // namespace persistent_gemm
