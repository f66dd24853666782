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
#include <set>

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

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

double bytes_of(DType t) {
  switch (t) {
    case DType::FP32: return 4;
    case DType::E4M3: case DType::E8M0: return 1;
    case DType::E2M1: return 0.5;
    default: return 2;
  }
}

// ---- the cost model ------------------------------------------------------------------------
// A config's time for a problem is the largest of three bounds, each printable:
//   mma   waves x per-tile time on one SM: the tile's MMA work at the style's efficiency, or the
//         tile's operand bytes at one SM's load rate if that is longer, plus the cooperative
//         epilogue (ping-pong hides it behind the other consumer's mainloop);
//   dram  compulsory bytes (A, B, D once) at device bandwidth, slowed by a share of the L2 traffic;
//   l2    operand bytes all tiles pull from L2 (multicast divides a cluster's shared panel);
// plus, on top, TMA's zero-fill of the rows of tiles that hang past M or N (oob), which is slow
// and serial with the loads: measured, a 1-row decode M against 128-row tiles ran 2x slower.
// Constants: H200 (132 SMs), fitted to sweeps of every built config forced on every benchmark
// shape (bench_mm.py --sweep; per-call times there include ~13 us of launch and host). The
// committed benchmarks/results/h200_sweep.csv is the check: there the configs this model picks
// run within 0.7% (geometric mean over 32 shapes) of the fastest built config per shape.
namespace model {
// Arch-independent terms, fitted on the H200 (see above). The arch's own constants (clock, MMA
// rate and derating, per-k-tile overhead, SM load rate, DRAM, L2, launch) come from its kernel
// table (KernelTable::cost, archs.py): measured for sm90a, published peaks for sm100a.
//
// Promoted FP8: per k-tile the fp32 adds of the previous k-tile's partial sums (overlapped with
// this one's wgmmas, collective/sm90_fp8_promoted_mma.hpp). Fitted to the H200 sweep: the
// promoted 128x128 cooperative tile ran within 2-5% of the fast-accumulation kernels.
constexpr double kPromoteClk = 25;
// MX where the scales cost ALU work (ArchCost::mx_scales_in_alu, SM90): per 32-K block an FMUL +
// FFMA per accumulator element, on the SM's 128 fp32 lanes, overlapped with the next block's
// wgmma (collective/sm90_mx_block_scaled_mma.hpp); the e8m0 expansion and scale loads add per K-tile.
constexpr double kFp32LanesPerClk = 128;
constexpr double kMxTileOverheadClk = 120;
// FMUL + FFMA are 2 ops per element and block; the prefill kernels run at about half that issue
// rate (ptxas serializes their wgmmas, docs/design/sm90_mx_mainloop.md): fitted to the H200's
// promoted 128x128 rows at 8192^3 (355 TFLOP/s mxfp8, 306 FP8 x FP4; benchmarks/results/h200_mx.md).
// Until issue 22 the K-tile time took the MMA's clocks even where this bound was longer, so the
// model put these kernels at 3.5x their measured speed.
constexpr double kMxPromoteOps = 4.2;
// The fold route (MxRoute::Fold, FP8 x FP4) issues 1.5 ops per element and block (an FFMA, and
// an FMUL per column shared by a thread's two rows) against the promotion's 2. No credit until
// measured: it was built in a session without a GPU (issue 22), so it ties with the promotion
// kernel it refines and loses the tie (table order); config= forces it. Refit from its H200
// prefill rows (bench_mx's ours_fold).
constexpr double kMxFoldOps = kMxPromoteOps;
// The wgmma MX decode tiles (ping-pong, swap-AB: 64 weight rows x 16..64 tokens) are latency-
// bound, not issue-bound: per K-tile four dependent wgmma -> wait -> promote steps. Fitted to
// the H200 decode rows (benchmarks/results/h200_mx.md: 64x16 at 1x8192^2 44.8 us, 64x64 at
// 64x8192^2 53.8 us: about 1100 clocks per K-tile beside the modelled wgmma and promotion).
// (Refit when the K-tile time became bound + overhead, issue 22: the same 44.8 / 53.8 us.)
constexpr double kMxDecodeChainClk = 640;
constexpr double kOobFillBytesPerUs = 80e3;    // TMA zero-fill of out-of-bounds box rows, per SM
constexpr double kCoopEpilogueUsPer32K = 3.3;  // cooperative epilogue per 32K-element tile
constexpr double kL2ShareOfDram = 0.25;        // L2 -> SM traffic slows a concurrent DRAM stream
constexpr double kCopyLaunchUs = 6.0;          // one extra copy (pad_m), mostly its host time
// Split-K: the reducer's flag round trip through L2 after the slowest partial, and the partials'
// stores and loads around it. A prior, not yet fitted to a sweep.
constexpr double kSplitFixupUs = 2.0;
// The MX decode GEMV (KernelStyle::Gemv): a weight stream at the copy rate, plus a fixed cost
// (ramp of the first stages, the last strips' cross-CTA reduction), or, at larger M, its issue
// rate: per 16 weight rows x 32 K and n8 token tile an mma.sync with its scale FMULs and FFMAs,
// plus the e2m1 -> e4m3 conversion once per 16 x 32 weights (clocks of one SM, 4 schedulers).
// Fitted on the H200 (benchmarks/results/issue21/h200_decode_gemv.md): e4m3 weights stream at
// 4.28 TB/s marginal between N = 8192 and 28672 (1.3x the rate the tile GEMMs reach, ArchCost)
// after a 7.7 us intercept (launch included); the issue terms from the e2m1 rows (M = 1, 16), which
// are bound by instruction issue, not by the stream.
constexpr double kGemvStreamShare = 1.3;  // of ArchCost::dram_bytes_per_us
constexpr double kGemvFixedUs = 3.7;
constexpr double kGemvClkPerMma = 10.0;
// e2m1 -> f16 by bit placement (no e4m3 step, no F2FP) cut the e2m1 rows by 23 % (1x28672x8192)
// and 11 % (16x8192^2) on the H100 (h100_probe_e2m1_f16_placement.txt): the term scaled to match.
constexpr double kGemvClkPerConvert = 16.0;
// The MX bf16 route: its GEMM runs at the bf16 tensor rate, slowed by the weight's conversion
// in the consumers (H200 probe, benchmarks/results/issue22: 8192^3 at 0.88x of bf16 torch.mm,
// 2048x8192^2 at 0.93x, GEMM alone); its pre-pass reads the activations (e4m3) and scales and
// writes them as bf16 (3 bytes per element) plus a second launch.
constexpr double kBf16RouteConvertSlowdown = 1.12;
constexpr double kBf16RoutePrepassFixedUs = 3.0;
}  // namespace model

}  // namespace

