// First-use self-check of kernels the project could not run on their hardware (self_check.h).
#include "self_check.h"

#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include "checks.h"
#include "device_info.h"
#include "reference.h"
#include "text.h"

namespace persistent_gemm::self_check {
namespace {

enum class Mode { Auto, All, Off };

Mode mode() {
  static Mode const m = [] {
    char const* v = std::getenv("PGEMM_SELF_CHECK");
    std::string const s = v ? v : "auto";
    if (s == "all") return Mode::All;
    if (s == "off" || s == "0") return Mode::Off;
    TORCH_CHECK_VALUE(s == "auto" || s.empty(),
                      msg("PGEMM_SELF_CHECK must be auto, all or off, got '", s, "'"));
    return Mode::Auto;
  }();
  return m;
}

bool env_is(char const* name, char const* value) {
  char const* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

thread_local bool t_running = false;
thread_local int t_workers = 0;

enum class State { Passed, Failed };
constexpr char const* kWayOut =
    "Set PGEMM_FALLBACK=torch to run persistent_gemm's ops with their reference implementations (dequantize, "
    "then an fp32 torch.mm) on this GPU, or pass config= to force another kernel; please report this failure.";
struct Record {
  State state;
  std::string report;  // the failure message, repeated on later calls
};
std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<KernelEntry const*, Record>& records() {
  static std::unordered_map<KernelEntry const*, Record> r;
  return r;
}

at::ScalarType torch_dtype(DType d) {
  switch (d) {
    case DType::BF16: return at::kBFloat16;
    case DType::FP16: return at::kHalf;
    case DType::FP32: return at::kFloat;
    default: return at::kBFloat16;
  }
}

using Shape = CheckShape;

struct Outcome {
  double err = 0, bound = 0;
  double worst = 0;        // the largest element error, relative to the largest |float64| value
  int64_t non_finite = 0;  // elements whose finiteness (or NaN / +-inf class) differs from float64's
  // A norm-wise bound misses one wrong element among a million; `worst` catches it (loosely:
  // a wrong tile or element lands near 1).
  bool ok() const { return non_finite == 0 && err <= bound && worst <= 2e-2; }
};

// `got` against the float64 product `exact` of the same operands, beside the peer: the op's CPU
// reference (fp32 accumulation, one rounding) on those operands. The tests' rule: within 2x the
// peer's error plus `floor`, relative Frobenius over the elements float64 finds finite; the
// non-finite ones (NaN scales, infinite inputs) must be non-finite alike.
Outcome compare(at::Tensor got, at::Tensor const& peer, at::Tensor const& exact, double floor, Shape const& s) {
  got = got.to(at::kCPU).to(at::kDouble);
  auto const finite = at::isfinite(exact);
  double const top = std::max(at::where(finite, exact, 0.0).abs().max().item<double>(), 1e-30);
  if (env_is("PGEMM_SELF_CHECK_INJECT_FAULT", "1"))
    got.index_put_({s.m - 1, s.n - 1}, got.index({s.m - 1, s.n - 1}) + top);
  auto const klass = [](at::Tensor const& t) { return at::isnan(t).to(at::kByte) + 2 * at::isposinf(t).to(at::kByte) +
                                                       4 * at::isneginf(t).to(at::kByte); };
  Outcome o;
  o.non_finite = (klass(got) != klass(exact)).sum().item<int64_t>();
  auto const ref = at::where(finite, exact, 0.0);
  double const norm = std::max(ref.norm().item<double>(), 1e-30);
  auto err = [&](at::Tensor const& t) {
    return at::where(finite, t.to(at::kCPU).to(at::kDouble) - exact, 0.0).norm().item<double>() / norm;
  };
  o.err = err(at::nan_to_num(got, 0.0, 0.0, 0.0));
  o.bound = 2.0 * err(peer) + floor;
  o.worst = at::where(finite, at::nan_to_num(got, 0.0, 0.0, 0.0) - exact, 0.0).abs().max().item<double>() / top;
  return o;
}

// Runs `e`'s op with `e` forced on fresh inputs (from a private generator: the caller's random
// stream is not touched), with an infinite or NaN input (or e8m0 code 255) in row 0 and e8m0
// code 0 beside wide-range codes; MX scales plain in the first problem and blocked in the others.
Outcome run_check(KernelEntry const& e, int device, Shape const& s, bool blocked) {
  auto gen = at::detail::createCPUGenerator(0x5eed);
  auto const cpu = at::TensorOptions().device(at::kCPU);
  auto const dev = at::TensorOptions().device(at::kCUDA, device);
  at::ScalarType const out = torch_dtype(e.d_dtype);
  std::optional<c10::string_view> const config = c10::string_view(e.config);
  auto randn = [&](int64_t r, int64_t c) { return at::randn({r, c}, gen, cpu.dtype(at::kFloat)); };
  auto on = [&](at::Tensor const& t) { return t.to(dev.device()); };
  // e8m0 codes 2^-20 .. 2^20 per (row, block), plain layout; row 1's codes 2^-127 .. 2^-88, code
  // 0 (2^-127) in its first block (the bf16 routes fold scales relative to the row's largest
  // code: within ~124 binades a row is exact, docs/design/sm90_mx_mainloop.md); with `nan_row0`,
  // code 255 (NaN) in row 0's first block.
  auto codes = [&](int64_t rows, int64_t k, bool nan_row0) {
    auto c = at::randint(107, 148, {rows, mx_blocks(k)}, gen, cpu.dtype(at::kByte));
    if (rows > 1) c.select(0, 1).random_(0, 40, gen), c.index_put_({1, 0}, 0);
    if (nan_row0) c.index_put_({0, 0}, 255);
    return c.view(at::kFloat8_e8m0fnu);
  };
  auto mx64 = [&](at::Tensor const& rows_by_k, at::Tensor const& plain_codes, bool e2m1) {
    auto const v = e2m1 ? unpack_e2m1(rows_by_k) : rows_by_k.to(at::kFloat);
    int64_t const k = v.size(1);
    return v.to(at::kDouble) * block_scale_factors(plain_codes, v.size(0), k, ScaleLayout::Plain).to(at::kDouble);
  };
  if (e.scale_mode == ScaleMode::None) {
    at::ScalarType const in = torch_dtype(e.a_dtype);
    auto a = randn(s.m, s.k).to(in), b = randn(s.k, s.n).to(in);
    a.index_put_({0, 0}, std::numeric_limits<float>::infinity());
    if (!e.a_k_major) a = a.t().contiguous().t();
    if (!e.b_k_major) b = b.contiguous();
    else b = b.t().contiguous().t();
    auto got = mm_cuda(on(a), on(b), out, config, std::nullopt, 1.0, 1.0);
    return compare(got, mm_cpu(a, b, out, std::nullopt), a.to(at::kDouble).mm(b.to(at::kDouble)), 1e-6, s);
  }
  if (e.scale_mode == ScaleMode::Tensorwise || e.scale_mode == ScaleMode::Rowwise) {
    auto a = randn(s.m, s.k).to(at::kFloat8_e4m3fn);
    a.view(at::kByte).index_put_({0, 0}, 0x7F);  // e4m3 NaN (e4m3fn has no infinity)
    auto b = randn(s.n, s.k).to(at::kFloat8_e4m3fn).t();  // (K, N) column-major
    bool const row = e.scale_mode == ScaleMode::Rowwise;
    auto sa = (at::rand({row ? s.m : 1, 1}, gen, cpu.dtype(at::kFloat)) + 0.5);
    auto sb = (at::rand({1, row ? s.n : 1}, gen, cpu.dtype(at::kFloat)) + 0.5);
    auto exact = (a.to(at::kDouble) * sa.to(at::kDouble)).mm(b.to(at::kDouble) * sb.to(at::kDouble));
    if (!row) sa = sa.reshape({}), sb = sb.reshape({});
    auto got = scaled_mm_cuda(on(a), on(b), on(sa), on(sb), out, e.fast_accum, config, std::nullopt, 1.0, 1.0);
    // FP8 tensor cores' partial sums (promoted: 2^-13 per K-tile; fast: growing like sqrt(K)).
    double const floor = e.fast_accum ? 5e-5 * std::sqrt(double(s.k)) : 5e-4;
    return compare(got, scaled_mm_cpu(a, b, sa, sb, out, e.fast_accum, std::nullopt), exact, floor, s);
  }
  if (e.geometry.grouped) {
    // Grouped (MoE experts; the SM100 MXFP8 and FP8 x FP4 kernels, the grouped ones of a table
    // never run on hardware): the shape's rows over four experts -- about half, none, one row, the
    // rest (past a 128-row band when the shape has them) -- through grouped_mm with offs on the
    // device, a bias per expert.
    TORCH_CHECK(e.a_dtype == DType::E4M3, "persistent_gemm: the self-check's grouped problems have e4m3 "
                "activations, not ", e.config, "'s");
    bool const e2m1 = e.b_dtype == DType::E2M1;
    std::vector<int64_t> const counts{s.m / 2, 0, 1, s.m - s.m / 2 - 1};
    int64_t const groups = int64_t(counts.size());
    auto a = randn(s.m, s.k).mul(4).to(at::kFloat8_e4m3fn);
    auto const as = codes(s.m, s.k, /*nan_row0=*/true);
    std::vector<at::Tensor> ws, bss, blocked_bs;
    for (int64_t g = 0; g < groups; ++g) {
      ws.push_back(e2m1 ? at::randint(0, 256, {s.n, s.k / 2}, gen, cpu.dtype(at::kByte)).view(at::kFloat4_e2m1fn_x2)
                        : randn(s.n, s.k).mul(4).to(at::kFloat8_e4m3fn));  // (N, K) rows
      bss.push_back(codes(s.n, s.k, /*nan_row0=*/false));
      blocked_bs.push_back(blocked_scale(bss.back()).reshape({-1}));
    }
    auto const b = at::stack(ws).transpose(1, 2);  // (E, K or K/2, N): torch._grouped_mm's view of the rows
    auto const sb = at::stack(blocked_bs);          // (E, S) blocked, one row per expert
    auto const bias = randn(groups, s.n).to(out);
    auto const offs = at::cumsum(at::tensor(counts, cpu.dtype(at::kLong)), 0).to(at::kInt);
    static auto const op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("persistent_gemm::grouped_mm", "")
                               .typed<at::Tensor(at::Tensor const&, at::Tensor const&, at::Tensor const&,
                                                 std::optional<at::Tensor> const&, std::optional<at::Tensor> const&,
                                                 std::optional<at::Tensor> const&, std::optional<at::ScalarType>,
                                                 std::optional<c10::string_view>)>();
    auto got = op.call(on(a), on(b), on(offs), on(as), on(sb), on(bias), out, config);
    auto peer = op.call(a, b, offs, as, sb, bias, out, std::nullopt);  // the CPU reference
    auto exact = at::empty({s.m, s.n}, cpu.dtype(at::kDouble));
    auto const x = mx64(a, as, false);
    for (int64_t g = 0, row = 0; g < groups; row += counts[g], ++g)
      if (counts[g] > 0)
        exact.narrow(0, row, counts[g])
            .copy_(x.narrow(0, row, counts[g]).mm(mx64(ws[g], bss[g], e2m1).t()) + bias[g].to(at::kDouble));
    return compare(got, peer, exact, 5e-4, s);
  }
  bool const e2m1 = e.b_dtype == DType::E2M1;
  at::Tensor w = e2m1 ? at::randint(0, 256, {s.n, s.k / 2}, gen, cpu.dtype(at::kByte)).view(at::kFloat4_e2m1fn_x2)
                      : randn(s.n, s.k).mul(4).to(at::kFloat8_e4m3fn);  // (N, K) rows
  at::Tensor const b = w.t();                                           // (K, N) view
  char const* layout = blocked ? "blocked" : "plain";
  if (e.a_dtype == DType::BF16) {  // weight-only MX: bf16 activations as they are, no scales
    auto a = randn(s.m, s.k).to(at::kBFloat16);
    a.index_put_({0, 0}, std::numeric_limits<float>::infinity());
    auto const bs = codes(s.n, s.k, /*nan_row0=*/true);  // D's column 0 NaN
    auto got =
        weight_only_mm_cuda(on(a), on(b), on(blocked ? blocked_scale(bs) : bs), out, layout, config, std::nullopt);
    auto exact = a.to(at::kDouble).mm(mx64(w, bs, e2m1).t());
    return compare(got, weight_only_mm_ref(a, b, bs, out, "plain", std::nullopt, std::nullopt), exact, 1e-6, s);
  }
  auto a = randn(s.m, s.k).mul(4).to(at::kFloat8_e4m3fn);
  auto const as = codes(s.m, s.k, /*nan_row0=*/true), bs = codes(s.n, s.k, /*nan_row0=*/false);
  auto got = mx_mm_cuda(e2m1, on(a), on(b), on(blocked ? blocked_scale(as) : as), on(blocked ? blocked_scale(bs) : bs),
                        out, layout, config, std::nullopt, std::nullopt);
  auto exact = mx64(a, as, false).mm(mx64(w, bs, e2m1).t());
  // The per-32 promotion route's e4m3 tensor-core sums, as the MX tests allow (MX_FLOOR).
  return compare(got, mx_mm_ref(e2m1, a, b, as, bs, out, "plain", std::nullopt, std::nullopt, std::nullopt), exact,
                 5e-4, s);
}

}  // namespace

bool running() { return t_running; }
int forced_workers() { return t_running ? t_workers : 0; }

std::vector<CheckShape> check_shapes(KernelEntry const& e) {
  auto const& g = e.geometry;
  // 1. The full grid: two cluster-spans of tiles plus a ragged tail in M and N, three K-tiles plus
  //    a partial one (FP4: 3.5 K-tiles, whole 1x32 blocks; 448 at tile_k 128 is a K the SM100
  //    path must pad).
  int64_t const span = std::max<int64_t>(g.tile_m * g.cluster_m, g.tile_n * g.cluster_n);
  int64_t k = 3 * g.tile_k;
  if (e.scale_mode == ScaleMode::Block32) k = e.b_dtype == DType::E2M1 ? 3 * g.tile_k + g.tile_k / 2 : 432;
  else k += e.a_dtype == DType::E4M3 ? 48 : 40;
  // The decode GEMV takes at most its token tile (tile_n) and walks strips, not tiles: a token
  // count one short of its tile (ragged n8 tiles), two strips and a tail of weight rows.
  // Its K is whole 1x32 blocks (its bulk copies) and ends in a partial unit: 416 = 256 + 160 for
  // e4m3 (432 would be refused), 1792 = 3.5 units for e2m1.
  if (g.style == KernelStyle::Gemv)
    return {{std::max<int64_t>(1, g.tile_n - 3), 2 * g.tile_m + 24, k / 32 * 32, 0}};
  // Grouped (run_check spreads the rows over four experts): whole 1x32 blocks (grouped_mm's rule);
  // a tcgen05 (SM100) e2m1 weight whole 128-K tiles too, as a stack is not padded to TMA's rule.
  bool const tcgen05 = g.style == KernelStyle::Umma1Sm || g.style == KernelStyle::Umma2Sm;
  auto const grouped_k = [&](int64_t v) {
    if (!g.grouped) return v;
    return tcgen05 && e.b_dtype == DType::E2M1 ? (v + g.tile_k - 1) / g.tile_k * g.tile_k : v / 32 * 32;
  };
  k = grouped_k(k);
  std::vector<CheckShape> out{{2 * span + 37, 2 * span + 24, k, 0}};
  // 2. One cluster walks (3 cm + 1) x (2 cn + 1) clusters' tiles (>= 12 per CTA: both accumulator
  //    stages, several times), each over 16 K-tiles plus a partial one: more than any stage count
  //    (kMaxStages = 16), so the smem ring wraps inside every tile. Rows and columns end ragged.
  //    In the kernel's orientation: a swap-AB kernel's M is the op's N.
  int64_t const km = (3 * g.cluster_m + 1) * g.tile_m - 5, kn = (2 * g.cluster_n + 1) * g.tile_n - 3;
  int64_t k2 = 16 * g.tile_k + (e.b_dtype == DType::E2M1 || e.scale_mode == ScaleMode::Block32 ? 96 : 40);
  if (e.b_dtype == DType::E2M1) k2 = k2 / 32 * 32;
  k2 = grouped_k(k2);
  out.push_back({e.swap_ab ? kn : km, e.swap_ab ? km : kn, k2, 1});
  return out;
}

std::vector<Result> results() {
  std::lock_guard<std::mutex> lock(table_mutex());
  std::vector<Result> out;
  for (auto const& [entry, r] : records()) out.push_back({entry->config, r.state == State::Passed, r.report});
  return out;
}

bool guarded(ArchModule const& mod) {
  switch (mode()) {
    case Mode::Off: return false;
    case Mode::All: return true;
    case Mode::Auto: return !mod.table->validated_on_hardware;
  }
  return false;
}

bool use_fallback(ArchModule const& mod) {
  static bool const torch_fallback = [] {
    char const* v = std::getenv("PGEMM_FALLBACK");
    std::string const s = v ? v : "";
    TORCH_CHECK_VALUE(s.empty() || s == "torch" || s == "off",
                      msg("PGEMM_FALLBACK must be torch or off (unset), got '", s, "'"));
    return s == "torch";
  }();
  return torch_fallback && guarded(mod);
}

namespace {

// The in-process check of `e`: every problem of check_shapes(e) until one fails.
Record check_entry(char const* op, ArchModule const& mod, KernelEntry const& e, int device) {
  if (env_is("PGEMM_SELF_CHECK_INJECT_HANG", "1")) {  // tests only: a check that never returns
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  t_running = true;
  Outcome o;
  std::string error;
  Shape s{};
  auto const shapes = check_shapes(e);
  for (size_t i = 0; i < shapes.size(); ++i) {  // stop at the first pass that fails
    Shape const& shape = shapes[i];
    s = shape;
    t_workers = shape.max_workers;
    try {
      o = run_check(e, device, shape, /*blocked=*/i % 2 == 1 || shapes.size() == 1);
    } catch (c10::Error const& ex) {
      error = ex.what_without_backtrace();
    }
    if (!error.empty() || !o.ok()) break;
  }
  t_running = false;
  t_workers = 0;
  if (error.empty() && o.ok()) return {State::Passed, {}};
  auto const& prop = device_info(device);
  std::string const what =
      !error.empty() ? msg("it raised: ", error)
                     : msg("its result disagrees with the reference: against the float64 product, relative error ",
                           o.err, " (bound ", o.bound, ": 2x the reference implementation's + a floor), worst element ",
                           o.worst, " of the largest value (bound 0.02), ", o.non_finite,
                           " elements finite where float64's are not, or the reverse");
  return {State::Failed,
          msg(op, ": the self-check of kernel ", e.config, " failed on this GPU (", prop.name, ", sm_", prop.major,
              prop.minor, ") for M = ", s.m, ", N = ", s.n, ", K = ", s.k,
              s.max_workers ? msg(" on ", s.max_workers, " worker(s)") : std::string(), ": ", what, ". The ",
              mod.table->arch, " kernels have not been validated on hardware by this project. ", kWayOut)};
}

std::atomic<Runner> g_runner{nullptr};

// The registered runner's verdict on `e`, or nothing when there is no runner or it could not
// run (then the check runs in this process).
std::optional<Record> run_out_of_process(ArchModule const& mod, KernelEntry const& e, int device) {
  Runner const runner = g_runner.load();
  if (!runner) return std::nullopt;
  try {
    Verdict const v = runner(mod.table->arch, e.config, device);
    return Record{v.passed ? State::Passed : State::Failed, v.report};
  } catch (std::exception const& ex) {
    TORCH_WARN("persistent_gemm: the out-of-process self-check of ", e.config, " could not run (", ex.what(),
               "); checking it in this process instead");
    return std::nullopt;
  }
}

}  // namespace

void set_runner(Runner runner) { g_runner.store(runner); }

Verdict check_in_process(char const* op, std::string const& config, int device) {
  for (auto const& mod : registered_arches())
    for (int i = 0; i < mod.table->count; ++i) {
      KernelEntry const& e = mod.table->entries[i];
      if (config != e.config) continue;
      Record const r = check_entry(op, mod, e, device);
      return {config, r.state == State::Passed, r.report};
    }
  TORCH_CHECK_VALUE(false, msg(op, ": no built kernel '", config, "' to self-check"));
}

void ensure(char const* op, ArchModule const& mod, KernelEntry const& e, int device) {
  if (t_running || !guarded(mod)) return;
  if (!mod.table->validated_on_hardware) {
    TORCH_WARN_ONCE("persistent_gemm: the ", mod.table->arch, " kernels are compiled and SASS-checked but have "
                    "not been run on hardware by this project; each one is checked against the reference "
                    "implementation on its first use in this process, in a child process with a timeout "
                    "(PGEMM_SELF_CHECK=off skips that, PGEMM_FALLBACK=torch runs the reference implementations "
                    "instead)");
  }
  {
    std::lock_guard<std::mutex> lock(table_mutex());
    auto it = records().find(&e);
    if (it != records().end()) {
      TORCH_CHECK(it->second.state == State::Passed, it->second.report);
      return;
    }
  }
  // Checked outside the table's lock (a child process takes seconds); two threads meeting the
  // same kernel first may both check it, and the first verdict stays.
  std::optional<Record> r = run_out_of_process(mod, e, device);
  if (!r) r = check_entry(op, mod, e, device);
  std::lock_guard<std::mutex> lock(table_mutex());
  auto const it = records().emplace(&e, std::move(*r)).first;
  TORCH_CHECK(it->second.state == State::Passed, it->second.report);
}

}  // namespace persistent_gemm::self_check
