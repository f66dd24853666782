// The cost model: a config's estimated time for one problem (heuristics.h declares it;
// choose_kernel in heuristics.cpp ranks the candidates by it).
#include "heuristics.h"

#include "persistent_gemm/scheduler/tile_scheduler.hpp"  // stream_k_split

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace persistent_gemm {
namespace {

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
// benchmarks/results/h200_sweep.csv (in git at 7d1ac21) is the check: there the configs this model picks
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
// promoted 128x128 rows at 8192^3 (355 TFLOP/s mxfp8, 306 FP8 x FP4; benchmarks/results/h200_mx.md at 7d1ac21).
// Until issue 22 the K-tile time took the MMA's clocks even where this bound was longer, so the
// model put these kernels at 3.5x their measured speed.
constexpr double kMxPromoteOps = 4.2;
// The fold route (MxRoute::Fold, FP8 x FP4) issues 1.5 ops per element and block (an FFMA, and
// an FMUL per column shared by a thread's two rows) against the promotion's 2. Measured at half
// the promotion kernel's speed on the H200 (167 vs 309 TFLOP/s at 8192^3, docs/api.md), so it
// gets no credit: it ties with the promotion kernel it refines and loses the tie (table order);
// only config= reaches it.
constexpr double kMxFoldOps = kMxPromoteOps;
// The wgmma MX decode tiles (ping-pong, swap-AB: 64 weight rows x 16..64 tokens) are latency-
// bound, not issue-bound: per K-tile four dependent wgmma -> wait -> promote steps. Fitted to
// the H200 decode rows (benchmarks/results/h200_mx.md at 7d1ac21: 64x16 at 1x8192^2 44.8 us, 64x64 at
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
// Stream-K: a fixed cost beside the split fix-up's, fitted to the H200 sweep (kernel time,
// tests/data/h200_issue27_suite_sweep_kernel_time.csv): each stream-K kernel ran 6-8 us behind its
// data-parallel twin where its tail saved nothing (2048^3, 4096^3, decode rows), in its second
// piece per worker, the partials' stores and loads and the reducers' waits.
constexpr double kStreamKFixedUs = 5.0;
// ... and a rate: where the tail is a small part of many waves, the model's gain from filling it
// (1-3%) is inside what a stream-K kernel loses over its whole run. Measured against the twin at
// 8192x28672x8192, 8192x8192x28672 and 8192^3 (bf16 128x256): 6.0%, 7.7%, 2.7% slower on the
// H100 (benchmarks/results/issue27/h100_s13 at 7d1ac21); 0.1% faster, 5.3% slower, 1.4% faster
// on the H200. No physical term fitted both GPUs (the tail's lost L2 reuse explains long K and contradicts 8192^3), so this is a
// minimum gain: behind a data-parallel head, stream-K is chosen only where its tail saves more
// than 4% of the run. Not where all of the work is dealt stream-K (fewer units than two waves:
// every piece starts at once, evenly dealt): there it won where the model said it would (e4m3
// promoted 1000x3000x5000: 2.7% ahead of its twin on the H100, 0.5% on the H200).
constexpr double kStreamKRateLoss = 0.04;
// The MX decode GEMV (KernelStyle::Gemv): a weight stream at the copy rate, plus a fixed cost
// (ramp of the first stages, the last strips' cross-CTA reduction), or, at larger M, its issue
// rate: per 16 weight rows x 32 K and n8 token tile an mma.sync with its scale FMULs and FFMAs,
// plus the e2m1 -> e4m3 conversion once per 16 x 32 weights (clocks of one SM, 4 schedulers).
// Fitted on the H200 (benchmarks/results/issue21/h200_decode_gemv.md at 7d1ac21): e4m3 weights stream at
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
// in the consumers (H200 probe, benchmarks/results/issue22 at 7d1ac21: 8192^3 at 0.88x of bf16 torch.mm,
// 2048x8192^2 at 0.93x, GEMM alone); its pre-pass reads the activations (e4m3) and scales and
// writes them as bf16 (3 bytes per element) plus a second launch.
constexpr double kBf16RouteConvertSlowdown = 1.12;
constexpr double kBf16RoutePrepassFixedUs = 3.0;
}  // namespace model

// The grouped estimates' routing: `rows` activation rows spread evenly over min(E, rows) touched
// experts, each expert's rows in whole tiles of `tile` (its last tile half empty on average),
// those tiles side by side as one dense extent.
struct GroupedSpread {
  double touched;  // experts with rows
  int64_t rows;    // the tiles' rows, side by side
};
GroupedSpread grouped_spread(int64_t groups, int64_t rows, int tile) {
  double const touched = std::min<double>(groups, double(rows));
  double const tiles = std::max(1.0, double(rows) / touched / tile + 0.5);
  return {touched, std::max<int64_t>(1, int64_t(std::ceil(touched * tiles))) * tile};
}

}  // namespace