Estimate estimate(Request const& r, KernelGeometry const& g, ArchCost const& c, bool pad_m, bool promoted_fp8,
                  bool block_scaled, bool folded) {
  using namespace model;
  bool const mx_alu = block_scaled && c.mx_scales_in_alu;
  Estimate e;
  double const ea = bytes_of(r.a), eb = bytes_of(r.b), ed = bytes_of(r.d);
  int64_t const mt = cdiv(r.m, g.tile_m), nt = cdiv(r.n, g.tile_n), kt = cdiv(r.k, g.tile_k);
  // Split-K: S' units per tile (S clamped to the K-tiles), the longest reducing ceil(Kt/S') K-tiles.
  int64_t const splits = std::max<int64_t>(1, std::min<int64_t>(g.split_k, kt));
  int64_t const kp = cdiv(kt, splits) * g.tile_k;  // K extent of one work unit
  int64_t const ids = cdiv(mt, g.cluster_m) * cdiv(nt, g.cluster_n);
  int64_t const workers = std::max<int64_t>(1, r.sm_count / (g.cluster_m * g.cluster_n));
  e.waves = cdiv(ids * splits, workers);
  e.tile_eff = double(r.m) * r.n / (double(ids * g.cluster_m * g.tile_m) * (g.cluster_n * g.tile_n));

  // Per k-tile work in SM clocks (fp8 tiles are twice as deep at twice the rate: same clocks).
  double const flops_per_clk = c.flops_per_clk_16bit * (ea <= 1 ? 2 : 1);
  double stage_clk = 2.0 * g.tile_m * g.tile_n * g.tile_k / flops_per_clk;
  if (mx_alu)
    stage_clk = std::max(stage_clk, (folded ? kMxFoldOps : kMxPromoteOps) * g.tile_m * g.tile_n * (g.tile_k / 32) / kFp32LanesPerClk);
  double const overhead_clk = c.stage_overhead_clk + (promoted_fp8 ? kPromoteClk : 0.0) +
                              (mx_alu ? kMxTileOverheadClk : 0.0) +
                              (mx_alu && g.style == KernelStyle::PingPong ? kMxDecodeChainClk : 0.0);
  // A K-tile costs its bound (MMA, or the MX promotion's ALU work when that is longer) plus the
  // per-K-tile overhead, derated by the MMA efficiency.
  double const tile_mma_us = double(kp / g.tile_k) * (stage_clk + overhead_clk) / c.mma_eff_max / (c.clock_ghz * 1e3);
  // Rows past M (columns past N) are not loaded but zero-filled: see oob_us below.
  double const rows_a = pad_m ? g.tile_m : std::min<int64_t>(g.tile_m, r.m), rows_b = std::min<int64_t>(g.tile_n, r.n);
  double const tile_load_us = (rows_a * ea + rows_b * eb) * kp / c.sm_load_bytes_per_us;
  double tile_us = std::max(tile_mma_us, tile_load_us);
  if (g.style == KernelStyle::Cooperative) tile_us += kCoopEpilogueUsPer32K * g.tile_m * g.tile_n / 32768.0;
  // Out-of-bounds rows of the last M-tile (A) and columns of the last N-tile (B): a worker meets
  // about waves / (tiles along that dimension) such tiles, and every one if there is only one.
  // A 16-wide N tile (the swap-AB decode kernels' tokens) zero-fills a box a sixteenth of the
  // weight's: measured, M = 1 and M = 16 run within 1% there (benchmarks/results/issue12).
  int64_t const oob_m = pad_m ? 0 : mt * g.tile_m - r.m, oob_n = g.tile_n <= 16 ? 0 : nt * g.tile_n - r.n;
  double const oob_us = double(oob_m * ea) * kp / kOobFillBytesPerUs * double(cdiv(e.waves, mt)) +
                        double(oob_n * eb) * kp / kOobFillBytesPerUs * double(cdiv(e.waves, nt));
  e.mma_us = e.waves * tile_us;
  e.oob_us = oob_us;

  e.dram_us = double(r.m * r.k * ea + r.n * r.k * eb + r.m * r.n * ed) / c.dram_bytes_per_us;
  // Operand panels (every unit's K range: the whole K per tile) plus split-K's fp32 partials,
  // written once and read once by the reducer.
  double const l2_bytes = double(mt * nt) * (kt * g.tile_k) * (rows_a * ea / g.cluster_n + rows_b * eb / g.cluster_m) +
                          double(mt * nt) * 2.0 * double(splits - 1) * g.tile_m * g.tile_n * 4.0;
  e.l2_us = l2_bytes / c.l2_bytes_per_us;
  // The zero-fill occupies the TMA unit that also feeds the loads: it adds to any bound.
  e.us = std::max({e.mma_us, e.dram_us + kL2ShareOfDram * e.l2_us, e.l2_us}) + e.oob_us + c.launch_us +
         (splits > 1 ? kSplitFixupUs : 0.0);
  if (pad_m) e.us += kCopyLaunchUs + 2.0 * double(r.m * r.k * ea) / c.dram_bytes_per_us;
  return e;
}

