// Host walk of the grouped tile schedule (PersistentTileScheduler::grouped_work_at in
// scheduler/tile_scheduler.hpp), for the parity test against persistent_gemm.grouped_walk
// (tests/test_grouped.py). argv: schedule (0-2, below) group_m workers other extent0 extent1 ...
// Prints "w step group cluster_row cluster_col" per visit, worker by worker.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "persistent_gemm/scheduler/tile_scheduler.hpp"

namespace ps = persistent_gemm::scheduler;

template <class S>
int walk(bool group_m, int workers, int other, std::vector<int32_t> const& extent) {
  int32_t const groups = int32_t(extent.size());
  std::vector<int32_t> before(groups + 1, 0);
  for (int32_t e = 0; e < groups; ++e) before[e + 1] = before[e] + S::group_ids(extent[e], other, group_m);
  for (int w = 0; w < workers; ++w)
    for (int32_t t = w, step = 0; t < before[groups]; t += workers, ++step) {
      ps::WorkTileInfo const v = S::grouped_work_at(before.data(), [&](int32_t e) { return extent[e]; }, groups, other,
                                                    group_m, t, 0, 0);
      if (!v.valid) return 1;
      std::printf("%d %d %d %d %d\n", w, step, v.l_idx, v.cluster_row, v.cluster_col);
    }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 6) return 2;
  int const which = std::atoi(argv[1]), workers = std::atoi(argv[3]), other = std::atoi(argv[4]);
  bool const group_m = std::atoi(argv[2]) != 0;
  std::vector<int32_t> extent;
  for (int i = 5; i < argc; ++i) extent.push_back(std::atoi(argv[i]));
  switch (which) {
    case 0: return walk<ps::PersistentTileScheduler<ps::PersistentSchedule<1, 1, 1, ps::Raster::Row>, 128, 128>>(
                group_m, workers, other, extent);
    case 1: return walk<ps::PersistentTileScheduler<ps::PersistentSchedule<8, 2, 1, ps::Raster::Row>, 128, 256>>(
                group_m, workers, other, extent);
    default: return walk<ps::PersistentTileScheduler<ps::PersistentSchedule<3, 1, 2, ps::Raster::Column>, 64, 16>>(
                group_m, workers, other, extent);
  }
}
