// The MoE routing ops around grouped_mm (issue 45): the schema, one set of checks for the CPU and
// CUDA entries, the CPU definitions, and the CUDA entries, which launch the arch module's kernels
// (host/moe_routing.cuh) on the current stream.
//
//   moe_dispatch(router_indices (T, k), E, rows) -> offs (E,) int32, slot_rows (T k,) int32, sorted
//     Slot s = t k + j is token t's j-th expert. The slots sorted stably by expert: slot s goes to
//     row slot_rows[s], and offs[e] counts the rows of experts 0..e (grouped_mm's offs). Each
//     tensor of `rows` (T, C) -- the activations, and their MX scales -- is gathered into that
//     order: sorted[i][slot_rows[s]] = rows[i][s / k].
//   moe_activation(h (R, 2I), kind) -> (R, I): gate columns [0, I), up [I, 2I), in fp32, rounded
//     once: "silu" SiLU(gate) * up; "gpt_oss" gpt-oss's clamped SwiGLU, gate <= limit,
//     |up| <= limit, (up + 1) * gate * sigmoid(alpha * gate).
//   moe_combine(y (T k, D), slot_rows, routing_weights (T, k)) -> (T, D): out[t] = the sum over
//     j = 0 .. k - 1, in that order, of w[t][j] * y[slot_rows[t k + j]], in fp32, rounded once.
//
// Values on the device are checked on the device: an index outside [0, E) (moe_dispatch) or a
// slot_rows entry outside y (moe_combine) makes the kernel print the entry and fail the launch;
// on the CPU the same checks raise eagerly. Nothing is read on the host, so a decode step
// captures in a CUDA graph.
#include <cmath>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks.h"
#include "device_info.h"
#include "dispatch.h"
#include "text.h"

namespace persistent_gemm {
namespace {

constexpr char kDispatch[] = "persistent_gemm.moe_dispatch";
constexpr char kActivation[] = "persistent_gemm.moe_activation";
constexpr char kCombine[] = "persistent_gemm.moe_combine";

bool is_float(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat; }

void check_float(char const* op, char const* arg, at::Tensor const& t) {
  TORCH_CHECK_TYPE(is_float(t.scalar_type()), msg(op, ": ", arg, " must be torch.bfloat16, torch.float16 or "
                   "torch.float32, got ", dtype_name(t.scalar_type())));
}

// Rows with unit column stride (what the kernels index), copied only if not.
at::Tensor unit_columns(at::Tensor const& t) { return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous(); }
int64_t row_stride(at::Tensor const& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); }

ArchModule const& module_for(char const* op, at::Tensor const& t) {
  ArchModule const* mod = arch_for_device(t.get_device());
  TORCH_CHECK(mod, msg(op, ": no persistent_gemm arch module is built for this GPU"));
  return *mod;
}

// Outputs filled with all-ones bytes (NaN in every float type, -1 in int32) before a launch when
// tests ask (set_poison_outputs): a value the kernel does not write shows.
void poison(std::initializer_list<at::Tensor const*> outs) {
  if (!poison_outputs()) return;
  for (at::Tensor const* t : outs)
    if (t->numel() > 0) t->view({-1}).view(at::kByte).fill_(0xFF);
}

void check_launch(char const* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, msg(op, ": launch failed: ", cudaGetErrorString(err)));
}

// ---- moe_dispatch ----------------------------------------------------------------------------