Estimate estimate_bf16_route(Request const& r, KernelGeometry const& g, ArchCost const& c) {
  using namespace model;
  // Oriented: m the weight's rows, n the tokens. The GEMM reads bf16 activations and runs at the
  // 16-bit rate (its weight bytes modelled as 16-bit: an L2-side overestimate, not the bound).
  Request bf = r;
  bf.a = DType::BF16;
  bf.b = DType::BF16;
  Estimate e = estimate(bf, g, c, /*pad_m=*/false, /*promoted_fp8=*/false, /*block_scaled=*/false);
  e.mma_us *= kBf16RouteConvertSlowdown;
  // The GEMM's bound first, on its own DRAM traffic; the pre-pass runs before it, serially.
  double const gemm_us = std::max({e.mma_us, e.dram_us + kL2ShareOfDram * e.l2_us, e.l2_us}) + e.oob_us + c.launch_us;
  // The activations read (e4m3, or bf16 for weight-only) and written as bf16, the scales read.
  double const prepass_dram_us =
      (double(r.n) * r.k * (bytes_of(r.b) + 2.0) + double(r.m + r.n) * cdiv(r.k, 32)) / c.dram_bytes_per_us;
  e.dram_us += prepass_dram_us;
  e.us = gemm_us + prepass_dram_us + kBf16RoutePrepassFixedUs + c.launch_us;
  return e;
}

