// Host check of the SM100 grouped MXFP8 kernel's band invariant (host/sm100_grouped_bands.cuh,
// kernel/sm100_gemm_persistent.hpp), for tests/test_grouped.py: the GEMM addresses a tile of
// expert e, m_idx tiles into its rows, at padded band ids_before(e) / tiles_n + m_idx (the
// scheduler's grouped walk, group_m, the catalogue's 128 x 128 tile and 1x1 clusters), and the
// in / out passes give band b the rows GroupTable::locate(b, E, 128) names. They must agree on
// every tile, every band must be some tile's (each once per N tile), and the bands must fit the
// host's bound. The table is built serially from the kernel's own group_span, as grouped_rows.cu.
// argv: n ld total v0 v1 ... (ld 0: v = offs, else the masked form's counts).
// Prints "ok <bands> <bound>" or the first broken rule.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "persistent_gemm/host/sm100_grouped_bands.cuh"
#include "persistent_gemm/scheduler/tile_scheduler.hpp"

namespace ps = persistent_gemm::scheduler;
using Sched = ps::PersistentTileScheduler<ps::PersistentSchedule<8, 1, 1, ps::Raster::Row, 1, false, true, true>, 128, 128,
                                           /*GroupM=*/true>;

int main(int argc, char** argv) {
  if (argc < 5) return 2;
  int32_t const n = std::atoi(argv[1]);
  std::vector<int32_t> v;
  for (int i = 4; i < argc; ++i) v.push_back(std::atoi(argv[i]));
  ps::GroupRows const g{v.data(), int32_t(v.size()), std::atoi(argv[3]), std::atoll(argv[2])};
  // Two tables, as the kernels build them: bands (the passes) and tile ids (the GEMM's walk).
  static ps::GroupTable bands, ids;
  int32_t nb = 0, ni = 0;
  for (int32_t e = 0; e < g.groups; ++e) {
    ps::GroupSpan const s = ps::group_span(g, e, v[e], e == 0 ? 0 : v[e - 1]);
    bands.item_begin[e] = nb, ids.item_begin[e] = ni;
    bands.row_begin[e] = ids.row_begin[e] = s.begin;
    bands.row_end[e] = ids.row_end[e] = s.end;
    nb += (s.end - s.begin + 127) / 128;
    ni += Sched::group_ids(s.end - s.begin, n, /*group_m=*/true);
  }
  bands.item_begin[g.groups] = nb, ids.item_begin[g.groups] = ni;
  int64_t const bound = persistent_gemm::host::sm100_bands::bands_bound(g.total, g.groups);
  if (nb > bound) return std::printf("bands %d exceed the bound %lld\n", nb, (long long)bound), 1;
  int32_t const tiles_n = (n + 127) / 128;
  std::vector<int> seen(size_t(nb) * tiles_n, 0);
  for (int32_t t = 0; t < ni; ++t) {
    ps::WorkTileInfo const w = Sched::grouped_work_at(
        ids.item_begin, [&](int32_t e) { return ids.row_end[e] - ids.row_begin[e]; }, g.groups, n, true, t, 0, 0);
    int32_t const band = ids.item_begin[w.l_idx] / tiles_n + w.m_idx;  // Sm100GemmPersistent::band_of
    if (!w.valid || !w.in_bounds || band >= nb || w.n_idx >= tiles_n)
      return std::printf("tile %d: band %d of %d, n %d of %d\n", t, band, nb, w.n_idx, tiles_n), 1;
    ps::GroupItem const it = bands.locate(band, g.groups, 128);
    if (it.group != w.l_idx || it.row0 != ids.row_begin[w.l_idx] + 128 * w.m_idx)
      return std::printf("tile %d (expert %d, m %d): band %d holds expert %d row %d\n", t, w.l_idx, w.m_idx, band,
                         it.group, it.row0), 1;
    ++seen[size_t(band) * tiles_n + w.n_idx];
  }
  for (size_t i = 0; i < seen.size(); ++i)
    if (seen[i] != 1) return std::printf("band %zu, n tile %zu: %d tiles\n", i / tiles_n, i % tiles_n, seen[i]), 1;
  std::printf("ok %d %lld\n", nb, (long long)bound);
  return 0;
}
