// Host walk of the grouped decode GEMV's item table (scheduler/grouped_rows.hpp), for the parity
// test against persistent_gemm.strip_schedule.GroupedStripStreamK (tests/test_grouped.py). The
// kernel builds the table with a warp scan over group_span; this builds it serially from the same
// group_span and then walks every item through the kernel's own locate().
// argv: tokens ld total v0 v1 ... (ld 0: v = offs, else the masked form's counts).
// Prints "bad <e>" (the first malformed group, -1 none), then "item <group> <row0> <rows>" per item.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "persistent_gemm/scheduler/grouped_rows.hpp"

int main(int argc, char** argv) {
  using namespace persistent_gemm::scheduler;
  if (argc < 5) return 2;
  int const tokens = std::atoi(argv[1]);
  std::vector<int32_t> rows;
  for (int i = 4; i < argc; ++i) rows.push_back(std::atoi(argv[i]));
  GroupRows const g{rows.data(), int32_t(rows.size()), std::atoi(argv[3]), std::atoll(argv[2])};
  static GroupTable t;
  int32_t items = 0, bad = -1;
  for (int32_t e = 0; e < g.groups; ++e) {
    GroupSpan const s = group_span(g, e, rows[e], e == 0 ? 0 : rows[e - 1]);
    if (s.wrong && bad < 0) bad = e;
    t.item_begin[e] = items, t.row_begin[e] = s.begin, t.row_end[e] = s.end;
    items += (s.end - s.begin + tokens - 1) / tokens;
  }
  t.item_begin[g.groups] = items;
  std::printf("bad %d\n", bad);
  for (int32_t i = 0; i < t.items(g.groups); ++i) {
    GroupItem const it = t.locate(i, g.groups, tokens);
    std::printf("item %d %d %d\n", it.group, it.row0, it.rows);
  }
  return 0;
}