void check_dispatch(at::Tensor const& idx, int64_t experts, at::TensorList rows) {
  check_device_kind(kDispatch, idx);
  TORCH_CHECK_TYPE(idx.scalar_type() == at::kInt || idx.scalar_type() == at::kLong,
                   msg(kDispatch, ": router_indices must be torch.int32 or torch.int64 expert indices, got ",
                       dtype_name(idx.scalar_type())));
  TORCH_CHECK_VALUE(idx.dim() == 2 && idx.size(1) >= 1, msg(kDispatch, ": router_indices must be 2-D (tokens, "
                    "top_k) with top_k >= 1, got shape ", idx.sizes()));
  TORCH_CHECK_VALUE(experts >= 1 && experts <= kMoeMaxExperts, msg(kDispatch, ": num_experts must be in [1, ",
                    kMoeMaxExperts, "], got ", experts));
  TORCH_CHECK_VALUE(idx.numel() <= INT32_MAX, msg(kDispatch, ": router_indices has ", idx.numel(), " slots; "
                    "grouped_mm's offs are int32"));
  TORCH_CHECK_VALUE(rows.size() <= 2, msg(kDispatch, ": rows takes at most two tensors (the activations and "
                    "their scales), got ", rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string const name = "rows[" + std::to_string(i) + "]";
    check_same_device(kDispatch, idx, name.c_str(), rows[i]);
    TORCH_CHECK_VALUE(rows[i].dim() == 2 && rows[i].size(0) == idx.size(0),
                      msg(kDispatch, ": ", name, " must be 2-D with a row per token (", idx.size(0), " rows), got "
                          "shape ", rows[i].sizes()));
  }
}

std::vector<at::Tensor> sorted_like(at::TensorList rows, int64_t slots) {
  std::vector<at::Tensor> out;
  for (auto const& r : rows) out.push_back(at::empty({slots, r.size(1)}, r.options()));
  return out;
}

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> moe_dispatch_cpu(at::Tensor const& router_indices,
                                                                               int64_t num_experts, at::TensorList rows) {
  check_dispatch(router_indices, num_experts, rows);
  at::Tensor const idx = router_indices.to(at::kLong).contiguous();
  int64_t const top_k = idx.size(1), slots = idx.numel();
  int64_t const* e = idx.data_ptr<int64_t>();
  std::vector<int64_t> count(num_experts, 0);
  for (int64_t s = 0; s < slots; ++s) {
    TORCH_CHECK_VALUE(e[s] >= 0 && e[s] < num_experts, msg(kDispatch, ": router_indices[", s / top_k, "][",
                      s % top_k, "] = ", e[s], " is not an expert index in [0, ", num_experts, ")"));
    ++count[e[s]];
  }
  at::Tensor offs = at::empty({num_experts}, idx.options().dtype(at::kInt));
  std::vector<int64_t> next(num_experts, 0);
  for (int64_t x = 0, run = 0; x < num_experts; ++x) next[x] = run, run += count[x], offs.data_ptr<int32_t>()[x] = int32_t(run);
  at::Tensor slot_rows = at::empty({slots}, offs.options());
  at::Tensor source = at::empty({slots}, idx.options());  // sorted row -> token
  for (int64_t s = 0; s < slots; ++s) {
    int64_t const r = next[e[s]]++;
    slot_rows.data_ptr<int32_t>()[s] = int32_t(r);
    source.data_ptr<int64_t>()[r] = s / top_k;
  }
  std::vector<at::Tensor> sorted;
  for (auto const& r : rows) sorted.push_back(r.index_select(0, source));
  return {offs, slot_rows, sorted};
}

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> moe_dispatch_cuda(at::Tensor const& router_indices,
                                                                                int64_t num_experts, at::TensorList rows) {
  check_dispatch(router_indices, num_experts, rows);
  c10::cuda::CUDAGuard guard(router_indices.device());
  int64_t const slots = router_indices.numel();
  at::Tensor const idx = router_indices.contiguous();
  at::Tensor offs = at::empty({num_experts}, idx.options().dtype(at::kInt));
  at::Tensor slot_rows = at::empty({slots}, offs.options());
  std::vector<at::Tensor> src;
  for (auto const& r : rows) src.push_back(unit_columns(r));
  std::vector<at::Tensor> sorted = sorted_like(src, slots);
  if (slots == 0) return {offs.zero_(), slot_rows, sorted};
  MoeDispatchJob job;
  job.indices = idx.data_ptr();
  job.indices_64 = idx.scalar_type() == at::kLong;
  job.tokens = idx.size(0), job.top_k = int32_t(idx.size(1)), job.experts = int32_t(num_experts);
  job.offs = offs.data_ptr<int32_t>(), job.slot_rows = slot_rows.data_ptr<int32_t>();
  for (size_t i = 0; i < src.size(); ++i) {
    int64_t const elem = src[i].element_size();
    job.gather[i] = {src[i].data_ptr(), row_stride(src[i]) * elem, sorted[i].data_ptr(), src[i].size(1) * elem};
  }
  job.gathers = int32_t(src.size());
  job.sm_count = device_info(idx.get_device()).sm_count;
  poison({&offs, &slot_rows});
  for (auto const& t : sorted) poison({&t});
  check_launch(kDispatch, module_for(kDispatch, idx).table->moe_dispatch(
                              job, c10::cuda::getCurrentCUDAStream(idx.get_device())));
  return {offs, slot_rows, sorted};
}

// ---- moe_activation --------------------------------------------------------------------------

struct ActivationCall {
  bool gpt_oss = false;
  at::ScalarType out = at::kBFloat16;
};

ActivationCall check_activation(at::Tensor const& h, c10::string_view kind, std::optional<at::ScalarType> out_dtype) {
  check_device_kind(kActivation, h);
  check_float(kActivation, "h", h);
  TORCH_CHECK_VALUE(h.dim() == 2 && h.size(1) % 2 == 0, msg(kActivation, ": h must be 2-D (rows, 2 x intermediate) "
                    "(the gate columns, then the up columns), got shape ", h.sizes()));
  TORCH_CHECK_VALUE(kind == "silu" || kind == "gpt_oss", msg(kActivation, ": kind must be 'silu' or 'gpt_oss', got '",
                    std::string(kind.data(), kind.size()), "'"));
  return {kind == "gpt_oss", resolve_out(kActivation, out_dtype, h.scalar_type())};
}

// The kernel's formula (host/moe_routing.cuh), in the same order: no fused multiply-add.
float activation_ref(float gate, float up, bool gpt_oss, float alpha, float limit) {
  if (!gpt_oss) return gate / (1.0f + std::exp(-gate)) * up;
  gate = gate > limit ? limit : gate;
  up = up > limit ? limit : (up < -limit ? -limit : up);
  return (up + 1.0f) * (gate / (1.0f + std::exp(-(alpha * gate))));
}

at::Tensor moe_activation_cpu(at::Tensor const& h, c10::string_view kind, double alpha, double limit,
                              std::optional<at::ScalarType> out_dtype) {
  ActivationCall const c = check_activation(h, kind, out_dtype);
  at::Tensor const hf = h.to(at::kFloat).contiguous();
  int64_t const rows = h.size(0), inter = h.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, hf.options());
  float const* in = hf.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i)
      o[r * inter + i] = activation_ref(in[r * 2 * inter + i], in[r * 2 * inter + inter + i], c.gpt_oss,
                                        float(alpha), float(limit));
  return out.to(c.out);
}