Estimate estimate(Request const& r, KernelGeometry const& g, ArchCost const& c, bool pad_m, bool promoted_fp8,
                  bool block_scaled, bool folded) {
  using namespace model;
  if (g.grouped && r.groups > 0) {
    // Grouped with the experts' rows on M (SM100): each touched expert's rows in whole bands of
    // tile_m as one problem (grouped_spread), the other touched experts' weights read, and the
    // passes around it: the activations and scales copied, fp32 D written and read back, D written.
    auto const [touched, band_rows] = grouped_spread(r.groups, r.m, g.tile_m);
    Request stacked = r;
    stacked.groups = 0;
    stacked.m = band_rows;
    KernelGeometry dense = g;
    dense.grouped = false;
    Estimate e = estimate(stacked, dense, c, /*pad_m=*/false, promoted_fp8, block_scaled, folded);
    double const weight_us = (touched - 1.0) * double(r.n) * r.k * bytes_of(r.b) / c.dram_bytes_per_us;
    double const pass_us = (2.0 * r.m * (r.k * bytes_of(r.a) + cdiv(r.k, 32)) + 4.0 * double(stacked.m) * r.n +
                            double(r.m) * r.n * bytes_of(r.d)) / c.dram_bytes_per_us;
    e.dram_us += weight_us + pass_us;
    e.us += weight_us + pass_us + 2.0 * c.launch_us;
    return e;
  }
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
  // Stream-K (scheduler::PersistentTileScheduler's partition): the head's whole waves, then the
  // tail's K-tiles dealt evenly, so the busiest worker carries `waves_sk` tiles' worth of K.
  double waves_sk = double(e.waves);
  int64_t sk_slots = 0;  // partial slots written and read back through L2
  bool sk_after_head = false;  // a stream-K tail behind data-parallel waves (kStreamKRateLoss)
  if (g.stream_k) {
    if (auto const [sk_units, sk_workers] = scheduler::stream_k_split(ids, kt, workers); sk_units > 0) {
      sk_after_head = sk_units < ids;
      waves_sk = double((ids - sk_units) / workers) + double(cdiv(sk_units * kt, sk_workers)) / double(kt);
      e.waves = cdiv(ids - sk_units, workers) + 1;
      // No partials when every range is whole units (e.g. one K-tile: a worker per unit).
      bool const whole_units = (sk_units * kt) % sk_workers == 0 && (sk_units * kt / sk_workers) % kt == 0;
      sk_slots = whole_units ? 0 : sk_workers * g.cluster_m * g.cluster_n;
    }
  }
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
  // weight's: measured, M = 1 and M = 16 run within 1% there (benchmarks/results/issue12 at 7d1ac21).
  // A B panel multicast along M is loaded in slices, one per CTA of the cluster, so each SM's
  // TMA zero-fills only its slice of the missing columns. Measured (H100, benchmarks/results/
  // issue27/h100_s12 at 7d1ac21): 128x208 in 4-CTA clusters ran 12% faster than 128x256 in 2-CTA ones at
  // 1000x3000x5000, where the undivided fill ranked it 7% slower. A's term stays undivided: its
  // constant was fitted on 1-row decode problems on ping-pong tiles clustered along N.
  int64_t const oob_m = pad_m ? 0 : mt * g.tile_m - r.m, oob_n = g.tile_n <= 16 ? 0 : nt * g.tile_n - r.n;
  double const oob_us = double(oob_m * ea) * kp / kOobFillBytesPerUs * double(cdiv(e.waves, mt)) +
                        double(oob_n * eb) * kp / kOobFillBytesPerUs * double(cdiv(e.waves, nt)) / g.cluster_m;
  e.mma_us = waves_sk * tile_us;
  e.oob_us = oob_us;

  e.dram_us = double(r.m * r.k * ea + r.n * r.k * eb + r.m * r.n * ed) / c.dram_bytes_per_us;
  // Operand panels (every unit's K range: the whole K per tile) plus split-K's fp32 partials,
  // written once and read once by the reducer.
  double const l2_bytes = double(mt * nt) * (kt * g.tile_k) * (rows_a * ea / g.cluster_n + rows_b * eb / g.cluster_m) +
                          double(mt * nt * (splits - 1) + sk_slots) * 2.0 * g.tile_m * g.tile_n * 4.0;
  e.l2_us = l2_bytes / c.l2_bytes_per_us;
  // The zero-fill occupies the TMA unit that also feeds the loads: it adds to any bound.
  e.us = std::max({e.mma_us, e.dram_us + kL2ShareOfDram * e.l2_us, e.l2_us}) + e.oob_us + c.launch_us +
         (splits > 1 || sk_slots > 0 ? kSplitFixupUs : 0.0) + (sk_slots > 0 ? kStreamKFixedUs : 0.0);
  if (sk_slots > 0 && sk_after_head) e.us *= 1.0 + kStreamKRateLoss;
  if (pad_m) e.us += kCopyLaunchUs + 2.0 * double(r.m * r.k * ea) / c.dram_bytes_per_us;
  return e;
}

