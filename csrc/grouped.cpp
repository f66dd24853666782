// grouped_mm: the GEMMs of MoE experts in torch._grouped_mm's convention (issue 45). The schema,
// its checks (one set for the CPU and CUDA entries), the exact reference, and the CUDA entry,
// which goes through the one launch path (dispatch.cpp) to the grouped decode GEMV.
//
// Forms. a (R, K) with offs (E,) int32 cumulative row ends: expert e owns rows
// [offs[e-1], offs[e]) (offs[-1] = 0), offs[E-1] == R; out (R, N). Or the masked form a (E, rows, K)
// with offs holding each expert's row count: out (E, rows, N), rows past the count zero.
// Formats, by dtype: bf16/fp16 a x b (E, K, N) of a's dtype; bf16/fp16 a x an MX stack (weight-only
// MXFP8 / MXFP4: b (E, K, N) e4m3 or (E, K/2, N) packed e2m1, the (K, N) column-major views of
// prepare_weight's rows, scale_b (E, S) its blocked e8m0 scales); e4m3 a with scale_a (rows, K/32)
// plain e8m0 x an MX stack (MXFP8, FP8 x FP4). bias (E, N) of the output dtype. Kernels: SM90, every
// format but 16-bit; SM100, MXFP8 and FP8 x FP4 (K % 128 == 0) (compiled, not run here).
//
// offs is read on the device only. On the CPU it is checked eagerly; on a GPU the kernel checks it
// (a message and a failed launch); the GPU reference, where it runs, by torch._assert_async.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "dispatch.h"
#include "heuristics.h"
#include "reference.h"
#include "self_check.h"
#include "text.h"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"
#include "persistent_gemm/layout/mx_blocked.hpp"
#include "persistent_gemm/scheduler/grouped_rows.hpp"