Estimate estimate_gemv(Request const& r, KernelGeometry const& g, ArchCost const& c) {
  using namespace model;
  Estimate e;
  bool const e2m1 = r.a == DType::E2M1;  // oriented: the weight is the kernel's A
  int64_t const strips = cdiv(r.m, g.tile_m), row_bytes = e2m1 ? r.k / 2 : r.k;
  int64_t const units = strips * cdiv(row_bytes, 256);
  int64_t const workers = std::max<int64_t>(1, std::min<int64_t>(units, r.sm_count));
  e.waves = 1;
  e.tile_eff = double(r.n) / double(g.tile_n);
  double const bytes = double(r.m) * row_bytes + double(r.m) * cdiv(r.k, 32) + double(r.n) * r.k * bytes_of(r.b);
  // Few units (a narrow weight) leave SMs idle: then one SM's inflow bounds the stream.
  e.dram_us = std::max(bytes / (c.dram_bytes_per_us * kGemvStreamShare), bytes / (workers * c.sm_load_bytes_per_us));
  double const mmas = double(cdiv(r.m, 16)) * cdiv(r.k, 32);  // per n8 token tile (all of the config's run)
  double const clk = mmas * (g.tile_n / 8 * kGemvClkPerMma + (e2m1 ? kGemvClkPerConvert : 0.0)) / workers;
  e.mma_us = clk / (c.clock_ghz * 1e3);
  e.us = std::max(e.dram_us, e.mma_us) + kGemvFixedUs + c.launch_us;
  return e;
}

namespace {

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
  // few rows, and the cost model weighs them by time, not by this count.
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
std::mutex& tuned_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Tuned>& tuned() {
  static std::vector<Tuned> t;
  return t;
}
std::atomic<uint64_t> g_tuned_generation{0};

std::optional<std::string> tuned_config(KernelTable const& table, Request const& r) {
  if (g_tuned_generation.load(std::memory_order_relaxed) == 0) return std::nullopt;  // none ever set
  Request key = r;
  key.config.reset();
  std::lock_guard<std::mutex> lock(tuned_mutex());
  for (auto const& t : tuned())
    if (t.arch == table.arch && t.req == key) {
      for (int i = 0; i < table.count; ++i)  // only while that kernel is registered
        if (t.config == table.entries[i].config) return t.config;
    }
  return std::nullopt;
}
}  // namespace

void set_tuned(std::string const& arch, Request req, std::string const& config) {
  req.config.reset();
  std::lock_guard<std::mutex> lock(tuned_mutex());
  auto& t = tuned();
  t.erase(std::remove_if(t.begin(), t.end(), [&](Tuned const& x) { return x.arch == arch && x.req == req; }), t.end());
  if (!config.empty()) t.push_back({arch, req, config});
  g_tuned_generation.fetch_add(1);
}