at::Tensor moe_activation_cuda(at::Tensor const& h, c10::string_view kind, double alpha, double limit,
                               std::optional<at::ScalarType> out_dtype) {
  ActivationCall const c = check_activation(h, kind, out_dtype);
  c10::cuda::CUDAGuard guard(h.device());
  at::Tensor const hs = unit_columns(h);
  at::Tensor out = at::empty({h.size(0), h.size(1) / 2}, h.options().dtype(c.out));
  MoeActivationJob job;
  job.h = hs.data_ptr(), job.h_dtype = to_dtype(hs.scalar_type()), job.ld_h = row_stride(hs);
  job.out = out.data_ptr(), job.out_dtype = to_dtype(c.out), job.ld_out = out.size(1);
  job.rows = out.size(0), job.inter = out.size(1);
  job.gpt_oss = c.gpt_oss, job.alpha = float(alpha), job.limit = float(limit);
  poison({&out});
  check_launch(kActivation, module_for(kActivation, h).table->moe_activation(
                                job, c10::cuda::getCurrentCUDAStream(h.get_device())));
  return out;
}

// ---- moe_combine -----------------------------------------------------------------------------

at::ScalarType check_combine(at::Tensor const& y, at::Tensor const& slot_rows, at::Tensor const& w,
                             std::optional<at::ScalarType> out_dtype) {
  check_device_kind(kCombine, y);
  check_same_device(kCombine, y, "slot_rows", slot_rows);
  check_same_device(kCombine, y, "routing_weights", w);
  check_float(kCombine, "y", y);
  check_float(kCombine, "routing_weights", w);
  TORCH_CHECK_TYPE(slot_rows.scalar_type() == at::kInt, msg(kCombine, ": slot_rows must be torch.int32 (what "
                   "moe_dispatch returns), got ", dtype_name(slot_rows.scalar_type())));
  TORCH_CHECK_VALUE(w.dim() == 2, msg(kCombine, ": routing_weights must be 2-D (tokens, top_k), got shape ", w.sizes()));
  TORCH_CHECK_VALUE(slot_rows.dim() == 1 && slot_rows.size(0) == w.numel(), msg(kCombine, ": slot_rows must be 1-D "
                    "with a row per slot (tokens x top_k = ", w.numel(), "), got shape ", slot_rows.sizes()));
  TORCH_CHECK_VALUE(y.dim() == 2 && y.size(0) == w.numel(), msg(kCombine, ": y must be 2-D with a row per slot ("
                    "tokens x top_k = ", w.numel(), " rows), got shape ", y.sizes()));
  return resolve_out(kCombine, out_dtype, y.scalar_type());
}