namespace persistent_gemm {
namespace {

constexpr char kOp[] = "persistent_gemm.grouped_mm";

enum class Format { Dense16, WeightOnly, Mx };

// A validated call: the form, the format, the extents.
struct Grouped {
  Format format = Format::Dense16;
  bool masked = false;  // a (E, rows, K), offs = counts
  bool e2m1 = false;
  int64_t groups = 0, rows = 0, n = 0, k = 0;  // rows: a's rows as one (rows, K) matrix
  int64_t group_rows = 0;                      // masked: rows per expert
  at::ScalarType out_dtype = at::kBFloat16;
};

Grouped check(at::Tensor const& a, at::Tensor const& b, at::Tensor const& offs, std::optional<at::Tensor> const& scale_a,
              std::optional<at::Tensor> const& scale_b, std::optional<at::Tensor> const& bias,
              std::optional<at::ScalarType> out_dtype, std::optional<c10::string_view> config) {
  Grouped g;
  TORCH_CHECK_VALUE(a.dim() == 2 || a.dim() == 3, msg(kOp, ": a must be 2-D (rows, K) rows sorted by expert with "
                    "offs, or 3-D (E, rows, K) (the masked form) with per-expert counts, got ", a.dim(), "-D"));
  check_device_kind(kOp, a);
  g.masked = a.dim() == 3;
  TORCH_CHECK_VALUE(b.dim() == 3, msg(kOp, ": b must be 3-D (E, K, N) (torch._grouped_mm's layout, or a stacked "
                    "prepare_weight), got ", b.dim(), "-D with shape ", b.sizes()));
  g.groups = b.size(0);
  char const* offs_is = g.masked ? "per-expert row counts" : "cumulative row ends";
  TORCH_CHECK_TYPE(offs.scalar_type() == at::kInt, msg(kOp, ": offs must be torch.int32 (", offs_is, "), got ",
                   dtype_name(offs.scalar_type())));
  TORCH_CHECK_VALUE(offs.dim() == 1 && offs.size(0) == g.groups, msg(kOp, ": offs must be 1-D with one entry per "
                    "expert (E = ", g.groups, ", b's first extent), got shape ", offs.sizes()));
  TORCH_CHECK_VALUE(offs.device() == a.device(), msg(kOp, ": offs is on ", offs.device(), " but a is on ", a.device(),
                    "; offs must live on a's device (the kernels read it there; copying it would sync)"));
  check_same_device(kOp, a, "b", b);
  for (auto [name, t] : {std::pair<char const*, std::optional<at::Tensor> const*>{"scale_a", &scale_a},
                         {"scale_b", &scale_b}, {"bias", &bias}})
    if (t->has_value()) check_same_device(kOp, a, name, **t);
  if (g.masked)
    TORCH_CHECK_VALUE(a.size(0) == g.groups, msg(kOp, ": the masked form's a is (E, rows, K) with E = ", g.groups,
                      " (b's experts), got shape ", a.sizes()));
  g.group_rows = g.masked ? a.size(1) : 0;
  g.rows = g.masked ? a.size(0) * a.size(1) : a.size(0);
  g.k = a.size(-1);
  auto const at_ = a.scalar_type(), bt = b.scalar_type();
  bool const a16 = at_ == at::kBFloat16 || at_ == at::kHalf;
  TORCH_CHECK_TYPE(a16 || at_ == at::kFloat8_e4m3fn, msg(kOp, ": a must be torch.bfloat16, torch.float16 or "
                   "torch.float8_e4m3fn (with scale_a), got ", dtype_name(at_)));
  bool const b_mx = bt == at::kFloat8_e4m3fn || bt == at::kFloat4_e2m1fn_x2;
  TORCH_CHECK_TYPE(b_mx || (a16 && bt == at_), msg(kOp, ": b must have a's dtype ", dtype_name(at_),
                   a16 ? " or be an MX stack (torch.float8_e4m3fn / torch.float4_e2m1fn_x2 with scale_b)" : "",
                   ", got ", dtype_name(bt), a16 ? "" : " (e4m3 activations take an MX stack: prepare_weight)"));
  g.format = !b_mx ? Format::Dense16 : a16 ? Format::WeightOnly : Format::Mx;
  g.e2m1 = bt == at::kFloat4_e2m1fn_x2;
  int64_t const k_b = g.e2m1 ? 2 * b.size(1) : b.size(1);
  TORCH_CHECK_VALUE(k_b == g.k, msg(kOp, ": a's K = ", g.k, " but b is ", b.sizes(), " (K = ", k_b, ")"));
  g.n = b.size(2);
  if (g.format != Format::Dense16) {
    TORCH_CHECK_VALUE(g.k % kMxBlock == 0, msg(kOp, ": K = ", g.k, " must be a multiple of 32 for MX weights (whole "
                      "1x32 scale blocks)"));
    TORCH_CHECK_VALUE(scale_b.has_value(), msg(kOp, ": an MX b needs scale_b, its blocked e8m0 scales (E, S) "
                      "(prepare_weight of a 3-D stack gives both)"));
    check_scale_dtype(kOp, "scale_b", *scale_b);
    int64_t const per = mx_blocked::bytes(g.n, mx_blocks(g.k));
    TORCH_CHECK_VALUE(scale_b->dim() == 2 && scale_b->size(0) == g.groups && scale_b->size(1) == per &&
                          scale_b->stride(1) == 1,
                      msg(kOp, ": scale_b must be (E, ", per, ") blocked e8m0 scales, one row per expert (",
                          "prepare_weight's layout for N = ", g.n, ", K = ", g.k, "), got shape ", scale_b->sizes(),
                          " strides ", scale_b->strides()));
  } else {
    TORCH_CHECK_VALUE(!scale_b.has_value(), msg(kOp, ": scale_b is for MX weights; b is ", dtype_name(bt)));
  }
  if (g.format == Format::Mx) {
    TORCH_CHECK_VALUE(scale_a.has_value(), msg(kOp, ": e4m3 a needs scale_a, its plain e8m0 scales per 1x32 block"));
    check_scale_dtype(kOp, "scale_a", *scale_a);
    auto want = a.sizes().vec();
    want.back() = mx_blocks(g.k);
    TORCH_CHECK_VALUE(scale_a->sizes() == c10::IntArrayRef(want), msg(kOp, ": scale_a must be ", c10::IntArrayRef(want),
                      " plain e8m0 scales (a's rows x K/32), got ", scale_a->sizes()));
  } else {
    TORCH_CHECK_VALUE(!scale_a.has_value(), msg(kOp, ": scale_a is for e4m3 activations; a is ", dtype_name(at_)));
  }
  g.out_dtype = resolve_out(kOp, out_dtype, a16 ? at_ : at::kBFloat16);
  if (bias) {
    TORCH_CHECK_VALUE(bias->dim() == 2 && bias->size(0) == g.groups && bias->size(1) == g.n,
                      msg(kOp, ": bias must be (E, N) = (", g.groups, ", ", g.n, "), one row per expert, got shape ",
                          bias->sizes()));
    TORCH_CHECK_TYPE(bias->scalar_type() == g.out_dtype, msg(kOp, ": bias must have the output's dtype ",
                     dtype_name(g.out_dtype), ", got ", dtype_name(bias->scalar_type())));
  }
  char const* family = g.format == Format::Dense16 ? (at_ == at::kHalf ? "fp16" : "bf16")
                       : g.format == Format::WeightOnly ? (g.e2m1 ? "bf16xe2m1" : "bf16xe4m3")
                                                        : (g.e2m1 ? "e4m3xe2m1" : "mxfp8");
  check_config(kOp, config, {family});
  TORCH_CHECK_VALUE(g.rows < (int64_t(1) << 31) && g.n < (int64_t(1) << 31),
                    msg(kOp, ": ", g.rows, " rows x N = ", g.n, " exceed the 2^31 the kernels index"));
  return g;
}

// The weight as (E, N, K) fp32 values, exactly: a 16-bit b's transpose, an MX stack dequantized by
// its per-expert blocked scales.
at::Tensor weight_values(Grouped const& g, at::Tensor const& b, std::optional<at::Tensor> const& scale_b) {
  if (g.format == Format::Dense16) return b.to(at::kFloat).transpose(1, 2);
  std::vector<at::Tensor> experts;
  for (int64_t e = 0; e < g.groups; ++e) {
    at::Tensor const rows = b[e].t();  // (N, K or K/2)
    at::Tensor const v = g.e2m1 ? unpack_e2m1(rows) : rows.to(at::kFloat);
    experts.push_back(v * block_scale_factors((*scale_b)[e], g.n, g.k, ScaleLayout::Blocked));
  }
  return at::stack(experts);
}

// Each row's expert (offs form) from offs on its device, without reading it on the host: rows
// past offs[E-1] get E.
at::Tensor row_experts(at::Tensor const& offs, int64_t rows) {
  return at::searchsorted(offs, at::arange(rows, offs.options()), /*out_int32=*/true, /*right=*/true);
}

// The exact reference on any device: products in fp32 (exact for 16-bit x MX values), summed in
// fp32, the bias added, rounded once. On the CPU offs is read and checked; elsewhere it stays on
// the device, checked by an async assert, and each expert's GEMM runs over all rows, masked.
at::Tensor reference(Grouped const& g, at::Tensor const& a, at::Tensor const& b, at::Tensor const& offs,
                     std::optional<at::Tensor> const& scale_a, std::optional<at::Tensor> const& scale_b,
                     std::optional<at::Tensor> const& bias) {
  at::Tensor const w = weight_values(g, b, scale_b);  // (E, N, K)
  at::Tensor x = a.reshape({g.rows, g.k}).to(at::kFloat);
  if (g.format == Format::Mx)
    x = x * block_scale_factors(scale_a->reshape({g.rows, mx_blocks(g.k)}), g.rows, g.k, ScaleLayout::Plain);
  at::Tensor const bias_f = bias ? bias->to(at::kFloat) : at::zeros({g.groups, g.n}, x.options());
  if (g.masked) {
    at::Tensor out = at::baddbmm(bias_f.unsqueeze(1), x.view({g.groups, g.group_rows, g.k}), w.transpose(1, 2));
    at::Tensor const counts = offs.to(at::kLong);
    if (offs.is_cpu()) {
      for (int64_t e = 0; e < g.groups; ++e) {
        int64_t const c = counts[e].item<int64_t>();
        TORCH_CHECK_VALUE(c >= 0 && c <= g.group_rows, msg("persistent_gemm.masked_grouped_mm: counts must be in [0, ",
                          g.group_rows, "] (a's rows per expert); counts[", e, "] = ", c));
      }
    } else {
      at::_assert_async(at::logical_and(counts >= 0, counts <= g.group_rows).all(),
                        "persistent_gemm.masked_grouped_mm: counts must be in [0, rows of a per expert]");
    }
    at::Tensor const live = at::arange(g.group_rows, counts.options()).unsqueeze(0) < counts.unsqueeze(1);
    return at::where(live.unsqueeze(2), out, at::zeros({}, out.options())).to(g.out_dtype);
  }
  if (offs.is_cpu()) {
    at::Tensor out = at::empty({g.rows, g.n}, x.options());
    int64_t begin = 0;
    for (int64_t e = 0; e < g.groups; ++e) {
      int64_t const end = offs[e].item<int64_t>();
      TORCH_CHECK_VALUE(end >= begin && end <= g.rows && (e + 1 < g.groups || end == g.rows),
                        msg(kOp, ": offs must be non-decreasing cumulative row ends in [0, ", g.rows,
                            "] with offs[-1] == ", g.rows, " (the rows of a); offs[", e, "] = ", end));
      if (end > begin)
        out.narrow(0, begin, end - begin).copy_(at::addmm(bias_f[e], x.narrow(0, begin, end - begin), w[e].t()));
      begin = end;
    }
    return out.to(g.out_dtype);
  }
  at::Tensor const offs_l = offs.to(at::kLong);
  at::Tensor const prev = at::cat({at::zeros({1}, offs_l.options()), offs_l.narrow(0, 0, g.groups - 1)});
  at::_assert_async(at::logical_and((offs_l >= prev).all(), offs_l[g.groups - 1] == g.rows),
                    "persistent_gemm.grouped_mm: offs must be non-decreasing cumulative row ends with offs[-1] == "
                    "the rows of a");
  at::Tensor const expert = row_experts(offs, g.rows).to(at::kLong).unsqueeze(1);
  at::Tensor out = at::zeros({g.rows, g.n}, x.options());
  for (int64_t e = 0; e < g.groups; ++e)
    out = at::where(expert == e, at::addmm(bias_f[e], x, w[e].t()), out);
  return out.to(g.out_dtype);
}

at::Tensor grouped_mm_cpu(at::Tensor const& a, at::Tensor const& b, at::Tensor const& offs,
                          std::optional<at::Tensor> const& scale_a, std::optional<at::Tensor> const& scale_b,
                          std::optional<at::Tensor> const& bias, std::optional<at::ScalarType> out_dtype,
                          std::optional<c10::string_view> config) {
  Grouped const g = check(a, b, offs, scale_a, scale_b, bias, out_dtype, config);
  return reference(g, a, b, offs, scale_a, scale_b, bias);
}

at::Tensor grouped_mm_cuda(at::Tensor const& a, at::Tensor const& b, at::Tensor const& offs,
                           std::optional<at::Tensor> const& scale_a, std::optional<at::Tensor> const& scale_b,
                           std::optional<at::Tensor> const& bias, std::optional<at::ScalarType> out_dtype,
                           std::optional<c10::string_view> config) {
  Grouped const g = check(a, b, offs, scale_a, scale_b, bias, out_dtype, config);
  c10::cuda::CUDAGuard guard(a.device());
  auto shaped = [&](at::Tensor d) { return g.masked ? d.view({g.groups, g.group_rows, g.n}) : d; };
  if (g.rows == 0 || g.n == 0 || g.groups == 0) return shaped(at::zeros({g.rows, g.n}, a.options().dtype(g.out_dtype)));
  if (g.format == Format::Dense16) {
    // No grouped 16-bit kernel of ours yet: bf16 rows sorted by expert run torch's own grouped
    // GEMM (torch._grouped_mm; bias added after), everything else the reference.
    if (a.scalar_type() != at::kBFloat16 || g.masked || config) {
      TORCH_CHECK_VALUE(!config, msg(kOp, ": no grouped 16-bit kernel is built, so config cannot choose one"));
      return reference(g, a, b, offs, scale_a, scale_b, bias);
    }
    // torch writes bf16 (its grouped GEMM takes no other output dtype): a bias or another
    // out_dtype is applied to that result, a second rounding where there is one.
    at::Tensor out = at::_grouped_mm(a, b, offs);
    if (bias)
      return (out.to(at::kFloat) + bias->to(at::kFloat).index_select(0, row_experts(offs, g.rows).clamp_max(g.groups - 1)))
          .to(g.out_dtype);
    return out.to(g.out_dtype);
  }
  auto const& mod = require_arch(kOp, a);
  Problem const p{g.rows, g.n, g.k, g.out_dtype};
  DType const a_dtype = g.format == Format::Mx ? DType::E4M3 : a.scalar_type() == at::kHalf ? DType::FP16 : DType::BF16;
  Request req = request_for(p, a_dtype, g.e2m1 ? DType::E2M1 : DType::E4M3, ScaleMode::Block32, config);
  req.groups = int32_t(std::min<int64_t>(g.groups, scheduler::kMaxGroups + 1));
  // The grouped kernels: Hopper (bf16 (weight-only) or e4m3 activations) and Blackwell (e4m3
  // activations: MXFP8, and FP8 x FP4 where its e2m1 weight meets TMA's rule, K % 128 and 32-byte
  // rows, which a stack cannot be padded to; compiled, not run here), up to kMaxGroups experts.
  // Anything else runs the exact reference (fp16 activations, as weight_only_mm does; a GPU
  // without grouped kernels), a forced config refuses.
  bool const sm100_e2m1_ok = g.k % kernel::sm100_mx::kFp4KAlign == 0 &&
                             reinterpret_cast<uintptr_t>(b.data_ptr()) % kernel::sm100_mx::kFp4TmaAlign == 0 &&
                             b.stride(2) % kernel::sm100_mx::kFp4TmaAlign == 0 &&
                             (g.groups == 1 || b.stride(0) % kernel::sm100_mx::kFp4TmaAlign == 0);
  bool const arch_has = mod.table->sm_major == 9 ||
                        (mod.table->sm_major == 10 && g.format == Format::Mx && (!g.e2m1 || sm100_e2m1_ok));
  bool const kernels = arch_has && g.groups <= scheduler::kMaxGroups;
  if (self_check::use_fallback(mod) || !kernels || (!config && !has_candidate(*mod.table, req))) {
    TORCH_CHECK_VALUE(!config, msg(kOp, ": config '", std::string(config->data(), config->size()), "' cannot run "
                      "here: the grouped kernels are Hopper's (every MX format) and Blackwell's (MXFP8; FP8 x FP4 "
                      "with K % 128 == 0), and take at most ", scheduler::kMaxGroups, " experts"));
    return reference(g, a, b, offs, scale_a, scale_b, bias);
  }
  // The weight as the kernel reads it: the first expert's (N, K) rows, the others a fixed stride
  // apart (a stacked prepare_weight), 16-byte aligned as its TMA map needs.
  at::Tensor const w = b.transpose(1, 2);  // (E, N, Kb)
  int64_t const kb = w.size(2);
  // The experts' blocked scales back to back (the prefill kernels' pre-pass reads them as one stack).
  at::Tensor const sb = scale_b->size(0) > 1 && scale_b->stride(0) != scale_b->size(1) ? scale_b->contiguous() : *scale_b;
  TORCH_CHECK_VALUE(w.stride(2) == 1 && (g.n == 1 || (w.stride(1) >= kb && w.stride(1) % 16 == 0)) &&
                        w.stride(0) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(sb.data_ptr()) % 16 == 0,
                    msg(kOp, ": b must be a stacked prepare_weight (each expert's (N, K) rows 16-byte aligned, a "
                        "fixed stride apart), got b ", b.sizes(), " strides ", b.strides()));
  Groups const groups{offs, g.groups, g.group_rows, w.stride(0), sb.stride(0)};
  Operands in{a.reshape({g.rows, g.k}), w[0], g.format == Format::Mx ? scale_a->reshape({g.rows, mx_blocks(g.k)})
                                                                     : at::Tensor(),
              sb, {ScaleLayout::Plain, ScaleLayout::Blocked, "scale_b"}, &groups};
  Epilogue epi;
  if (bias) epi.bias = *bias;
  return shaped(launch(kOp, mod, req, in, p, epi));
}

// Inference only, as the other MX ops: a grad through it is refused, not silently dropped.
at::Tensor grouped_mm_autograd(at::Tensor const& a, at::Tensor const& b, at::Tensor const& offs,
                               std::optional<at::Tensor> const& scale_a, std::optional<at::Tensor> const& scale_b,
                               std::optional<at::Tensor> const& bias, std::optional<at::ScalarType> out_dtype,
                               std::optional<c10::string_view> config) {
  for (auto [name, t] : {std::pair<char const*, at::Tensor const*>{"a", &a}, {"b", &b},
                         {"bias", bias ? &*bias : nullptr}})
    TORCH_CHECK(!t || !at::GradMode::is_enabled() || !t->requires_grad(), msg(kOp, ": ", name, " requires grad, but grouped_mm is for inference "
                "(no backward); detach it or run under torch.no_grad()"));
  at::AutoDispatchBelowADInplaceOrView below;
  static auto const op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("persistent_gemm::grouped_mm", "")
                             .typed<decltype(grouped_mm_cpu)>();
  return op.call(a, b, offs, scale_a, scale_b, bias, out_dtype, config);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(persistent_gemm, m) {
  // MoE experts (issue 45), torch._grouped_mm's convention: the header of csrc/grouped.cpp says
  // the forms and formats. offs is never read on the host by the GPU path.
  m.def(
      "grouped_mm(Tensor a, Tensor b, Tensor offs, Tensor? scale_a=None, Tensor? scale_b=None, Tensor? bias=None, "
      "ScalarType? out_dtype=None, str? config=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(persistent_gemm, CPU, m) { m.impl("grouped_mm", &grouped_mm_cpu); }
TORCH_LIBRARY_IMPL(persistent_gemm, CUDA, m) { m.impl("grouped_mm", &grouped_mm_cuda); }
TORCH_LIBRARY_IMPL(persistent_gemm, Autograd, m) { m.impl("grouped_mm", &grouped_mm_autograd); }

}  // namespace persistent_gemm
