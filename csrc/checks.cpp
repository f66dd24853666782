#include "checks.h"
#include "dispatch.h"
#include "text.h"

#include <cstring>
#include <unordered_map>

#include <c10/util/Exception.h>

#include "persistent_gemm/host/catalogue.h"
#include "persistent_gemm/layout/mx_blocked.hpp"

namespace persistent_gemm {
std::string dtype_name(at::ScalarType t) { return "torch." + std::string(c10::getDtypeNames(t).first); }

void check_same_device(char const* op, at::Tensor const& a, char const* other_name,
                       at::Tensor const& other) {
  TORCH_CHECK_VALUE(a.device() == other.device(), msg(op, ": ", other_name, " is on ", other.device(),
                    " but a is on ", a.device(), "; all operands must be on one device"));
}

void check_device_kind(char const* op, at::Tensor const& a) {
  TORCH_CHECK_VALUE(a.device().is_cpu() || a.device().is_cuda(), msg(op,
                    ": tensors must be on CPU or CUDA, got ", a.device()));
}

namespace {

void check_2d(char const* op, char const* arg, at::Tensor const& t, char const* shape) {
  TORCH_CHECK_VALUE(t.defined(), msg(op, ": ", arg, " is undefined; expected a ", shape, " tensor"));
  TORCH_CHECK_VALUE(t.dim() == 2, msg(op, ": ", arg, " must be a 2-D tensor ", shape, ", got ", t.dim(),
                    "-D with shape ", t.sizes()));
}

void check_dtype(char const* op, char const* arg, at::Tensor const& t, at::ScalarType want) {
  TORCH_CHECK_TYPE(t.scalar_type() == want, msg(op, ": ", arg, " must be ", dtype_name(want), ", got ",
                   dtype_name(t.scalar_type())));
}

// A unit stride in the given dim, or a size-1 extent that makes either layout valid.
bool unit_in(at::Tensor const& t, int dim) { return t.stride(dim) == 1 || t.size(dim) <= 1; }

void check_row_major(char const* op, char const* arg, at::Tensor const& t, char const* what) {
  TORCH_CHECK_VALUE(unit_in(t, 1), msg(op, ": ", arg, " must be ", what, " (stride(1) == 1), got strides ",
                    t.strides(), "; call .contiguous()"));
}

void check_col_major(char const* op, char const* arg, at::Tensor const& t, char const* what) {
  TORCH_CHECK_VALUE(unit_in(t, 0), msg(op, ": ", arg, " must be ", what,
                    " (stride(0) == 1, e.g. w.t() for a row-major (N, K) weight), got strides ",
                    t.strides()));
}

}  // namespace

at::ScalarType resolve_out(char const* op, std::optional<at::ScalarType> out_dtype,
                           at::ScalarType fallback) {
  at::ScalarType o = out_dtype.value_or(fallback);
  TORCH_CHECK_TYPE(o == at::kBFloat16 || o == at::kHalf || o == at::kFloat, msg(op,
                   ": out_dtype must be torch.bfloat16, torch.float16 or torch.float32, got ",
                   dtype_name(o)));
  return o;
}

void check_scale_dtype(char const* op, char const* arg, at::Tensor const& s) {
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat8_e8m0fnu, msg(op, ": ", arg,
                   " must be torch.float8_e8m0fnu (one e8m0 scale per 1x32 block along K), got ",
                   dtype_name(s.scalar_type())));
}

