#include "heuristics.h"
#include "text.h"

#include <cstdio>
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

// Fraction of launched MMA work that is useful: tile padding times wave quantization.
double utilization(Request const& r, NameShape const& s, int64_t* waves_out) {
  int64_t const mt = cdiv(r.m, s.tile_m), nt = cdiv(r.n, s.tile_n);
  int64_t const ids = cdiv(mt, s.cluster_m) * cdiv(nt, s.cluster_n);
  int64_t const workers = std::max<int64_t>(1, r.sm_count / (s.cluster_m * s.cluster_n));
  int64_t const waves = cdiv(ids, workers);
  *waves_out = waves;
  double const tile_eff = double(r.m) * r.n / (double(ids * s.cluster_m * s.tile_m) * (s.cluster_n * s.tile_n));
  double const wave_eff = double(ids) / double(waves * workers);
  return tile_eff * wave_eff;
}

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
  if (r.d_aligned && !e.tma_store) cost += 1;  // predicated stores are slower than TMA
  if (c) c->copy_a = copy_a, c->copy_b = copy_b, c->pad_d = pad;
  return cost;
}

}  // namespace

NameShape parse_name(char const* config) {
  NameShape s;
  std::string const n(config);
  // <arch>_<dtype>_<tm>x<tn>x<tk>_c<cm>x<cn>_...
  size_t const p = n.find('_', n.find('_') + 1) + 1;
  std::sscanf(n.c_str() + p, "%dx%dx%d_c%dx%d", &s.tile_m, &s.tile_n, &s.tile_k, &s.cluster_m, &s.cluster_n);
  return s;
}

Choice choose_kernel(char const* op, KernelTable const& table, Request const& r, bool explain) {
  // The hot path (every op call) allocates nothing; the printable log is built only when asked.
  Choice best;
  int best_cost = 1 << 30;
  double best_util = -1.0;
  int64_t best_waves = 0;
  std::map<std::string, std::string> rejected;  // config -> first reason (explain only)
  std::set<std::string> fitting;                // configs with at least one usable variant
  auto reject = [&](char const* config, std::string why) {
    if (explain) rejected.emplace(config, std::move(why));
  };
  for (int i = 0; i < table.count; ++i) {
    KernelEntry const& e = table.entries[i];
    if (r.config && std::strcmp(e.config, r.config->c_str()) != 0) continue;
    if (e.a_dtype != r.a || e.b_dtype != r.b) {
      reject(e.config, std::string("operands are ") + dtype_str(e.a_dtype));
      continue;
    }
    if (e.scale_mode != r.scale) {
      reject(e.config, "scale mode differs");
      continue;
    }
    Choice c;
    int const cost = adaptation_cost(e, r, &c);
    if (cost < 0) {
      reject(e.config, std::string("no variant writes ") + dtype_str(r.d));
      continue;
    }
    if (explain) fitting.insert(e.config);
    int64_t waves = 0;
    double const util = utilization(r, parse_name(e.config), &waves);
    // Fewest extra passes first; among equals, the tile/cluster that wastes least.
    if (cost < best_cost || (cost == best_cost && util > best_util + 1e-9)) {
      best = c;
      best.entry = &e;
      best_cost = cost;
      best_util = util;
      best_waves = waves;
    }
  }
  if (explain && best.entry) {
    KernelEntry const& e = *best.entry;
    // snprintf, not iostreams, for the number: see text.h.
    char util_text[32];
    std::snprintf(util_text, sizeof(util_text), "%.3f", best_util);
    best.log.push_back(std::string(e.config) + ": utilization " + util_text + " over " +
                       std::to_string(best_waves) + " wave(s), extra passes " + std::to_string(best_cost) +
                       (best.copy_a ? ", copies A K-major" : "") + (best.copy_b ? ", copies B K-major" : "") +
                       (best.pad_d ? ", pads D for TMA" : "") + (e.d_dtype != r.d ? ", casts fp32 D" : "") +
                       (e.tma_store ? "" : ", predicated stores"));
  }
  for (auto const& [name, reason] : rejected)
    if (!fitting.count(name)) best.log.push_back("rejected " + name + ": " + reason);
  if (!best.entry) {
    std::string have;
    for (int i = 0; i < table.count; ++i)
      have += std::string("\n  ") + table.entries[i].config + " (" + dtype_str(table.entries[i].a_dtype) + " -> " +
              dtype_str(table.entries[i].d_dtype) + ")";
    TORCH_CHECK(false, msg(op, ": no built ", table.arch, " kernel fits ", dtype_str(r.a), " -> ",
                dtype_str(r.d), r.config ? " with config '" + *r.config + "'" : std::string(),
                "; built kernels:", table.count ? have : std::string(" none")));
  }
  return best;
}

}  // namespace persistent_gemm