// The bf16 route's pre-pass traffic: `tokens` activation rows read (e4m3, or bf16 for
// weight-only) and written as bf16, the scales of `weight_rows` rows and of the tokens read.
static double bf16_prepass_us(Request const& r, double tokens, double weight_rows, ArchCost const& c) {
  return (tokens * r.k * (bytes_of(r.b) + 2.0) + (weight_rows + tokens) * cdiv(r.k, 32)) / c.dram_bytes_per_us;
}

Estimate estimate_bf16_route(Request const& r, KernelGeometry const& g, ArchCost const& c) {
  using namespace model;
  if (g.grouped && r.groups > 0) {
    // Grouped: each touched expert's tiles over its own rows, as one problem of the experts'
    // token tiles side by side (grouped_spread), plus the other touched experts' weight reads.
    // Its pre-pass widens the real rows only, and reads every expert's weight scales.
    auto const [touched, tile_rows] = grouped_spread(r.groups, r.n, g.tile_n);
    Request stacked = r;
    stacked.groups = 0;
    stacked.n = tile_rows;
    KernelGeometry dense = g;
    dense.grouped = false;
    Estimate e = estimate_bf16_route(stacked, dense, c);
    double const prepass_us = bf16_prepass_us(r, double(r.n), double(r.groups) * r.m, c) -
                              bf16_prepass_us(stacked, double(stacked.n), double(r.m), c);
    double const weight_us =
        (touched - 1.0) * double(r.m) * (r.a == DType::E2M1 ? r.k / 2.0 : double(r.k)) / c.dram_bytes_per_us;
    e.dram_us += weight_us + prepass_us;
    e.us = std::max(e.us + prepass_us, e.dram_us + kBf16RoutePrepassFixedUs + 2.0 * c.launch_us);
    return e;
  }
  // Oriented: m the weight's rows, n the tokens. The GEMM reads bf16 activations and runs at the
  // 16-bit rate (its weight bytes modelled as 16-bit: an L2-side overestimate, not the bound).
  Request bf = r;
  bf.a = DType::BF16;
  bf.b = DType::BF16;
  Estimate e = estimate(bf, g, c, /*pad_m=*/false, /*promoted_fp8=*/false, /*block_scaled=*/false);
  e.mma_us *= kBf16RouteConvertSlowdown;
  // The GEMM's bound first, on its own DRAM traffic; the pre-pass runs before it, serially.
  double const gemm_us = std::max({e.mma_us, e.dram_us + kL2ShareOfDram * e.l2_us, e.l2_us}) + e.oob_us + c.launch_us;
  double const prepass_dram_us = bf16_prepass_us(r, double(r.n), double(r.m), c);
  e.dram_us += prepass_dram_us;
  e.us = gemm_us + prepass_dram_us + kBf16RoutePrepassFixedUs + c.launch_us;
  return e;
}

Estimate estimate_gemv(Request const& r, KernelGeometry const& g, ArchCost const& c) {
  using namespace model;
  if (g.grouped && r.groups > 0) {
    // Grouped: the rows' experts are known on the device only. Expected: each row a different
    // expert until all are touched, rows spread evenly over those, the busiest expert 1.5x the
    // mean (top-k routing's spread); an expert streams its weight once per item of tile_n rows.
    Request one = r;
    double const touched = std::min<double>(r.groups, double(r.n));
    double const rows = 1.5 * double(r.n) / touched;
    double const items = touched * std::ceil(rows / g.tile_n);
    one.n = std::min<int64_t>(g.tile_n, int64_t(std::ceil(rows)));
    KernelGeometry dense = g;
    dense.grouped = false;
    Estimate e = estimate_gemv(one, dense, c);
    double const fixed = kGemvFixedUs + c.launch_us;
    e.dram_us *= items, e.mma_us *= items;
    e.us = (e.us - fixed) * items + fixed;
    return e;
  }
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

}  // namespace persistent_gemm