namespace {

void check_block_scale(char const* op, char const* arg, at::Tensor const& s, int64_t rows,
                       char const* rows_name, int64_t k, ScaleLayout layout, char const* layout_arg) {
  int64_t const blocks = mx_blocks(k);
  if (layout == ScaleLayout::Blocked) {
    TORCH_CHECK_VALUE(s.defined(), msg(op, ": ", arg, " is undefined"));
    check_scale_dtype(op, arg, s);
    int64_t const want = mx_blocked::bytes(rows, blocks);
    TORCH_CHECK_VALUE(s.numel() == want, msg(op, ": ", arg, " in the blocked layout must hold ", want,
                      " scales ((", rows_name, " = ", rows, " rounded up to 128) x (ceil(K/32) = ", blocks,
                      " rounded up to 4)), got ", s.numel(), " with shape ", s.sizes(),
                      "; a plain (rows, ceil(K/32)) scale needs ", layout_arg, "='plain'"));
    TORCH_CHECK_VALUE(s.is_contiguous(), msg(op, ": ", arg, " in the blocked layout must be contiguous"));
    return;
  }
  check_2d(op, arg, s, "(rows, ceil(K/32))");
  check_scale_dtype(op, arg, s);
  TORCH_CHECK_VALUE(s.size(0) == rows && s.size(1) == blocks, msg(op, ": ", arg, " must have shape (",
                    rows_name, ", ceil(K/32)) = (", rows, ", ", blocks, "), got ", s.sizes()));
  check_row_major(op, arg, s, "row-major");
}

// a (M, K) against b (K, N); a weight stored (N, K) and passed without .t() gets the fix named.
void check_k(char const* op, at::Tensor const& a, at::Tensor const& b) {
  TORCH_CHECK_VALUE(a.size(1) == b.size(0),
                    msg(op, ": a is (M, K) = ", a.sizes(), " and b is (K, N) = ", b.sizes(), "; their K extents differ",
                        b.size(1) == a.size(1) ? "; b looks like the (N, K) weight itself: pass its transpose, w.t()"
                                               : ""));
}

// An e2m1 weight b (K/2, N) of packed pairs against a's K: whole 1x32 blocks, and a weight stored
// (N, K/2) passed without .t() gets the fix named.
void check_e2m1_k(char const* op, at::Tensor const& b, int64_t k) {
  check_e2m1_extent(op, k);
  TORCH_CHECK_VALUE(b.size(0) * 2 == k || b.size(1) * 2 != k,
                    msg(op, ": b is ", b.sizes(), ", which looks like the (N, K/2) packed weight itself; pass its "
                        "transpose (K/2, N) = (", k / 2, ", ", b.size(0), "): wq.t()"));
  TORCH_CHECK_VALUE(b.size(0) * 2 == k, msg(op, ": b holds two e2m1 values per byte, so it must be (K/2, N) with "
                    "K/2 = ", k / 2, " (a's K = ", k, " halved), got ", b.sizes()));
}

// Ranks, devices and dtypes shared by the two MX ops (a is always e4m3 with e8m0 scales).
void check_block_scaled_operands(char const* op, at::Tensor const& a, at::Tensor const& b,
                                 at::Tensor const& scale_a, at::Tensor const& scale_b, char const* b_shape,
                                 at::ScalarType b_dtype) {
  // The MX ops take torch._scaled_mm's order, operands first; an e8m0 tensor in an operand's slot
  // is the (a, a_scale, b, b_scale) order of persistent_gemm 0.1: say so before any shape rule.
  for (auto const& [name, t] : {std::pair<char const*, at::Tensor const&>{"b", b}, {"a", a}})
    TORCH_CHECK_TYPE(!t.defined() || t.scalar_type() != at::kFloat8_e8m0fnu,
                     msg(op, " takes (a, b, scale_a, scale_b), torch._scaled_mm's order: operands first, then their "
                         "scales; got an e8m0 scale tensor as ", name,
                         " (the (a, a_scale, b, b_scale) order of persistent_gemm 0.1 is gone)"));
  check_2d(op, "a", a, "(M, K)");
  check_2d(op, "b", b, b_shape);
  check_device_kind(op, a);
  check_same_device(op, a, "b", b);
  check_same_device(op, a, "scale_a", scale_a);
  check_same_device(op, a, "scale_b", scale_b);
  check_dtype(op, "a", a, at::kFloat8_e4m3fn);
  check_dtype(op, "b", b, b_dtype);
}

}  // namespace

