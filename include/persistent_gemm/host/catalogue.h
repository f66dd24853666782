// Host-side view of the catalogue inside _C: every config's name and its C++ scheduler,
// instantiated with the config's compile-time parameters (generated: catalogue_table.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "persistent_gemm/scheduler/tile_scheduler.hpp"

namespace persistent_gemm::host {

// Full visit order as rows (worker, step, batch, cluster_row, cluster_col, split, k_tile_begin,
// k_tile_end), sorted by worker then step: the rows of python/persistent_gemm/schedule.py's
// ScheduleGrid.work_order().
constexpr int kOrderColumns = 8;
using OrderFn = std::vector<int32_t> (*)(int m, int n, int l, int k_tiles, int workers);

// A config's name and what the checks need of it without parsing the name again (Python's
// parse_name wrote these fields): its dtype family and accumulation.
struct CatalogueRow {
  char const* name;
  bool in_catalogue;  // false: a scheduler probe for the parity tests, no kernel exists
  char const* family;
  bool fast_accum;
  OrderFn order;
};

std::vector<CatalogueRow> const& catalogue();

// Every arch persistent_gemm knows (python/persistent_gemm/archs.py), built or not: for messages.
struct KnownArch {
  char const* name;        // "sm90a"
  char const* torch_arch;  // its TORCH_CUDA_ARCH_LIST spelling, "9.0a"
  int32_t sm_major, sm_minor;
};
std::vector<KnownArch> const& known_archs();

// A scheduler's Params for a problem and a worker cap: what the host order below and the
// device walk (device_schedule.cuh) both start from, so they schedule the same problem.
template <class Scheduler>
typename Scheduler::Params schedule_params(int m, int n, int l, int k_tiles, int workers, int sm_count) {
  typename Scheduler::Arguments args;
  args.m = m;
  args.n = n;
  args.l = l;
  args.k_tiles = k_tiles;
  args.max_workers = workers;
  return Scheduler::to_underlying_arguments(args, sm_count);
}

// Walks the clock exactly as a worker does: initial id w, then +W per step (then a stream-K tail).
template <class Scheduler>
std::vector<int32_t> schedule_order(int m, int n, int l, int k_tiles, int workers) {
  auto const p = schedule_params<Scheduler>(m, n, l, k_tiles, workers, /*sm_count=*/workers);
  std::vector<int32_t> rows;
  rows.reserve(size_t(p.num_ids) * kOrderColumns);
  for (int w = 0; w < workers; ++w) {
    int step = 0;
    for (auto t = Scheduler::first_work(p, w, 0, 0); t.is_valid();
         t = Scheduler::next_work_of(p, t, w, p.num_workers, 0, 0), ++step) {
      rows.insert(rows.end(), {w, step, t.l_idx, t.cluster_row, t.cluster_col, t.split_idx, t.k_tile_begin,
                               t.k_tile_end});
    }
  }
  return rows;
}

}  // namespace persistent_gemm::host