void clear_tuned() {
  std::lock_guard<std::mutex> lock(tuned_mutex());
  tuned().clear();
  g_tuned_generation.fetch_add(1);
}

// Why the MX decode GEMV `e` cannot run `r` ("" when it can): tokens on its n8 MMA tiles, whole
// 1x32 blocks streamed by 16-byte bulk copies.
static std::string gemv_misfit(KernelEntry const& e, Request const& r) {
  if (r.m > e.geometry.tile_n)
    return "MX decode GEMV: M = " + std::to_string(r.m) + " exceeds its " + std::to_string(e.geometry.tile_n) + " tokens";
  if (r.k % 32)
    return "MX decode GEMV: K = " + std::to_string(r.k) + " is not a multiple of 32 (its bulk copies stream whole 1x32 blocks)";
  return "";
}

bool has_candidate(KernelTable const& table, Request const& r) {
  for (int i = 0; i < table.count; ++i) {
    KernelEntry const& e = table.entries[i];
    if (e.a_dtype != r.a || e.b_dtype != r.b || e.scale_mode != r.scale) continue;
    if (e.geometry.style == KernelStyle::Gemv && !gemv_misfit(e, r).empty()) continue;
    if (adaptation_cost(e, r, nullptr) >= 0) return true;
  }
  return false;
}