void check_e2m1_extent(char const* op, int64_t k) {
  TORCH_CHECK_VALUE(k % kMxBlock == 0, msg(op, ": K = ", k,
                    " must be a multiple of 32 (whole e2m1 scale blocks; packed rows 16-byte aligned)"));
}

ScaleLayout parse_scale_layout(char const* op, c10::string_view layout, char const* arg) {
  if (layout == "plain") return ScaleLayout::Plain;
  if (layout == "blocked") return ScaleLayout::Blocked;
  TORCH_CHECK_VALUE(false, msg(op, ": ", arg, " must be 'plain' or 'blocked', got '",
                    std::string(layout.data(), layout.size()), "'"));
}

ScaleLayouts parse_scale_layouts(char const* op, c10::string_view layout,
                                 std::optional<c10::string_view> b_layout) {
  ScaleLayout const a = parse_scale_layout(op, layout, "scale_layout");
  if (!b_layout) return {a, a, "scale_layout"};
  return {a, parse_scale_layout(op, *b_layout, "scale_b_layout"), "scale_b_layout"};
}

namespace {
// What the checks need of a config name, read off the fields codegen wrote from Python's
// parse_name (host::CatalogueRow, KernelEntry): the name is parsed once, there.
struct ConfigTraits {
  std::string family;
  bool fast_accum;
};
// Catalogue configs, and configs registered in this process (built, or JIT-compiled by
// persistent_gemm.jit); nullptr for an unknown name. A per-thread map, rebuilt when the registry
// changes: this is on the path of every call that forces a config.
ConfigTraits const* config_traits(std::string const& name) {
  thread_local uint64_t generation = ~uint64_t(0);
  thread_local std::unordered_map<std::string, ConfigTraits> known;
  uint64_t const now = registry_generation();
  if (now != generation) {
    known.clear();
    for (auto const& row : host::catalogue())
      if (row.in_catalogue) known.emplace(row.name, ConfigTraits{row.family, row.fast_accum});
    for (auto const& mod : registered_arches())
      for (int i = 0; i < mod.table->count; ++i) {
        KernelEntry const& e = mod.table->entries[i];
        known.emplace(e.config, ConfigTraits{e.family, e.fast_accum});
      }
    generation = now;
  }
  auto const it = known.find(name);
  return it == known.end() ? nullptr : &it->second;
}
}  // namespace

void check_config(char const* op, std::optional<c10::string_view> config,
                  std::initializer_list<char const*> families) {
  if (!config.has_value()) return;
  std::string const name(config->data(), config->size());
  if (ConfigTraits const* t = config_traits(name)) {
    for (char const* f : families)
      if (t->family == f) return;
    std::string want;
    for (char const* f : families) want += std::string(f) + " ";
    TORCH_CHECK_VALUE(false, msg(op, ": config '", name, "' is a ", t->family, " kernel; this op takes ",
                      want, "kernels"));
  }
  std::string names;
  for (auto const& row : host::catalogue())
    if (row.in_catalogue) names += std::string("\n  ") + row.name;
  TORCH_CHECK_VALUE(false, msg(op, ": unknown config '", name, "': neither in the catalogue nor compiled in this process "
                    "(persistent_gemm's Python ops JIT-compile any valid config; PGEMM_JIT=0 turns that off); "
                    "the catalogue has:", names));
}

void check_config_accum(char const* op, std::optional<c10::string_view> config, bool use_fast_accum) {
  if (!config.has_value() || use_fast_accum) return;
  std::string const name(config->data(), config->size());
  ConfigTraits const* t = config_traits(name);  // an unknown name is check_config's to report
  TORCH_CHECK_VALUE(!t || !t->fast_accum, msg(op, ": config '", name, "' accumulates FP8 products at reduced "
                    "precision (fast accumulation), but use_fast_accum=False asks for fp32-promoted sums; pass "
                    "use_fast_accum=True or a config without '_fastacc'"));
}

