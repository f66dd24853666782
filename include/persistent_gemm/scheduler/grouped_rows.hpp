// The grouped walk (TileSchedule(grouped=True), MoE experts): E problems sharing N and K whose
// row counts live on the device. Each group's activation rows are cut into items of `Tokens`
// rows (a group of 3 rows is one item of 3, not a padded tile; an empty group has none), and the
// items x weight strips x K chunks are dealt by StripStreamK as one problem's strips x chunks:
//
//   unit u -> global strip gs = u / chunks, chunk u % chunks; item gs / strips, strip gs % strips.
//
// Every CTA builds the same item table from the group rows at launch (one warp, a few hundred
// bytes read from L2), so the walk is decided on the device and nothing on the host reads offs
// (CUDA graphs replay it with new routing). persistent_gemm.strip_schedule.grouped_strip_stream_k
// is the Python twin (tests/test_grouped.py). The grouped tile kernels build the same table with
// a group's tile ids as its items (PersistentTileScheduler's grouped walk).
#pragma once

#include <cstdint>
#if defined(__CUDACC__)
#include <cstdio>
#endif

#include "cutlass/cutlass.h"

namespace persistent_gemm::scheduler {

// The most groups a launch takes (the table lives in shared memory: 12 bytes a group).
constexpr int kMaxGroups = 512;

// Where the rows of each group are: torch._grouped_mm's offs (cumulative ends over `rows`
// activation rows, ld == 0) or the masked form's counts (group e's rows start at e * ld, at most
// ld of them).
struct GroupRows {
  int32_t const* rows = nullptr;
  int32_t groups = 0;
  int32_t total = 0;  // offs: the activations' rows (offs[E-1] must equal it)
  int64_t ld = 0;
};

struct GroupItem {
  int32_t group, row0, rows;  // rows >= 1
};

// Group e's rows [begin, end) clamped into the activations, and whether the caller's value was
// malformed. `raw`: offs[e] (or the count), `before`: offs[e-1] (0 for e = 0; the masked form
// ignores it). The one rule of both the kernel's table and the host walk (tests/host/).
struct GroupSpan {
  int32_t begin, end;
  bool wrong;
};
CUTLASS_HOST_DEVICE GroupSpan group_span(GroupRows const& g, int32_t e, int32_t raw, int32_t before) {
  if (g.ld == 0) {
    bool const wrong = raw < before || raw > g.total || (e == g.groups - 1 && raw != g.total);
    int32_t const begin = before < 0 ? 0 : (before > g.total ? g.total : before);
    return {begin, raw < begin ? begin : (raw > g.total ? g.total : raw), wrong};
  }
  int32_t const begin = int32_t(e * g.ld);
  return {begin, begin + (raw < 0 ? 0 : (int64_t(raw) > g.ld ? int32_t(g.ld) : raw)), raw < 0 || int64_t(raw) > g.ld};
}

// The group owning entry i (0 <= i < before[groups]) of a count prefix-summed over groups:
// `before` (groups + 1 entries, non-decreasing) holds the entries before each group, and the
// answer is the last group starting at or before i (an empty group starts where the next one
// does, so it is never the answer). The grouped GEMV's items and the grouped tile walk's ids.
CUTLASS_HOST_DEVICE int32_t owner_group(int32_t const* before, int32_t groups, int32_t i) {
  int32_t lo = 0, hi = groups;  // before[lo] <= i < before[hi]
  while (hi - lo > 1) {
    int32_t const mid = (lo + hi) / 2;
    if (before[mid] <= i) lo = mid; else hi = mid;
  }
  return lo;
}

struct GroupTable {
  int32_t item_begin[kMaxGroups + 1];  // items before group e; [groups]: all items
  int32_t row_begin[kMaxGroups];
  int32_t row_end[kMaxGroups];