Choice choose_kernel(char const* op, KernelTable const& table, Request const& r_in, bool explain) {
  std::optional<std::string> const tuned_pick = r_in.config ? std::nullopt : tuned_config(table, r_in);
  Request tuned_req;
  if (tuned_pick) tuned_req = r_in, tuned_req.config = tuned_pick;
  Request const& r = tuned_pick ? tuned_req : r_in;
  // The cost model divides by tile counts and workers: refuse what would make them zero.
  TORCH_CHECK_VALUE(r.m >= 1 && r.n >= 1 && r.k >= 1,
                    msg(op, ": M, N and K must be >= 1 for a kernel choice, got M = ", r.m, ", N = ", r.n, ", K = ", r.k));
  TORCH_CHECK_VALUE(r.sm_count >= 1, msg(op, ": sm_count must be >= 1, got ", r.sm_count));
  // The hot path (every op call) allocates nothing; the printable log is built only when asked.
  Choice best;
  int best_cost = 1 << 30;
  Estimate best_est;
  best_est.us = 1e300;
  std::map<std::string, std::string> rejected;  // config -> first reason (explain only)
  std::set<std::string> fitting;                // configs with at least one usable variant
  struct Alternative {
    int passes;
    double us;
  };
  std::map<std::string, Alternative> alternatives;  // config -> its best variant (explain only)
  auto reject = [&](char const* config, std::string why) {
    if (explain) rejected.emplace(config, std::move(why));
  };
  for (int i = 0; i < table.count; ++i) {
    KernelEntry const& e = table.entries[i];
    if (r.config && std::strcmp(e.config, r.config->c_str()) != 0) continue;
    if (e.a_dtype != r.a || e.b_dtype != r.b) {
      reject(e.config, std::string("operands are ") + dtype_str(e.a_dtype) +
                           (e.b_dtype != e.a_dtype ? std::string(" x ") + dtype_str(e.b_dtype) : std::string()));
      continue;
    }
    // The 16-bit / e4m3 swap-AB kernels are decode kernels (tokens on a 16-wide N): eligible for
    // M up to 4 such tiles unless forced. Their predicated stores carry no pass penalty (below),
    // so on a large unaligned D they would otherwise win on pass count alone.
    if (!r.config && e.swap_ab && e.scale_mode != ScaleMode::Block32 && r.m > 4 * int64_t(e.geometry.tile_n)) {
      reject(e.config, "swap-AB decode kernel: M = " + std::to_string(r.m) + " exceeds " +
                           std::to_string(4 * e.geometry.tile_n) + " tokens");
      continue;
    }
    // Before the scale mode: a config's variants differ in scale mode, not in accumulation, so
    // this is the reason that holds for all of them (the first reason per config is the one shown).
    if (e.fast_accum && !r.fast_accum) {
      reject(e.config, "accumulates fast (reduced precision); use_fast_accum=False asks for promoted fp32 sums");
      continue;
    }
    if (e.scale_mode != r.scale) {
      reject(e.config, "scale mode differs");
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
    if (explain) fitting.insert(e.config);
    Estimate est = estimate(r, e, table.cost);
    // Padding M copies A K-major, so it needs a K-major variant. Never with a per-row scale_a
    // (rowwise, or MX block scales): it has only M rows, and the padded rows would read past it.
    if (!e.swap_ab && r.m % e.geometry.tile_m != 0 && e.a_k_major && r.scale != ScaleMode::Rowwise &&
        r.scale != ScaleMode::Block32 &&
        r.m + e.geometry.tile_m < (int64_t(1) << 31)) {
      Estimate const padded = estimate(r, e, table.cost, /*pad_m=*/true);
      c.pad_m = padded.us < est.us;
      if (c.pad_m) est = padded;
    }
    if (explain) {
      auto const [it, fresh] = alternatives.emplace(e.config, Alternative{cost, est.us});
      Alternative& a = it->second;
      if (!fresh && (cost < a.passes || (cost == a.passes && est.us < a.us))) a = {cost, est.us};
    }
    // Fewest extra passes first; among equals, the fastest estimate.
    if (cost < best_cost || (cost == best_cost && est.us < best_est.us)) {
      best = c;
      best.entry = &e;
      best_cost = cost;
      best_est = est;
    }
  }
  if (explain && best.entry) {
    KernelEntry const& e = *best.entry;
    // snprintf, not iostreams, for the numbers: see text.h.
    char est_text[200];
    std::snprintf(est_text, sizeof(est_text),
                  "estimate %.1f us (mma %.1f over %lld wave(s), dram %.1f, l2 %.1f, oob fill %.1f; tiles %.0f%% useful)",
                  best_est.us, best_est.mma_us, static_cast<long long>(best_est.waves), best_est.dram_us,
                  best_est.l2_us, best_est.oob_us, 100.0 * best_est.tile_eff);
    best.log.push_back(std::string(e.config) + ": " + est_text + ", extra passes " + std::to_string(best_cost) +
                       (best.copy_a ? ", copies A K-major" : "") + (best.copy_b ? ", copies B K-major" : "") +
                       (best.pad_d ? ", pads D for TMA" : "") +
                       (best.pad_m ? ", pads M to " + std::to_string(cdiv(r.m, e.geometry.tile_m) * e.geometry.tile_m) : "") +
                       (e.d_dtype != r.d ? ", casts fp32 D" : "") +
                       (e.route == MxRoute::Bf16
                            ? ", MX bf16 route: both block scales folded exactly into bf16 operands (weight in "
                              "registers, activations by a pre-pass), fp32 accumulation over the whole K, no per-32 "
                              "promotion"
                        : e.route == MxRoute::Fold
                            ? ", MX fold route: the weight's block scale folded exactly into its e2m1 -> e4m3 "
                              "conversion per 16-row strip, promoted per 32-K block with one FFMA per element (strips "
                              "spanning more than 14 binades in a block convert plainly, exact either way)"
                        : e.scale_mode == ScaleMode::Block32
                            ? (table.cost.mx_scales_in_alu ? ", MX scales applied per 32-K block in fp32"
                                                           : ", MX scales applied by the tensor core (block_scale MMA)")
                        : e.a_dtype == DType::E4M3 ? (e.fast_accum         ? ", fast accumulation"
                                                      : promoted_fp8(e) ? ", promoted fp32 accumulation"
                                                                        : ", fp32 accumulation in TMEM (tcgen05)")
                                                   : "") +
                       (e.geometry.style == KernelStyle::Gemv
                            ? std::string(", decode GEMV: mma.sync per 32-K block over 128-row weight strips, stream-K "
                                          "across SMs with a fixed-order reduction of shared strips") +
                                  (e.a_dtype == DType::BF16 ? ", bf16 activations as they come, the weight converted to "
                                                              "bf16 in registers (nothing quantized)"
                                                            : ", activation scales read plain")
                        : e.swap_ab ? ", swap-AB (weight on the MMA's M side, D written transposed)" : "") +
                       (e.geometry.split_k > 1
                            ? ", split-K " + std::to_string(std::min<int64_t>(e.geometry.split_k,
                                                                              cdiv(r.k, e.geometry.tile_k))) +
                                  " (fixed-order workspace reduction)"
                            : "") +
                       (e.tma_store ? "" : ", predicated stores"));
  }
  if (explain && best.entry) {
    // The other eligible configs, fastest first, each with the reason it lost.
    std::vector<std::pair<std::string, Alternative>> ranked;
    for (auto const& [name, a] : alternatives)
      if (name != best.entry->config) ranked.emplace_back(name, a);
    std::sort(ranked.begin(), ranked.end(), [](auto const& x, auto const& y) {
      return x.second.passes != y.second.passes ? x.second.passes < y.second.passes : x.second.us < y.second.us;
    });
    for (auto const& [name, a] : ranked) {
      char line[200];
      if (a.passes > best_cost)
        std::snprintf(line, sizeof(line), ": estimate %.1f us; lost on extra passes (%d, the choice %d)", a.us,
                      a.passes, best_cost);
      else
        std::snprintf(line, sizeof(line), ": estimate %.1f us; lost on the estimate (the choice %.1f us)", a.us,
                      best_est.us);
      best.log.push_back("alternative " + name + line);
    }
  }
  best.tuned = tuned_pick.has_value();
  if (explain && tuned_pick)
    best.log.insert(best.log.begin(), "tuned: " + *tuned_pick + " won persistent_gemm.tune for this problem on this arch "
                                      "(the cost model was not consulted)");
  if (!table.cost.measured)
    best.log.push_back(std::string("cost model: ") + table.arch +
                       " constants are published peaks, not measured by this project (archs.py)");
  // Configs for other operand dtypes fold into one line per dtype; every other reason is per config.
  std::map<std::string, std::vector<std::string>> other_operands;  // reason -> configs
  for (auto const& [name, reason] : rejected) {
    if (fitting.count(name)) continue;
    if (reason.rfind("operands are ", 0) == 0)
      other_operands[reason].push_back(name);
    else
      best.log.push_back("rejected " + name + ": " + reason);
  }
  for (auto const& [reason, names] : other_operands) {
    std::string list;
    for (auto const& n : names) list += (list.empty() ? "" : ", ") + n;
    best.log.push_back("rejected " + std::to_string(names.size()) + " config(s), " + reason + ": " + list);
  }
  if (!best.entry) {
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
      // A forced config that cannot serve the call is the caller's mistake: ValueError, as the
      // ops' own argument checks raise for the same mistake.
      TORCH_CHECK_VALUE(forced_takes_these_operands, msg(op, ": config '", *r.config, "' is a kernel for other "
                        "operands (", writes[*r.config], "); this problem's operands are ", dtype_str(r.a)));
      TORCH_CHECK_VALUE(false, msg(op, ": config '", *r.config, "' has no variant writing ", dtype_str(r.d), " from ",
                  dtype_str(r.a), " with this scale mode (it has: ", writes[*r.config],
                  "); shape-tuned configs carry only their common fast path, the first config of each "
                  "family every output dtype. Drop config= to let the dispatcher choose."));
    }
    std::string have;
    for (auto const& [name, w] : writes) have += "\n  " + name + " (" + w + ")";
    TORCH_CHECK(false, msg(op, ": no built ", table.arch, " kernel fits ", dtype_str(r.a), " -> ",
                dtype_str(r.d), r.config ? " with config '" + *r.config + "'" : std::string(),
                "; built kernels:", table.count ? have : std::string(" none")));
  }
  return best;
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
