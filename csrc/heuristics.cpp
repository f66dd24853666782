#include "heuristics.h"
#include "text.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <optional>
#include <algorithm>
#include <vector>
#include <cstring>
#include <map>

#include <c10/util/Exception.h>

namespace persistent_gemm {
namespace {

char const* dtype_str(DType t) {
  switch (t) {
    case DType::BF16: return "bf16";
    case DType::FP16: return "fp16";
    case DType::FP32: return "fp32";
    case DType::E4M3: return "e4m3";
    case DType::E8M0: return "e8m0";
    case DType::E2M1: return "e2m1";
  }
  return "?";
}

}  // namespace

namespace {

// The tokens (M) a 16-bit / e4m3 swap-AB kernel is chosen for unless forced (choose_kernel):
// a decode tile (at most kSwapAbMaxTokens wide) up to kSwapAbMaxTokens, a wider one past
// kSwapAbWideMinTokens, up to kSwapAbMaxBands token bands. In between, one band of a wide tile
// puts only the weight's 128-row tiles on the SMs (64 of 132 for an 8192-wide weight), where the
// 64-column ping-pong tiles are measured best (tests/test_heuristics.py, decode).
constexpr int64_t kSwapAbMaxTokens = 64;
constexpr int64_t kSwapAbWideMinTokens = 128;
constexpr int64_t kSwapAbMaxBands = 4;

// Extra passes over memory a variant costs for this request (0 = exact fast path).
int adaptation_cost(KernelEntry const& e, Request const& r, Choice* c) {
  int cost = 0;
  bool const copy_a = r.a_needs_copy || e.a_k_major != r.a_k_major;
  bool const copy_b = r.b_needs_copy || e.b_k_major != r.b_k_major;
  if (copy_a && !e.a_k_major) return -1;  // copies are always K-major
  if (copy_b && !e.b_k_major) return -1;
  if (e.d_dtype != r.d && e.d_dtype != DType::FP32) return -1;  // only fp32 casts down exactly once
  cost += copy_a * 4 + copy_b * 4 + (e.d_dtype != r.d) * 2;
  bool const pad = !r.d_aligned && e.tma_store;
  cost += pad * 2;
  // Predicated stores are slower than TMA for a large D. Swap-AB and split-K kernels store by
  // design that way (a transposed D; partial units that skip the epilogue): their D is a decode's
  // few rows, and the cost model weighs them by time, not by this count. (Stream-K kernels keep
  // the TMA store: library.fit_variants.)
  if (r.d_aligned && !e.tma_store && !e.swap_ab && e.geometry.split_k == 1) cost += 1;
  if (c) c->copy_a = copy_a, c->copy_b = copy_b, c->pad_d = pad;
  return cost;
}

}  // namespace

namespace {
// Winners of persistent_gemm.tune, keyed by the arch and the whole problem (SM count included)
// without the forced config: consulted before the cost model.
struct Tuned {
  std::string arch;
  Request req;
  std::string config;
};
// The winners with the mutex that guards them: one function-local static, built on first use.
struct TunedTable {
  std::mutex mutex;
  std::vector<Tuned> rows;
};
TunedTable& tuned() {
  static TunedTable t;
  return t;
}
std::atomic<uint64_t> g_tuned_generation{0};

std::optional<std::string> tuned_config(KernelTable const& table, Request const& r) {
  if (g_tuned_generation.load(std::memory_order_relaxed) == 0) return std::nullopt;  // none ever set
  Request key = r;
  key.config.reset();
  std::lock_guard<std::mutex> lock(tuned().mutex);
  for (auto const& t : tuned().rows)
    if (t.arch == table.arch && t.req == key) {
      for (int i = 0; i < table.count; ++i)  // only while that kernel is registered
        if (t.config == table.entries[i].config) return t.config;
    }
  return std::nullopt;
}
}  // namespace

void set_tuned(std::string const& arch, Request req, std::string const& config) {
  req.config.reset();
  std::lock_guard<std::mutex> lock(tuned().mutex);
  auto& t = tuned().rows;
  t.erase(std::remove_if(t.begin(), t.end(), [&](Tuned const& x) { return x.arch == arch && x.req == req; }), t.end());
  if (!config.empty()) t.push_back({arch, req, config});
  g_tuned_generation.fetch_add(1);
}

void clear_tuned() {
  std::lock_guard<std::mutex> lock(tuned().mutex);
  tuned().rows.clear();
  g_tuned_generation.fetch_add(1);
}

Request make_request(int64_t m, int64_t n, int64_t k, DType a, DType b, DType d, ScaleMode scale,
                     std::optional<std::string> config) {
  Request r;
  r.m = m, r.n = n, r.k = k;
  r.a = a, r.b = b, r.d = d;
  r.scale = scale;
  r.d_aligned = (n * (d == DType::FP32 ? 4 : 2)) % 16 == 0;
  r.config = std::move(config);
  return r;
}

// Why the MX decode GEMV `e` cannot run `r` ("" when it can): tokens on its n8 MMA tiles, whole
// 1x32 blocks streamed by 16-byte bulk copies.
static std::string gemv_misfit(KernelEntry const& e, Request const& r) {
  // Grouped: any rows, cut into items of tile_n per expert on the device.
  if (!e.geometry.grouped && r.m > e.geometry.tile_n)
    return "MX decode GEMV: M = " + std::to_string(r.m) + " exceeds its " + std::to_string(e.geometry.tile_n) + " tokens";
  if (r.k % 32)
    return "MX decode GEMV: K = " + std::to_string(r.k) + " is not a multiple of 32 (its bulk copies stream whole 1x32 blocks)";
  return "";
}

bool has_candidate(KernelTable const& table, Request const& r) {
  for (int i = 0; i < table.count; ++i) {
    KernelEntry const& e = table.entries[i];
    if (e.a_dtype != r.a || e.b_dtype != r.b || e.scale_mode != r.scale) continue;
    if (e.geometry.grouped != (r.groups > 0)) continue;
    if (e.geometry.style == KernelStyle::Gemv && !gemv_misfit(e, r).empty()) continue;
    if (adaptation_cost(e, r, nullptr) >= 0) return true;
  }
  return false;
}

namespace {

char const* scale_str(ScaleMode s) {
  switch (s) {
    case ScaleMode::None: return "no scales";
    case ScaleMode::Tensorwise: return "tensorwise fp32 scales";
    case ScaleMode::Rowwise: return "rowwise fp32 scales";
    case ScaleMode::Block32: return "e8m0 scales per 1x32 block (MX)";
  }
  return "?";
}

// One config as the ranking saw it (explain only): the first reason a variant of it was turned
// down, and its best variant where one fits.
struct Seen {
  std::string rejection;
  bool other_op = false;  // the rejection is the config's own kind (operands, scales): folded per reason
  bool fits = false;
  int passes = 0;
  double us = 0;
};

// Every built variant that could serve `r`, scored: fewest extra passes over memory first, then
// the cost model's estimate. `seen` is filled only when explaining: the op path allocates nothing.
struct Ranking {
  Choice best;
  int passes = 1 << 30;
  Estimate est;
  std::map<std::string, Seen> seen;
};

Ranking rank(char const* op, KernelTable const& table, Request const& r, bool explain) {
  Ranking rk;
  rk.est.us = 1e300;
  auto reject = [&](char const* config, std::string why, bool other_op = false) {
    if (!explain) return;
    Seen& s = rk.seen[config];
    if (s.rejection.empty()) s.rejection = std::move(why), s.other_op = other_op;
  };
  for (int i = 0; i < table.count; ++i) {
    KernelEntry const& e = table.entries[i];
    if (r.config && std::strcmp(e.config, r.config->c_str()) != 0) continue;
    if (e.a_dtype != r.a || e.b_dtype != r.b) {
      reject(e.config, std::string("operands are ") + dtype_str(e.a_dtype) +
                           (e.b_dtype != e.a_dtype ? std::string(" x ") + dtype_str(e.b_dtype) : std::string()),
             /*other_op=*/true);
      continue;
    }
    // First: a config's variants differ in scale mode, not in accumulation, and its accumulation
    // holds at every M, so this is the reason that holds for all of them (the first reason per
    // config is the one shown).
    if (e.fast_accum && !r.fast_accum) {
      reject(e.config, "accumulates fast (reduced precision); use_fast_accum=False asks for promoted fp32 sums");
      continue;
    }
    // The 16-bit / e4m3 swap-AB kernels, unless forced: the decode tiles (at most kSwapAbMaxTokens
    // wide; the catalogue's are 16) for M up to kSwapAbMaxTokens, the wider ones (the catalogue's
    // 96 and 144) for M past kSwapAbWideMinTokens, up to kSwapAbMaxBands bands.
    // Their predicated stores carry no pass penalty (below), so on a large unaligned D they would
    // otherwise win on pass count alone. Measured: the 16-wide tiles ran 2x slower than a non-swap
    // tile at M = 64 already (H200 sweep); the wide tiles with full-width wgmmas won at 129-257
    // tokens and lost from 3 bands of 144 or 5 of 96 on (H100,
    // tests/data/h100_stop38_swapab_128x144_sweep_kernel_time.csv), where the model's estimates
    // rank them correctly; below 129 tokens they were not measured winning, and below 65 they
    // would compute mostly padding where the decode tiles are best.
    int64_t const swap_n = e.geometry.tile_n;
    bool const decode_tile = swap_n <= kSwapAbMaxTokens;
    if (!r.config && e.swap_ab && e.scale_mode != ScaleMode::Block32 &&
        (decode_tile ? r.m > kSwapAbMaxTokens : (r.m <= kSwapAbWideMinTokens || r.m > kSwapAbMaxBands * swap_n))) {
      reject(e.config, decode_tile ? "swap-AB decode kernel: M = " + std::to_string(r.m) + " exceeds " +
                                         std::to_string(kSwapAbMaxTokens) + " tokens"
                                   : "swap-AB ragged-M kernel: M = " + std::to_string(r.m) + " is outside (" +
                                         std::to_string(kSwapAbWideMinTokens) + ", " +
                                         std::to_string(kSwapAbMaxBands * swap_n) + "] tokens");
      continue;
    }
    if (e.scale_mode != r.scale) {
      reject(e.config, std::string(scale_str(e.scale_mode)) + ", not " + scale_str(r.scale), /*other_op=*/true);
      continue;
    }
    // After the operands and scales, so another op's configs fold under their own reason.
    if (e.geometry.grouped != (r.groups > 0)) {
      reject(e.config, e.geometry.grouped ? "a grouped kernel (MoE experts, grouped_mm)" : "one problem's kernel, not grouped",
             /*other_op=*/true);
      continue;
    }
    if (e.geometry.style == KernelStyle::Gemv) {
      // A forced config that cannot run says why, not "no variant".
      std::string const why = gemv_misfit(e, r);
      if (!why.empty()) {
        TORCH_CHECK_VALUE(!r.config, msg(op, ": config '", *r.config, "': ", why));
        reject(e.config, why);
        continue;
      }
    }
    Choice c;
    int const cost = adaptation_cost(e, r, &c);
    if (cost < 0) {
      reject(e.config, std::string("no variant writes ") + dtype_str(r.d));
      continue;
    }
    Estimate est = estimate(r, e, table.cost);
    // Padding M copies A K-major, so it needs a K-major variant. Never with a per-row scale_a
    // (rowwise, or MX block scales): it has only M rows, and the padded rows would read past it.
    if (!e.swap_ab && r.m % e.geometry.tile_m != 0 && e.a_k_major && r.scale != ScaleMode::Rowwise &&
        r.scale != ScaleMode::Block32 && r.m + e.geometry.tile_m < (int64_t(1) << 31)) {
      Estimate const padded = estimate(r, e, table.cost, /*pad_m=*/true);
      c.pad_m = padded.us < est.us;
      if (c.pad_m) est = padded;
    }
    if (explain) {
      Seen& s = rk.seen[e.config];
      if (!s.fits || cost < s.passes || (cost == s.passes && est.us < s.us)) s.passes = cost, s.us = est.us;
      s.fits = true;
    }
    // Fewest extra passes first; among equals, the fastest estimate.
    if (cost < rk.passes || (cost == rk.passes && est.us < rk.est.us)) {
      rk.best = c;
      rk.best.entry = &e;
      rk.passes = cost;
      rk.est = est;
    }
  }
  return rk;
}

// What the chosen kernel does beyond its tile: accumulation or MX route, decode or swap-AB
// orientation, K reduction, stores. One clause each, for explain's first line.
std::string route_text(KernelEntry const& e, Request const& r, ArchCost const& cost) {
  std::string t;
  if (e.route == MxRoute::Bf16)
    t += ", MX bf16 route: both block scales folded exactly into bf16 operands (weight in registers, activations "
         "by a pre-pass), fp32 accumulation over the whole K, no per-32 promotion";
  else if (e.route == MxRoute::Fold)
    t += ", MX fold route: the weight's block scale folded exactly into its e2m1 -> e4m3 conversion per 16-row "
         "strip, promoted per 32-K block with one FFMA per element (strips spanning more than 14 binades in a block "
         "convert plainly, exact either way)";
  else if (e.scale_mode == ScaleMode::Block32)
    t += cost.mx_scales_in_alu ? ", MX scales applied per 32-K block in fp32"
                               : ", MX scales applied by the tensor core (block_scale MMA)";
  else if (e.a_dtype == DType::E4M3)
    t += e.fast_accum       ? ", fast accumulation"
         : promoted_fp8(e) ? ", promoted fp32 accumulation"
                           : ", fp32 accumulation in TMEM (tcgen05)";
  if (e.geometry.grouped && e.geometry.style == KernelStyle::Gemv)
    t += ", grouped: each expert's rows cut into items of up to " + std::to_string(e.geometry.tile_n) +
         " from offs on the device, only the experts with rows streamed";
  else if (e.geometry.grouped && e.swap_ab)
    t += ", grouped: (expert, tile) ids decided from offs on the device, each expert's tiles over its own rows "
         "(none padded to another's, none straddling two)";
  else if (e.geometry.grouped)
    t += ", grouped: (expert, tile) ids decided from offs on the device over copies of each expert's rows "
         "from a 128-row band boundary (block-scaled tcgen05 reads scales by band), fp32 D, an out pass adds "
         "the expert's bias";
  if (e.geometry.style == KernelStyle::Gemv)
    t += std::string(", decode GEMV: mma.sync per 32-K block over 128-row weight strips, stream-K across SMs with "
                     "a fixed-order reduction of shared strips") +
         (e.a_dtype == DType::BF16 ? ", bf16 activations as they come, the weight converted to bf16 in registers "
                                     "(nothing quantized)"
                                   : ", activation scales read plain");
  else if (e.swap_ab)
    t += ", swap-AB (weight on the MMA's M side, D written transposed)";
  if (e.geometry.split_k > 1)
    t += ", split-K " + std::to_string(std::min<int64_t>(e.geometry.split_k, cdiv(r.k, e.geometry.tile_k))) +
         " (fixed-order workspace reduction)";
  else if (e.geometry.stream_k)
    t += ", stream-K: data-parallel full waves, the rest shared out in K-tiles (fixed-order workspace reduction)";
  if (!e.tma_store) t += ", predicated stores";
  return t;
}

// The chosen kernel's line: its estimate, how the operands are adapted to it, what it does.
std::string chosen_line(Ranking const& rk, Request const& r, ArchCost const& cost) {
  KernelEntry const& e = *rk.best.entry;
  Choice const& c = rk.best;
  Estimate const& est = rk.est;
  // snprintf, not iostreams, for the numbers: see text.h.
  char text[200];
  std::snprintf(text, sizeof(text),
                "estimate %.1f us (mma %.1f over %lld wave(s), dram %.1f, l2 %.1f, oob fill %.1f; tiles %.0f%% useful)",
                est.us, est.mma_us, static_cast<long long>(est.waves), est.dram_us, est.l2_us, est.oob_us,
                100.0 * est.tile_eff);
  return std::string(e.config) + ": " + text + ", extra passes " + std::to_string(rk.passes) +
         (c.copy_a ? ", copies A K-major" : "") + (c.copy_b ? ", copies B K-major" : "") +
         (c.pad_d ? ", pads D for TMA" : "") +
         (c.pad_m ? ", pads M to " + std::to_string(cdiv(r.m, e.geometry.tile_m) * e.geometry.tile_m) : "") +
         (e.d_dtype != r.d ? ", casts fp32 D" : "") + route_text(e, r, cost);
}

// explain's log: the chosen kernel (when one fits), the other eligible configs fastest first
// with why each lost, the cost model's provenance, then the configs turned down: one line per
// config for a reason about this problem, one line per reason for configs of other operands or
// scales (another op's kernels).
std::vector<std::string> explain_log(Ranking const& rk, Request const& r, KernelTable const& table) {
  std::vector<std::string> log;
  if (rk.best.entry) {
    log.push_back(chosen_line(rk, r, table.cost));
    std::vector<std::pair<std::string, Seen>> ranked;
    for (auto const& [name, s] : rk.seen)
      if (s.fits && name != rk.best.entry->config) ranked.emplace_back(name, s);
    std::sort(ranked.begin(), ranked.end(), [](auto const& x, auto const& y) {
      return x.second.passes != y.second.passes ? x.second.passes < y.second.passes : x.second.us < y.second.us;
    });
    for (auto const& [name, s] : ranked) {
      char line[200];
      if (s.passes > rk.passes)
        std::snprintf(line, sizeof(line), ": estimate %.1f us; lost on extra passes (%d, the choice %d)", s.us,
                      s.passes, rk.passes);
      else
        std::snprintf(line, sizeof(line), ": estimate %.1f us; lost on the estimate (the choice %.1f us)", s.us,
                      rk.est.us);
      log.push_back("alternative " + name + line);
    }
  }
  if (!table.cost.measured)
    log.push_back(std::string("cost model: ") + table.arch +
                  " constants are published peaks, not measured by this project (archs.py)");
  std::map<std::string, std::vector<std::string>> other_op;  // reason -> configs
  for (auto const& [name, s] : rk.seen) {
    if (s.fits) continue;
    if (s.other_op)
      other_op[s.rejection].push_back(name);
    else
      log.push_back("rejected " + name + ": " + s.rejection);
  }
  for (auto const& [reason, names] : other_op) {
    std::string list;
    for (auto const& n : names) list += (list.empty() ? "" : ", ") + n;
    log.push_back("rejected " + std::to_string(names.size()) + " config(s), " + reason + ": " + list);
  }
  return log;
}

// Nothing fits: a forced config that cannot serve the call is the caller's mistake (ValueError,
// as the ops' own argument checks raise for it); otherwise the built configs and what they write.
[[noreturn]] void refuse(char const* op, KernelTable const& table, Request const& r) {
  // One line per built config: its operand dtype and the output dtypes its variants write.
  std::map<std::string, std::string> writes;  // config -> "e4m3 -> bf16 fp32"
  bool forced_takes_these_operands = false;
  for (int i = 0; i < table.count; ++i) {
    KernelEntry const& e = table.entries[i];
    forced_takes_these_operands |= r.config && *r.config == e.config && e.a_dtype == r.a;
    std::string& w = writes[e.config];
    std::string const d = dtype_str(e.d_dtype);
    if (w.empty()) w = std::string(dtype_str(e.a_dtype)) + " ->";
    if (w.find(" " + d) == std::string::npos) w += " " + d;
  }
  if (r.config && writes.count(*r.config)) {
    TORCH_CHECK_VALUE(forced_takes_these_operands, msg(op, ": config '", *r.config, "' is a kernel for other "
                      "operands (", writes[*r.config], "); this problem's operands are ", dtype_str(r.a)));
    TORCH_CHECK_VALUE(false, msg(op, ": config '", *r.config, "' has no variant writing ", dtype_str(r.d), " from ",
                dtype_str(r.a), " with this scale mode (it has: ", writes[*r.config],
                "); shape-tuned configs carry only their common fast path, the first config of each "
                "family every output dtype. Drop config= to let the dispatcher choose."));
  }
  std::string have;
  for (auto const& [name, w] : writes) have += "\n  " + name + " (" + w + ")";
  TORCH_CHECK(false, msg(op, ": no built ", table.arch, " kernel fits ", dtype_str(r.a), " -> ", dtype_str(r.d),
              r.config ? " with config '" + *r.config + "'" : std::string(),
              "; built kernels:", table.count ? have : std::string(" none")));
}

// The decision and, when asked, its log: a persistent_gemm.tune winner for the problem first,
// else the ranking.
Choice decide(char const* op, KernelTable const& table, Request const& r_in, bool explain, bool refuse_none) {
  // The cost model divides by tile counts and workers: refuse what would make them zero.
  TORCH_CHECK_VALUE(r_in.m >= 1 && r_in.n >= 1 && r_in.k >= 1, msg(op, ": M, N and K must be >= 1 for a kernel "
                    "choice, got M = ", r_in.m, ", N = ", r_in.n, ", K = ", r_in.k));
  TORCH_CHECK_VALUE(r_in.sm_count >= 1, msg(op, ": sm_count must be >= 1, got ", r_in.sm_count));
  std::optional<std::string> const tuned_pick = r_in.config ? std::nullopt : tuned_config(table, r_in);
  Request tuned_req;
  if (tuned_pick) tuned_req = r_in, tuned_req.config = tuned_pick;
  Request const& r = tuned_pick ? tuned_req : r_in;
  Ranking rk = rank(op, table, r, explain);
  if (!rk.best.entry && (refuse_none || r.config)) refuse(op, table, r);
  Choice c = rk.best;
  c.tuned = tuned_pick.has_value();
  if (explain) {
    c.log = explain_log(rk, r, table);
    if (tuned_pick)
      c.log.insert(c.log.begin(), "tuned: " + *tuned_pick + " won persistent_gemm.tune for this problem on this arch "
                                  "(the cost model was not consulted)");
  }
  return c;
}

}  // namespace

Choice choose_kernel(char const* op, KernelTable const& table, Request const& r) {
  return decide(op, table, r, /*explain=*/false, /*refuse_none=*/true);
}

Choice explain_kernel(char const* op, KernelTable const& table, Request const& r) {
  return decide(op, table, r, /*explain=*/true, /*refuse_none=*/false);
}

Choice choose_kernel_cached(char const* op, KernelTable const& table, Request const& r) {
  // Model inference and serving loops repeat a handful of shapes: each thread remembers its last
  // few decisions, which spares the cost model's pass over every entry on the call path.
  struct Slot {
    KernelTable const* table = nullptr;
    uint64_t tuned_generation = 0;
    Request req;
    Choice choice;
  };
  constexpr int kSlots = 8;
  thread_local Slot slots[kSlots];
  thread_local int next = 0;
  uint64_t const gen = g_tuned_generation.load(std::memory_order_relaxed);
  for (Slot const& s : slots)
    if (s.table == &table && s.tuned_generation == gen && s.req == r) return s.choice;
  Choice c = choose_kernel(op, table, r);  // throws when nothing fits: nothing is cached then
  Slot& s = slots[next];
  next = (next + 1) % kSlots;
  s.table = &table;
  s.tuned_generation = gen;
  s.req = r;
  s.choice = c;
  return c;
}

}  // namespace persistent_gemm
