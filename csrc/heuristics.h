// Kernel choice, DeepGEMM style: the problem description (Request) is kept apart from the
// decision (Choice); every candidate that is turned down carries a one-line reason, and the
// whole decision prints (persistent_gemm.explain()).
#pragma once

#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "persistent_gemm/registry.h"

namespace persistent_gemm {

struct Request {
  int64_t m = 0, n = 0, k = 0;
  DType a = DType::BF16, b = DType::BF16, d = DType::BF16;
  bool a_k_major = true, b_k_major = true;
  ScaleMode scale = ScaleMode::None;
  // FP8: the caller allows fast accumulation (torch._scaled_mm's use_fast_accum). false admits
  // only promoting kernels; true admits both, the cost model choosing.
  bool fast_accum = false;
  bool d_aligned = true;  // D rows 16-byte aligned, as a TMA store needs
  bool a_needs_copy = false, b_needs_copy = false;  // operand not TMA-readable as given
  int sm_count = 132;
  // Grouped (pg.grouped_mm, MoE experts): m rows over `groups` problems of (N, K) each, how many
  // rows each has known only on the device. 0: one problem.
  int32_t groups = 0;
  std::optional<std::string> config;  // forced by the caller

  bool operator==(Request const&) const = default;  // every field: the decision cache's key
};

struct Choice {
  KernelEntry const* entry = nullptr;
  bool copy_a = false, copy_b = false;  // run on a K-major aligned copy of the operand
  bool pad_d = false;                   // TMA store into a padded D, then narrow
  // Run on M rounded up to the tile: A copied into a buffer of whole tiles (rows past M left
  // uninitialised; they only feed D rows that are cut off), D narrowed back to M rows. TMA
  // zero-fills out-of-bounds rows of a box far slower than it loads real ones, so a partial last
  // M-tile (decode M = 1 against a 64-row tile, M = 1000 against 128) can cost more than the copy.
  bool pad_m = false;
  bool tuned = false;                   // a persistent_gemm.tune winner decided, not the cost model
  std::vector<std::string> log;         // the decision, one line per rule applied
};

// The one constructor of a Request (the ops' launch and explain/tune's describe): the problem, its
// operands' element kinds, the output and the scales; D's TMA alignment follows from N and the
// output dtype. The callers set what else they know (majorness, copies, SMs, fast accumulation).
Request make_request(int64_t m, int64_t n, int64_t k, DType a, DType b, DType d, ScaleMode scale,
                     std::optional<std::string> config);

// Throws (TORCH_CHECK) with the list of what is available when nothing fits.
Choice choose_kernel(char const* op, KernelTable const& table, Request const& req);
// The same decision, printable (persistent_gemm.explain): Choice::log holds the chosen kernel's
// line, the other eligible configs fastest first with why each lost, and the configs turned down
// with their reasons. Where no config fits an unforced request it does not throw: entry is null
// and the log holds the reasons.
Choice explain_kernel(char const* op, KernelTable const& table, Request const& req);
// The same decision without a log, remembered per thread for the last few problems (the op path).
Choice choose_kernel_cached(char const* op, KernelTable const& table, Request const& req);
// Whether some built kernel could serve `req` at all (its operands, scale mode, output dtype or
// an fp32 one to cast, and the decode GEMV's token and K limits): ops with a reference path
// (weight_only_mm) take it when none can.
bool has_candidate(KernelTable const& table, Request const& req);

// persistent_gemm.tune's winners: a problem (its forced config ignored) on an arch -> the config
// choose_kernel takes before its cost model; an empty config removes the entry.
void set_tuned(std::string const& arch, Request req, std::string const& config);
void clear_tuned();

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The cost model's estimate of one config for one problem (cost_model.cpp says how).
struct Estimate {
  double us = 0;       // the estimate: the largest bound plus launch
  double mma_us = 0;   // waves x per-tile time (MMA or the SM's load rate, + coop epilogue)
  double dram_us = 0;  // compulsory bytes at device bandwidth
  double l2_us = 0;    // operand bytes pulled from L2 by all tiles
  double oob_us = 0;   // TMA zero-fill of out-of-bounds tile rows, added to the bound
  int64_t waves = 0;
  double tile_eff = 0; // useful fraction of the launched tile area
};
// promoted_fp8: the config promotes FP8 partial sums every k-tile (promoted_fp8(entry));
// block_scaled: it promotes every 32-K block with two MX scales (FMUL + FFMA per element);
// folded: the fold route's promotion (MxRoute::Fold: one FFMA per element, one FMUL per column).
// The request is in the kernel's orientation (oriented()).
Estimate estimate(Request const& req, KernelGeometry const& geometry, ArchCost const& cost, bool pad_m = false,
                  bool promoted_fp8 = false, bool block_scaled = false, bool folded = false);
// tcgen05 (the Umma styles) accumulates FP8 in fp32 in TMEM: no promotion pass to charge.
inline bool promoted_fp8(KernelEntry const& e) {
  bool const umma = e.geometry.style == KernelStyle::Umma1Sm || e.geometry.style == KernelStyle::Umma2Sm;
  return e.a_dtype == DType::E4M3 && !e.fast_accum && e.scale_mode != ScaleMode::Block32 && !umma;
}
// The problem as the kernel sees it: a swap-AB kernel computes D^T, its M is the op's N.
inline Request oriented(Request r, KernelEntry const& e) {
  if (e.swap_ab) {
    std::swap(r.m, r.n);
    std::swap(r.a, r.b);
  }
  return r;
}
// The MX decode GEMV's estimate (KernelStyle::Gemv): its own model, a weight stream.
Estimate estimate_gemv(Request const& req, KernelGeometry const& geometry, ArchCost const& cost);
// The MX bf16 route (MxRoute::Bf16): a bf16 GEMM with the weight converted in
// registers, after a pre-pass that widens the activations.
Estimate estimate_bf16_route(Request const& req, KernelGeometry const& geometry, ArchCost const& cost);
inline Estimate estimate(Request const& req, KernelEntry const& e, ArchCost const& cost, bool pad_m = false) {
  if (e.geometry.style == KernelStyle::Gemv) return estimate_gemv(oriented(req, e), e.geometry, cost);
  if (e.route == MxRoute::Bf16) return estimate_bf16_route(oriented(req, e), e.geometry, cost);
  return estimate(oriented(req, e), e.geometry, cost, pad_m, promoted_fp8(e), e.scale_mode == ScaleMode::Block32,
                  e.route == MxRoute::Fold);
}

}  // namespace persistent_gemm