at::Tensor moe_combine_cpu(at::Tensor const& y, at::Tensor const& slot_rows, at::Tensor const& routing_weights,
                           std::optional<at::ScalarType> out_dtype) {
  at::ScalarType const out_t = check_combine(y, slot_rows, routing_weights, out_dtype);
  at::Tensor const yf = y.to(at::kFloat).contiguous(), wf = routing_weights.to(at::kFloat).contiguous();
  at::Tensor const sr = slot_rows.contiguous();
  int64_t const tokens = wf.size(0), top_k = wf.size(1), d = y.size(1);
  at::Tensor out = at::zeros({tokens, d}, yf.options());
  float const* yp = yf.data_ptr<float>();
  float const* wp = wf.data_ptr<float>();
  int32_t const* rp = sr.data_ptr<int32_t>();
  float* o = out.data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t k = 0; k < top_k; ++k) {
      int64_t const row = rp[t * top_k + k];
      TORCH_CHECK_VALUE(row >= 0 && row < y.size(0), msg(kCombine, ": slot_rows[", t * top_k + k, "] = ", row,
                        " is not a row of y (", y.size(0), " rows)"));
      float const wt = wp[t * top_k + k];
      for (int64_t c = 0; c < d; ++c) {
        float const prod = wt * yp[row * d + c];
        o[t * d + c] = o[t * d + c] + prod;
      }
    }
  return out.to(out_t);
}

at::Tensor moe_combine_cuda(at::Tensor const& y, at::Tensor const& slot_rows, at::Tensor const& routing_weights,
                            std::optional<at::ScalarType> out_dtype) {
  at::ScalarType const out_t = check_combine(y, slot_rows, routing_weights, out_dtype);
  c10::cuda::CUDAGuard guard(y.device());
  at::Tensor const ys = unit_columns(y), ws = routing_weights.contiguous(), sr = slot_rows.contiguous();
  at::Tensor out = at::empty({ws.size(0), y.size(1)}, y.options().dtype(out_t));
  MoeCombineJob job;
  job.y = ys.data_ptr(), job.y_dtype = to_dtype(ys.scalar_type()), job.ld_y = row_stride(ys);
  job.slot_rows = sr.data_ptr<int32_t>();
  job.weights = ws.data_ptr(), job.w_dtype = to_dtype(ws.scalar_type()), job.ld_w = ws.size(1);
  job.out = out.data_ptr(), job.out_dtype = to_dtype(out_t), job.ld_out = out.size(1);
  job.tokens = ws.size(0), job.top_k = ws.size(1), job.d = y.size(1), job.y_rows = y.size(0);
  poison({&out});
  check_launch(kCombine, module_for(kCombine, y).table->moe_combine(job, c10::cuda::getCurrentCUDAStream(y.get_device())));
  return out;
}