Problem check_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                 std::optional<at::ScalarType> out_dtype) {
  check_2d(op, "a", a, "(M, K)");
  check_2d(op, "b", b, "(K, N)");
  check_device_kind(op, a);
  check_same_device(op, a, "b", b);
  auto const t = a.scalar_type();
  TORCH_CHECK_TYPE(t == at::kBFloat16 || t == at::kHalf, msg(op,
                   ": a must be torch.bfloat16 or torch.float16, got ", dtype_name(t)));
  TORCH_CHECK_TYPE(b.scalar_type() == t, msg(op, ": b must have a's dtype ", dtype_name(t), ", got ",
                   dtype_name(b.scalar_type())));
  check_k(op, a, b);
  // Any strides, as torch.mm: the CUDA path copies an operand TMA cannot read as it is
  // (no unit stride, stride-0 broadcast views, misaligned rows) -- explain() shows it.
  return {a.size(0), b.size(1), a.size(1), resolve_out(op, out_dtype, t)};
}

Problem check_scaled_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                        at::Tensor const& scale_a, at::Tensor const& scale_b,
                        std::optional<at::ScalarType> out_dtype, ScaleKind& kind) {
  check_2d(op, "a", a, "(M, K)");
  check_2d(op, "b", b, "(K, N)");
  check_device_kind(op, a);
  check_same_device(op, a, "b", b);
  check_dtype(op, "a", a, at::kFloat8_e4m3fn);
  check_dtype(op, "b", b, at::kFloat8_e4m3fn);
  check_k(op, a, b);
  check_row_major(op, "a", a, "row-major (M, K)");
  check_col_major(op, "b", b, "column-major (K, N)");
  int64_t const m = a.size(0), n = b.size(1);
  for (auto const& [name, s] : {std::pair<char const*, at::Tensor const&>{"scale_a", scale_a},
                                {"scale_b", scale_b}}) {
    TORCH_CHECK_VALUE(s.defined(), msg(op, ": ", name, " is undefined"));
    check_same_device(op, a, name, s);
    check_dtype(op, name, s, at::kFloat);
  }
  bool const tensorwise = scale_a.numel() == 1 && scale_b.numel() == 1 && scale_a.dim() <= 2 &&
                          scale_b.dim() <= 2;
  if (tensorwise) {
    kind = ScaleKind::Tensorwise;
  } else {
    // One scalar beside one vector is a mix of the two modes: say so, not "scale_a is wrong".
    bool const a_scalar = scale_a.numel() == 1 && scale_a.dim() <= 2 && m != 1;
    bool const b_scalar = scale_b.numel() == 1 && scale_b.dim() <= 2 && n != 1;
    TORCH_CHECK_VALUE(a_scalar == b_scalar, msg(op, ": scale_a and scale_b must both be tensorwise (one element "
                      "each) or both rowwise ((M, 1) = (", m, ", 1) and (1, N) = (1, ", n, ")); got scale_a ",
                      scale_a.sizes(), " (", a_scalar ? "tensorwise" : "rowwise", ") and scale_b ", scale_b.sizes(),
                      " (", b_scalar ? "tensorwise" : "rowwise", ")"));
    TORCH_CHECK_VALUE(scale_a.dim() == 2 && scale_a.size(0) == m && scale_a.size(1) == 1, msg(op,
                      ": scale_a must be a scalar (tensorwise) or (M, 1) = (", m, ", 1) (rowwise), got ",
                      scale_a.sizes()));
    TORCH_CHECK_VALUE(scale_b.dim() == 2 && scale_b.size(0) == 1 && scale_b.size(1) == n, msg(op,
                      ": scale_b must be a scalar (tensorwise) or (1, N) = (1, ", n, ") (rowwise), got ",
                      scale_b.sizes()));
    // Any strides, broadcast views included (as mxfp8_mm takes them): the CUDA entry copies them contiguous.
    kind = ScaleKind::Rowwise;
  }
  return {m, n, a.size(1), resolve_out(op, out_dtype, at::kBFloat16)};
}