  // One warp builds the table (lane = threadIdx.x % 32) and returns the first group whose rows
  // are malformed (offs decreasing, past the rows, its last value not the rows; a count below 0
  // or above ld), -1 when none. Malformed rows are clamped into [0, rows) first, so no role
  // reads or writes outside the operands whatever the caller passed. A group's items are
  // count(rows) (the GEMV: items of `tokens` rows; a tile kernel: the group's tile ids).
#if defined(__CUDACC__)
  CUTLASS_DEVICE int32_t build(GroupRows const& g, int32_t tokens, int lane) {
    return build(g, [tokens](int32_t rows) { return (rows + tokens - 1) / tokens; }, lane);
  }
  template <class Count>
  CUTLASS_DEVICE int32_t build(GroupRows const& g, Count const& count, int lane) {
    int32_t carry = 0, bad = -1;
    int32_t prev_end = 0;  // offs[e-1] of the first group of this round of 32
    for (int32_t base = 0; base < g.groups; base += 32) {
      int32_t const e = base + lane;
      int32_t raw = 0;
      GroupSpan span{0, 0, false};
      if (e < g.groups) {
        raw = g.rows[e];
        span = group_span(g, e, raw, e == 0 ? 0 : (lane == 0 ? prev_end : g.rows[e - 1]));
      }
      int32_t const begin = span.begin, end = span.end;
      bool const wrong = span.wrong;
      int32_t const items = count(end - begin);
      int32_t scan = items;  // inclusive prefix over the lanes
      CUTLASS_PRAGMA_UNROLL
      for (int d = 1; d < 32; d *= 2) {
        int32_t const up = __shfl_up_sync(0xffffffffu, scan, d);
        if (lane >= d) scan += up;
      }
      if (e < g.groups) {
        item_begin[e] = carry + scan - items;
        row_begin[e] = begin;
        row_end[e] = end;
      }
      uint32_t const wrong_lanes = __ballot_sync(0xffffffffu, wrong);
      if (bad < 0 && wrong_lanes) bad = base + __ffs(wrong_lanes) - 1;
      carry += __shfl_sync(0xffffffffu, scan, 31);
      prev_end = __shfl_sync(0xffffffffu, raw, 31);
    }
    if (lane == 0) item_begin[g.groups] = carry;
    return bad;
  }
#endif

  CUTLASS_HOST_DEVICE int32_t items(int32_t groups) const { return item_begin[groups]; }

  // The group and rows of item i (0 <= i < items).
  CUTLASS_HOST_DEVICE GroupItem locate(int32_t i, int32_t groups, int32_t tokens) const {
    int32_t const lo = owner_group(item_begin, groups, i);
    int32_t const row0 = row_begin[lo] + (i - item_begin[lo]) * tokens;
    int32_t const left = row_end[lo] - row0;
    return {lo, row0, left < tokens ? left : tokens};
  }
};

#if defined(__CUDACC__)
// The first group whose rows are malformed (group_span's rule), -1 when none; one warp.
CUTLASS_DEVICE int32_t first_bad_group(GroupRows const& g, int lane) {
  for (int32_t base = 0; base < g.groups; base += 32) {
    int32_t const e = base + lane;
    bool wrong = false;
    if (e < g.groups) wrong = group_span(g, e, g.rows[e], e == 0 ? 0 : g.rows[e - 1]).wrong;
    uint32_t const lanes = __ballot_sync(0xffffffffu, wrong);
    if (lanes) return base + __ffs(lanes) - 1;
  }
  return -1;
}

// The device-side check of offs / counts (nothing on the host reads them): `bad` is build()'s
// or first_bad_group's answer. The rows were clamped, so nothing was touched out of bounds; the
// one `report`ing thread prints the message and traps, which fails the launch (no other thread
// traps first and cuts the message short). A kernel with wgmma leaves this to a kernel before it
// (printf is a call, which serializes its wgmmas).
CUTLASS_DEVICE void trap_on_bad_rows(GroupRows const& g, int32_t bad, bool report) {
  if (bad < 0 || !report) return;
  if (g.ld == 0)
    printf("persistent_gemm.grouped_mm: offs must be non-decreasing cumulative row ends in [0, %d] with "
           "offs[-1] == %d (the rows of a); offs[%d] = %d breaks it\n",
           g.total, g.total, bad, g.rows[bad]);
  else
    printf("persistent_gemm.masked_grouped_mm: counts must be in [0, %d] (a's rows per expert); counts[%d] = %d\n",
           int32_t(g.ld), bad, g.rows[bad]);
  __trap();
}
#endif

}  // namespace persistent_gemm::scheduler