// ---- autograd: inference only, as grouped_mm -------------------------------------------------

void refuse_grad(char const* op, std::initializer_list<std::pair<char const*, at::Tensor const*>> args) {
  for (auto [name, t] : args)
    TORCH_CHECK(!at::GradMode::is_enabled() || !t->requires_grad(), msg(op, ": ", name, " requires grad, but the MoE routing ops are for inference "
                "(no backward); detach it or run under torch.no_grad()"));
}

template <class Fn>
auto typed_op(char const* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> moe_dispatch_autograd(at::Tensor const& router_indices,
                                                                                    int64_t num_experts,
                                                                                    at::TensorList rows) {
  for (size_t i = 0; i < rows.size(); ++i) refuse_grad(kDispatch, {{"rows", &rows[i]}});
  at::AutoDispatchBelowADInplaceOrView below;
  static auto const op = typed_op<decltype(moe_dispatch_cpu)>("persistent_gemm::moe_dispatch");
  return op.call(router_indices, num_experts, rows);
}

at::Tensor moe_activation_autograd(at::Tensor const& h, c10::string_view kind, double alpha, double limit,
                                   std::optional<at::ScalarType> out_dtype) {
  refuse_grad(kActivation, {{"h", &h}});
  at::AutoDispatchBelowADInplaceOrView below;
  static auto const op = typed_op<decltype(moe_activation_cpu)>("persistent_gemm::moe_activation");
  return op.call(h, kind, alpha, limit, out_dtype);
}

at::Tensor moe_combine_autograd(at::Tensor const& y, at::Tensor const& slot_rows, at::Tensor const& routing_weights,
                                std::optional<at::ScalarType> out_dtype) {
  refuse_grad(kCombine, {{"y", &y}, {"routing_weights", &routing_weights}});
  at::AutoDispatchBelowADInplaceOrView below;
  static auto const op = typed_op<decltype(moe_combine_cpu)>("persistent_gemm::moe_combine");
  return op.call(y, slot_rows, routing_weights, out_dtype);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(persistent_gemm, m) {
  // The header of csrc/moe_routing.cpp says what each computes; nothing on the GPU path reads a
  // value on the host.
  m.def("moe_dispatch(Tensor router_indices, int num_experts, Tensor[] rows) -> (Tensor, Tensor, Tensor[])");
  m.def("moe_activation(Tensor h, str kind, float alpha=1.702, float limit=7.0, ScalarType? out_dtype=None) -> Tensor");
  m.def("moe_combine(Tensor y, Tensor slot_rows, Tensor routing_weights, ScalarType? out_dtype=None) -> Tensor");
}
TORCH_LIBRARY_IMPL(persistent_gemm, CPU, m) {
  m.impl("moe_dispatch", &moe_dispatch_cpu);
  m.impl("moe_activation", &moe_activation_cpu);
  m.impl("moe_combine", &moe_combine_cpu);
}
TORCH_LIBRARY_IMPL(persistent_gemm, CUDA, m) {
  m.impl("moe_dispatch", &moe_dispatch_cuda);
  m.impl("moe_activation", &moe_activation_cuda);
  m.impl("moe_combine", &moe_combine_cuda);
}
TORCH_LIBRARY_IMPL(persistent_gemm, Autograd, m) {
  m.impl("moe_dispatch", &moe_dispatch_autograd);
  m.impl("moe_activation", &moe_activation_autograd);
  m.impl("moe_combine", &moe_combine_autograd);
}

}  // namespace persistent_gemm