Problem check_mxfp8_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                       at::Tensor const& scale_a, at::Tensor const& scale_b,
                       std::optional<at::ScalarType> out_dtype, ScaleLayouts layout) {
  check_block_scaled_operands(op, a, b, scale_a, scale_b, "(K, N)", at::kFloat8_e4m3fn);
  check_k(op, a, b);
  check_row_major(op, "a", a, "row-major (M, K)");
  check_col_major(op, "b", b, "column-major (K, N)");
  int64_t const m = a.size(0), n = b.size(1), k = a.size(1);
  check_block_scale(op, "scale_a", scale_a, m, "M", k, layout.a, "scale_layout");
  check_block_scale(op, "scale_b", scale_b, n, "N", k, layout.b, layout.b_arg);
  return {m, n, k, resolve_out(op, out_dtype, at::kBFloat16)};
}

Problem check_fp8_fp4_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                         at::Tensor const& scale_a, at::Tensor const& scale_b,
                         std::optional<at::ScalarType> out_dtype, ScaleLayouts layout) {
  check_block_scaled_operands(op, a, b, scale_a, scale_b, "(K/2, N) of packed e2m1 pairs",
                              at::kFloat4_e2m1fn_x2);
  int64_t const m = a.size(0), n = b.size(1), k = a.size(1);
  check_e2m1_k(op, b, k);
  check_row_major(op, "a", a, "row-major (M, K)");
  check_col_major(op, "b", b, "column-major (K/2, N)");
  check_block_scale(op, "scale_a", scale_a, m, "M", k, layout.a, "scale_layout");
  check_block_scale(op, "scale_b", scale_b, n, "N", k, layout.b, layout.b_arg);
  return {m, n, k, resolve_out(op, out_dtype, at::kBFloat16)};
}

Problem check_weight_only_mm(char const* op, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                             std::optional<at::ScalarType> out_dtype, ScaleLayout layout) {
  TORCH_CHECK_TYPE(!b.defined() || b.scalar_type() != at::kFloat8_e8m0fnu,
                   msg(op, " takes (a, b, scale_b): got an e8m0 scale tensor as b"));
  check_2d(op, "a", a, "(M, K)");
  check_2d(op, "b", b, "(K, N) e4m3 or (K/2, N) packed e2m1");
  check_device_kind(op, a);
  check_same_device(op, a, "b", b);
  check_same_device(op, a, "scale_b", scale_b);
  auto const t = a.scalar_type();
  TORCH_CHECK_TYPE(t == at::kBFloat16 || t == at::kHalf, msg(op, ": a must be torch.bfloat16 or torch.float16 (the "
                   "activations stay 16-bit; e4m3 activations are mxfp8_mm / fp8_fp4_mm), got ", dtype_name(t)));
  bool const e2m1 = b.scalar_type() == at::kFloat4_e2m1fn_x2;
  TORCH_CHECK_TYPE(e2m1 || b.scalar_type() == at::kFloat8_e4m3fn, msg(op, ": b must be torch.float8_e4m3fn (MXFP8) "
                   "or torch.float4_e2m1fn_x2 (MXFP4, two values per byte), got ", dtype_name(b.scalar_type())));
  int64_t const m = a.size(0), n = b.size(1), k = a.size(1);
  if (e2m1)
    check_e2m1_k(op, b, k);
  else
    check_k(op, a, b);
  check_row_major(op, "a", a, "row-major (M, K)");
  check_col_major(op, "b", b, e2m1 ? "column-major (K/2, N)" : "column-major (K, N)");
  check_block_scale(op, "scale_b", scale_b, n, "N", k, layout, "scale_b_layout");
  at::ScalarType const o = out_dtype.value_or(t);
  TORCH_CHECK_TYPE(o == t || o == at::kFloat, msg(op, ": out_dtype must be a's dtype ", dtype_name(t),
                   " or torch.float32, got ", dtype_name(o)));
  return {m, n, k, o};
}

Epilogue check_epilogue(char const* op, at::Tensor const& a, std::optional<at::Tensor> const& bias, double alpha,
                        double beta, Problem const& p) {
  Epilogue e;
  e.alpha = alpha;
  e.beta = beta;
  if (!bias || !bias->defined()) return e;
  at::Tensor const& t = *bias;
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == p.n, msg(op, ": bias must be a 1-D tensor of N = ", p.n,
                    " elements (one per output column), got shape ", t.sizes()));
  TORCH_CHECK_TYPE(t.scalar_type() == p.out_dtype, msg(op, ": bias must have the output's dtype ",
                   dtype_name(p.out_dtype), ", got ", dtype_name(t.scalar_type())));
  check_same_device(op, a, "bias", t);
  if (beta != 0.0) e.bias = t;
  return e;
}

at::Tensor epilogue_reference(at::Tensor acc, Epilogue const& epi, at::ScalarType out_dtype) {
  if (epi.alpha != 1.0) acc = acc * epi.alpha;
  if (epi.bias.defined()) acc = acc + epi.bias.to(at::kFloat) * epi.beta;
  return acc.to(out_dtype);
}

CheckedCall checked_mm(char const* op, at::Tensor const& a, at::Tensor const& b,
                       std::optional<at::ScalarType> out_dtype, std::optional<c10::string_view> config,
                       std::optional<at::Tensor> const& bias, double alpha, double beta) {
  CheckedCall c;
  c.p = check_mm(op, a, b, out_dtype);
  check_config(op, config, {a.scalar_type() == at::kBFloat16 ? "bf16" : "fp16"});
  c.epi = check_epilogue(op, a, bias, alpha, beta, c.p);
  return c;
}

CheckedCall checked_scaled_mm(char const* op, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_a,
                              at::Tensor const& scale_b, std::optional<at::ScalarType> out_dtype, bool use_fast_accum,
                              std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias,
                              double alpha, double beta) {
  CheckedCall c;
  c.p = check_scaled_mm(op, a, b, scale_a, scale_b, out_dtype, c.kind);
  check_config(op, config, {"e4m3"});
  check_config_accum(op, config, use_fast_accum);
  c.epi = check_epilogue(op, a, bias, alpha, beta, c.p);
  return c;
}

CheckedCall checked_mx_mm(char const* op, bool e2m1, at::Tensor const& a, at::Tensor const& b,
                          at::Tensor const& scale_a, at::Tensor const& scale_b,
                          std::optional<at::ScalarType> out_dtype, c10::string_view scale_layout,
                          std::optional<c10::string_view> config, std::optional<c10::string_view> scale_b_layout,
                          std::optional<at::Tensor> const& bias) {
  CheckedCall c;
  c.layouts = parse_scale_layouts(op, scale_layout, scale_b_layout);
  c.p = e2m1 ? check_fp8_fp4_mm(op, a, b, scale_a, scale_b, out_dtype, c.layouts)
             : check_mxfp8_mm(op, a, b, scale_a, scale_b, out_dtype, c.layouts);
  check_config(op, config, {e2m1 ? "e4m3xe2m1" : "mxfp8"});
  c.epi = check_epilogue(op, a, bias, 1.0, 1.0, c.p);
  return c;
}

CheckedCall checked_weight_only_mm(char const* op, at::Tensor const& a, at::Tensor const& b, at::Tensor const& scale_b,
                                   std::optional<at::ScalarType> out_dtype, c10::string_view scale_b_layout,
                                   std::optional<c10::string_view> config, std::optional<at::Tensor> const& bias) {
  CheckedCall c;
  c.layouts.b = parse_scale_layout(op, scale_b_layout, "scale_b_layout");
  c.p = check_weight_only_mm(op, a, b, scale_b, out_dtype, c.layouts.b);
  check_config(op, config, {b.scalar_type() == at::kFloat4_e2m1fn_x2 ? "bf16xe2m1" : "bf16xe4m3"});
  c.epi = check_epilogue(op, a, bias, 1.0, 1.0, c.p);
  return c;
}

}  // namespace persistent_gemm
