// The persistent tile scheduler. Its meaning is defined once, in
// python/persistent_gemm/schedule.py; tests/test_scheduler_parity.py proves this file walks
// the same order, tile for tile.
//
//   tag      PersistentSchedule<Swizzle, ClusterM, ClusterN, Raster, SplitK>   (what the user wrote)
//   selector TileSchedulerSelector<Tag, TileM, TileN>::type            (what a kernel asks for)
//   class    PersistentTileScheduler<Tag, TileM, TileN>                (what the roles walk)
//
// One iteration clock: worker w (a cluster) visits linear ids w, w+W, w+2W, ... Every role of a
// CTA (TMA producer, MMA consumers, epilogue) owns a copy of the scheduler and advances it
// itself; the sequence is a pure function of (Params, blockIdx), so no role ever has to tell
// another where it is.
//
// Split-K: with SplitK = S > 1 every output tile is S work units, each a contiguous K-tile range
// (split s of S covers [s*Kt/S, (s+1)*Kt/S), so ranges differ by at most one K-tile); a tile's
// splits are consecutive ids on the clock (id = unit * splits + split), so they run side by
// side in one wave. S is clamped to Kt at run time. Sm90GemmPersistent reduces the ranges
// (split_fixup); Sm100GemmPersistent static_asserts SplitK == 1.
//
// Stream-K (StreamK = true): the ids are cut into a data-parallel head, walked as above, and a
// tail whose (unit, K-tile) iterations are dealt to workers as contiguous ranges; after its head
// ids a worker visits its range cut at unit boundaries, one piece per step (schedule.py's
// docstring defines it; stream_k_partition is its twin). Piece 0 of a unit reduces it; a later
// piece is its worker's first tail step and only publishes partial sums. With StreamKLanes the
// tail is dealt in lanes (stream_k_lanes below), so a column's bands run side by side.
//
// Grouped (Grouped = true, MoE experts): E problems sharing one extent and K, the other extent
// of group e (its activation rows) known on the device only: N for the swap-AB kernels (SM90,
// the weight rows are M), M for the SM100 grouped kernel (GroupM). Every CTA builds the same table
// of the groups' rows and tile ids (GroupTable, from offs) in shared memory before its roles
// start, and the clock runs over the groups' ids in order (grouped_work_at).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <vector_types.h>  // dim3, also for host-only translation units

#include "cutlass/cutlass.h"
#include "cutlass/fast_math.h"

#include "persistent_gemm/scheduler/grouped_rows.hpp"  // owner_group: the grouped walk's ids

namespace persistent_gemm::scheduler {

enum class Raster : int { Row = 0, Column = 1 };

// A stream-K tail gives each worker at least this many K-tiles, unless that would leave a tail
// unit without a worker (python/persistent_gemm/schedule.py STREAM_K_MIN_ITERS).
constexpr int kStreamKMinIters = 4;
// A bound on a stream-K worker's steps beyond ceil(ids / W): its range meets at most this many
// units more than its share of whole units (tests/test_stream_k.py checks it on the Python twin).
constexpr int kStreamKExtraSteps = 3;

// A bound on any worker's steps, the device walk's rows per worker: ceil(ids / W), plus
// kStreamKExtraSteps with stream-K; at least 1. Read by PersistentTileScheduler::max_steps and by
// _C's device_schedule, which sizes the walk's output before the arch module fills it.
inline int64_t walk_steps(int64_t ids, int64_t workers, bool stream_k) {
  int64_t const w = workers > 0 ? workers : 1;
  return std::max<int64_t>(1, (ids + w - 1) / w + (stream_k ? kStreamKExtraSteps : 0));
}

// How stream-K cuts `units` work units of `k_tiles` K-tiles for `workers` workers (the twin of
// schedule.stream_k_partition): the tail's units and the workers sharing its iterations, both 0
// when the units fill whole waves. Read by the scheduler and by the cost model.
struct StreamKSplit {
  int64_t sk_units = 0, sk_workers = 0;
};
inline StreamKSplit stream_k_split(int64_t units, int64_t k_tiles, int64_t workers) {
  StreamKSplit s;
  if (units % workers == 0) return s;
  s.sk_units = units >= workers ? units % workers + workers : units;
  int64_t const by_iters = s.sk_units * k_tiles / kStreamKMinIters;
  s.sk_workers = std::min(workers, std::max(s.sk_units, by_iters));
  return s;
}

// Lanes of a stream-K tail (the twin of schedule.stream_k_lanes). Dealt unit-major, the tail's
// units that share an operand strip (a panel column: a column's bands under row raster) go to
// different workers at unrelated K offsets, and the strip is read from DRAM once per unit
// (ncu, 257x4096^2: 71.8 MB read against the data-parallel 36.7). In lanes, tail unit u is
// position u / lanes of lane u % lanes, worker w the (w / lanes)-th of lane w % lanes, and each
// lane deals its positions evenly: the workers of one lane index reduce one column's units over
// the same K ranges at once. Lanes = the width of the panel the tail lies in, when the tail is
// whole panel columns of panels of one width; else 1.
inline int64_t stream_k_lanes(StreamKSplit const& s, int64_t clusters_major, int64_t clusters_minor, int swizzle) {
  if (s.sk_units == 0) return 1;
  int64_t const narrow = clusters_major % swizzle;
  int64_t const last = narrow ? narrow : swizzle;
  int64_t lanes;
  if (s.sk_units <= last * clusters_minor) lanes = last;  // inside the last panel, which ends with the ids
  else if (narrow == 0) lanes = swizzle;                  // panels of one width (batches start on one)
  else return 1;
  return lanes > 1 && s.sk_units % lanes == 0 && s.sk_workers >= lanes ? lanes : 1;
}

// ---------------------------------------------------------------------------------- tag ---
template <int Swizzle_, int ClusterM_, int ClusterN_, Raster Raster_, int SplitK_ = 1, bool StreamK_ = false,
          bool StreamKLanes_ = true, bool Grouped_ = false>
struct PersistentSchedule {
  static constexpr int Swizzle = Swizzle_;
  static constexpr int ClusterM = ClusterM_;
  static constexpr int ClusterN = ClusterN_;
  static constexpr Raster RasterOrder = Raster_;
  static constexpr int SplitK = SplitK_;
  static constexpr bool StreamK = StreamK_;
  static constexpr bool StreamKLanes = StreamKLanes_;  // deal a stream-K tail in lanes
  static constexpr bool Grouped = Grouped_;  // walk (group, tile) ids decided on the device from offs
  // Some unit may reduce part of a tile's K: the kernel needs the fixup (split-K's units also
  // need the predicated epilogue; stream-K keeps the TMA store).
  static constexpr bool ReducesK = SplitK > 1 || StreamK;
  static_assert(!(StreamK && SplitK > 1), "stream_k and split_k > 1 are two ways to split K: choose one");
  static_assert(StreamK || StreamKLanes, "stream_k_lanes=false deals a stream-K tail unit-major: it needs stream_k");
  static_assert(!(Grouped && (SplitK > 1 || StreamK)),
                "grouped=True deals whole tiles, group by group: split_k and stream_k do not apply");
  static_assert(Swizzle >= 1 && Swizzle <= 64, "swizzle must be in [1, 64]");
  static_assert(SplitK >= 1 && SplitK <= 16, "split_k must be in [1, 16]");
  static_assert((ClusterM == 1 || ClusterM == 2 || ClusterM == 4) &&
                    (ClusterN == 1 || ClusterN == 2 || ClusterN == 4),
                "cluster extents must be 1, 2 or 4");
  static_assert(ClusterM * ClusterN <= 8, "cluster larger than the portable 8 CTAs");
};

// What one CTA does at one step of its clock.
struct WorkTileInfo {
  int32_t tile_id = 0;      // linear id on the clock
  int32_t l_idx = 0;        // batch
  int32_t cluster_row = 0;  // cluster coordinate, before adding this CTA's rank
  int32_t cluster_col = 0;
  int32_t m_idx = 0;        // this CTA's output tile, in tiles
  int32_t n_idx = 0;
  int32_t split_idx = 0;     // which K range of the tile (0 without split-K)
  int32_t k_tile_begin = 0;  // the K-tiles [k_tile_begin, k_tile_end) this unit reduces
  int32_t k_tile_end = 0;
  bool valid = false;       // the id is on the clock (tile_id < num_ids)
  bool in_bounds = false;   // this CTA's tile lies inside Mt x Nt (false for a tail CTA)

  CUTLASS_HOST_DEVICE bool is_valid() const { return valid; }
  // A tail CTA of a valid cluster: joins barriers and multicasts, touches no memory of its own.
  CUTLASS_HOST_DEVICE bool is_tail() const { return valid && !in_bounds; }
};

// Stream-K's part of the Params: ids [0, sk_first) are the data-parallel head, [sk_first,
// num_ids) the tail, cut into sk_lanes lanes; each lane's sk_iters = (tail units / sk_lanes) *
// k_tiles iterations are shared by sk_workers / sk_lanes workers. An empty base otherwise, so
// the other schedules' Params keep their layout.
template <bool StreamK>
struct StreamKParams {};
template <>
struct StreamKParams<true> {
  int32_t sk_first = 0, sk_workers = 0, sk_lanes = 1;
  int64_t sk_iters = 0;
};

// The grouped walk's part of the Params: where the groups' rows are, and the extent they share
// (the kernel's M; its N with GroupM). Empty otherwise.
template <bool Grouped>
struct GroupedParams {};
template <>
struct GroupedParams<true> {
  GroupRows group_rows{};
  int32_t shared_extent = 0;
};

// The rows of D a grouped tile writes: its group's, [row_begin, row_end) of the activations.
// The tile's n_idx (m_idx with GroupM) counts tiles from row_begin.
struct GroupedTile {
  int32_t group = 0, row_begin = 0, row_end = 0;
};

// ------------------------------------------------------------------------------- class ---
// GroupM (grouped only): the groups' rows are the kernel's M (SM100: the activations are A), else
// its N (the swap-AB SM90 kernels: the weight rows are M).
template <class Schedule, int TileM, int TileN, bool GroupM = false>
class PersistentTileScheduler {
 public:
  static constexpr int Swizzle = Schedule::Swizzle;
  static constexpr int ClusterM = Schedule::ClusterM;
  static constexpr int ClusterN = Schedule::ClusterN;
  static constexpr Raster RasterOrder = Schedule::RasterOrder;
  static constexpr int SplitK = Schedule::SplitK;
  static constexpr bool StreamK = Schedule::StreamK;
  static constexpr bool StreamKLanes = Schedule::StreamKLanes;
  static constexpr bool Grouped = Schedule::Grouped;
  static constexpr bool kRowRaster = RasterOrder == Raster::Row;
  static_assert(TileM > 0 && TileN > 0, "tile extents must be positive");

  struct Arguments {
    int m = 1, n = 1, l = 1;
    int k_tiles = 1;      // K-tiles of the problem: the K ranges of work units split this
    int max_workers = 0;  // 0: as many clusters as fit on the GPU
    GroupRows group_rows{};  // Grouped: the groups' rows (n is then all of them; m with GroupM)
  };

  // Everything the clock needs, divisors precomputed on the host. "major" is the dimension
  // panels are stacked along (M for row raster), "minor" the one ids sweep inside a panel.
  struct Params : StreamKParams<StreamK>, GroupedParams<Grouped> {
    int32_t tiles_m = 0, tiles_n = 0;
    int32_t clusters_m = 0, clusters_n = 0;
    int32_t clusters_major = 0, clusters_minor = 0;
    int32_t full_panels = 0;  // panels of exactly Swizzle clusters
    int32_t num_ids = 0;      // L * Mc * Nc * splits (grouped: a bound on the groups' ids)
    int32_t num_workers = 1;
    int32_t k_tiles = 1;
    int32_t splits = 1;              // min(SplitK, k_tiles)
    cutlass::FastDivmod split_div;   // splits
    cutlass::FastDivmod per_batch;   // Mc * Nc
    cutlass::FastDivmod panel_ids;   // Swizzle * clusters_minor
    cutlass::FastDivmod last_width;  // width of the narrowed last panel
  };

  // The map's part of the Params for an (m, n) grid of l batches and k_tiles (host and device:
  // the grouped walk builds one per group).
  CUTLASS_HOST_DEVICE static Params grid_params(int m, int n, int l, int k_tiles) {
    Params p;
    p.tiles_m = (m + TileM - 1) / TileM;
    p.tiles_n = (n + TileN - 1) / TileN;
    p.clusters_m = (p.tiles_m + ClusterM - 1) / ClusterM;
    p.clusters_n = (p.tiles_n + ClusterN - 1) / ClusterN;
    p.clusters_major = kRowRaster ? p.clusters_m : p.clusters_n;
    p.clusters_minor = kRowRaster ? p.clusters_n : p.clusters_m;
    p.full_panels = p.clusters_major / Swizzle;
    int const tail = p.clusters_major - p.full_panels * Swizzle;
    p.k_tiles = k_tiles > 0 ? k_tiles : 1;
    p.splits = SplitK < p.k_tiles ? SplitK : p.k_tiles;
    p.split_div = cutlass::FastDivmod(p.splits);
    p.num_ids = l * p.clusters_m * p.clusters_n * p.splits;
    p.per_batch = cutlass::FastDivmod(p.clusters_m * p.clusters_n);
    p.panel_ids = cutlass::FastDivmod(Swizzle * p.clusters_minor);
    p.last_width = cutlass::FastDivmod(tail > 0 ? tail : Swizzle);
    return p;
  }

  static Params to_underlying_arguments(Arguments const& args, int sm_count) {
    Params p = grid_params(args.m, args.n, args.l, args.k_tiles);
    int const fit = sm_count / (ClusterM * ClusterN);
    int workers = args.max_workers > 0 ? args.max_workers : (fit > 0 ? fit : 1);
    p.num_workers = workers;
    if constexpr (Grouped) {
      // The launch is sized before the rows are known: each group's ids are at most its whole
      // clusters plus one partial column (row with GroupM), so Mc * (Nc + E) (Nc * (Mc + E))
      // bounds them all. Without groups (the host walks of the parity tests) the map is the dense one.
      p.group_rows = args.group_rows;
      p.shared_extent = GroupM ? args.n : args.m;
      int32_t const groups = args.group_rows.groups;
      if (groups > 0)
        p.num_ids = GroupM ? p.clusters_n * (p.clusters_m + groups) : p.clusters_m * (p.clusters_n + groups);
    }
    if constexpr (StreamK) {
      StreamKSplit const sk = stream_k_split(p.num_ids, p.k_tiles, workers);
      int64_t const lanes = StreamKLanes ? stream_k_lanes(sk, p.clusters_major, p.clusters_minor, Swizzle) : 1;
      p.sk_first = p.num_ids - int32_t(sk.sk_units);
      p.sk_lanes = int32_t(lanes);
      p.sk_workers = int32_t(sk.sk_workers / lanes * lanes);
      p.sk_iters = sk.sk_units / lanes * p.k_tiles;
    }
    return p;
  }

  // Clusters to launch: never more than there are ids (an idle cluster only costs a launch); a
  // stream-K tail may give a worker to each share of fewer units, and those workers must all run.
  static int launched_workers(Params const& p) {
    if constexpr (StreamK) {
      if (p.sk_workers > 0) return p.sk_first > 0 ? p.num_workers : p.sk_workers;
    }
    return p.num_workers < p.num_ids ? p.num_workers : (p.num_ids > 0 ? p.num_ids : 1);
  }

  // A bound on any worker's steps (the device walk's rows per worker): walk_steps.
  static int max_steps(Params const& p) { return int(walk_steps(p.num_ids, p.num_workers, StreamK)); }

  // ---- stream-K tail: iteration ranges (StripStreamK's arithmetic over (unit, K-tile) pairs) ----
  // Within one lane: its j-th worker's first iteration (j = workers per lane: the end).
  CUTLASS_HOST_DEVICE static int64_t sk_begin(Params const& p, int32_t j) {
    int32_t const parts = p.sk_workers / p.sk_lanes;
    int64_t const q = p.sk_iters / parts, r = p.sk_iters % parts;
    return j * q + (j < r ? j : r);
  }
  // Within one lane: the worker (its index in the lane) whose range holds iteration i.
  CUTLASS_HOST_DEVICE static int32_t sk_owner(Params const& p, int64_t i) {
    int32_t const parts = p.sk_workers / p.sk_lanes;
    int64_t const q = p.sk_iters / parts, r = p.sk_iters % parts;
    int64_t const big = r * (q + 1);
    return int32_t(i < big ? i / (q + 1) : r + (i - big) / q);
  }
  // Pieces of the tail unit with linear id tile_id (its reducer adds the partials of the workers
  // after its own in its lane, one slot each).
  CUTLASS_HOST_DEVICE static int32_t sk_pieces(Params const& p, int32_t tile_id) {
    int64_t const pos = (tile_id - p.sk_first) / p.sk_lanes;
    return sk_owner(p, (pos + 1) * p.k_tiles - 1) - sk_owner(p, pos * p.k_tiles) + 1;
  }
  // Worker w's piece at position pos of its lane: valid while the position starts before w's
  // range ends.
  CUTLASS_HOST_DEVICE static WorkTileInfo sk_piece(Params const& p, int32_t w, int32_t pos, int rank_m, int rank_n) {
    WorkTileInfo none;
    none.tile_id = p.num_ids;
    if (w >= p.sk_workers) return none;  // no tail, or none of it for w
    int32_t const lane = w % p.sk_lanes, j = w / p.sk_lanes;
    int64_t const b = sk_begin(p, j), e = sk_begin(p, j + 1), u0 = int64_t(pos) * p.k_tiles;
    if (u0 >= e) return none;
    WorkTileInfo info = work_at(p, p.sk_first + pos * p.sk_lanes + lane, rank_m, rank_n);
    info.split_idx = j - sk_owner(p, u0);
    info.k_tile_begin = int32_t((b > u0 ? b : u0) - u0);
    info.k_tile_end = int32_t((e < u0 + p.k_tiles ? e : u0 + p.k_tiles) - u0);
    return info;
  }

  // Worker w's first tail piece (invalid when it has none).
  CUTLASS_HOST_DEVICE static WorkTileInfo sk_first_piece(Params const& p, int32_t w, int rank_m, int rank_n) {
    int32_t const pos = w < p.sk_workers ? int32_t(sk_begin(p, w / p.sk_lanes) / p.k_tiles) : 0;
    return sk_piece(p, w, pos, rank_m, rank_n);
  }

  // Worker w's first step, and the step after cur (stride: the launched workers). Without
  // stream-K these are ids w and cur + stride.
  CUTLASS_HOST_DEVICE static WorkTileInfo first_work(Params const& p, int32_t w, int rank_m, int rank_n) {
    if constexpr (StreamK) {
      if (w >= p.sk_first) return sk_first_piece(p, w, rank_m, rank_n);
    }
    return work_at(p, w, rank_m, rank_n);
  }
  CUTLASS_HOST_DEVICE static WorkTileInfo next_work_of(Params const& p, WorkTileInfo const& cur, int32_t w,
                                                       int32_t stride, int rank_m, int rank_n) {
    if constexpr (StreamK) {
      if (cur.tile_id >= p.sk_first) return sk_piece(p, w, (cur.tile_id - p.sk_first) / p.sk_lanes + 1, rank_m, rank_n);
      if (cur.tile_id + stride >= p.sk_first) return sk_first_piece(p, w, rank_m, rank_n);
    }
    return work_at(p, cur.tile_id + stride, rank_m, rank_n);
  }

  // Grid laid out (ClusterM, ClusterN * W): blockIdx.x is the CTA's M-rank inside its
  // cluster, blockIdx.y / ClusterN the worker. Launch with cluster dims (ClusterM, ClusterN, 1).
  static dim3 get_grid_shape(Params const& p) {
    return dim3(ClusterM, ClusterN * launched_workers(p), 1);
  }

  // The map coord(t): pure, host and device. Swizzle is a compile-time constant, so the full
  // panels divide by shifts or multiplies; only the narrowed last panel needs last_width.
  CUTLASS_HOST_DEVICE static WorkTileInfo work_at(Params const& p, int32_t tile_id, int rank_m,
                                                  int rank_n) {
    WorkTileInfo w;
    w.tile_id = tile_id;
    w.valid = tile_id < p.num_ids;
    if (!w.valid) return w;
    int32_t unit = tile_id, t, panel, within, a, b;
    if constexpr (SplitK > 1) {
      p.split_div(unit, w.split_idx, tile_id);
      w.k_tile_begin = w.split_idx * p.k_tiles / p.splits;  // < 16 * 2^26: no overflow
      w.k_tile_end = (w.split_idx + 1) * p.k_tiles / p.splits;
    } else {
      w.k_tile_end = p.k_tiles;
    }
    p.per_batch(w.l_idx, t, unit);
    p.panel_ids(panel, within, t);
    if (panel < p.full_panels) {
      a = panel * Swizzle + within % Swizzle;
      b = within / Swizzle;
    } else {
      int32_t r;
      p.last_width(b, r, within);
      a = panel * Swizzle + r;
    }
    w.cluster_row = kRowRaster ? a : b;
    w.cluster_col = kRowRaster ? b : a;
    w.m_idx = w.cluster_row * ClusterM + rank_m;
    w.n_idx = w.cluster_col * ClusterN + rank_n;
    w.in_bounds = w.m_idx < p.tiles_m && w.n_idx < p.tiles_n;
    return w;
  }

  // ---- grouped (TileSchedule(grouped=True)): E problems sharing one extent, each with its own
  // other extent (MoE experts' rows, known on the device). Ids run group by group, and each
  // group's ids are walked by the dense map over that group's own grid (swizzle within a
  // group). `ids_before` (E + 1 entries, non-decreasing) counts the ids before each group;
  // `extent` is group e's M (group_m) or N (!group_m), `other` the shared one. l_idx is the
  // group; no split-K or stream-K. persistent_gemm.grouped_walk.GroupedScheduleGrid is the twin.
  // `extent(e)` is group e's extent.
  CUTLASS_HOST_DEVICE static int32_t group_ids(int32_t extent, int32_t other, bool group_m) {
    return extent > 0 ? grid_params(group_m ? extent : other, group_m ? other : extent, 1, 1).num_ids : 0;
  }
  template <class Extent>
  CUTLASS_HOST_DEVICE static WorkTileInfo grouped_work_at(int32_t const* ids_before, Extent const& extent,
                                                          int32_t groups, int32_t other, bool group_m,
                                                          int32_t tile_id, int rank_m, int rank_n) {
    static_assert(SplitK == 1 && !StreamK, "the grouped walk deals whole tiles: no split-K or stream-K");
    WorkTileInfo w;
    w.tile_id = tile_id;
    if (tile_id >= ids_before[groups]) return w;  // valid == false
    int32_t const lo = owner_group(ids_before, groups, tile_id);
    int32_t const ext = extent(lo);
    Params const p = grid_params(group_m ? ext : other, group_m ? other : ext, 1, 1);
    w = work_at(p, tile_id - ids_before[lo], rank_m, rank_n);
    w.tile_id = tile_id;
    w.l_idx = lo;
    return w;
  }

#if defined(__CUDACC__)
  // Grouped: `groups` is the CTA's table (build_groups), in shared memory.
  CUTLASS_DEVICE explicit PersistentTileScheduler(Params const& params, GroupTable const* groups = nullptr)
      : params_(params),
        groups_(groups),
        rank_m_(int(blockIdx.x)),
        rank_n_(int(blockIdx.y) % ClusterN),
        worker_(int(blockIdx.y) / ClusterN),
        stride_(int(gridDim.y) / ClusterN) {}

  // Grouped: one warp fills `table` with each group's rows (clamped into the activations) and
  // tile ids (its items); the caller then syncs the CTA before any role walks. Malformed offs /
  // counts are the kernel before's to report (trap_on_bad_rows: no printf beside wgmmas).
  CUTLASS_DEVICE static void build_groups(Params const& params, GroupTable& table, int lane) {
    static_assert(Grouped, "build_groups: only a grouped schedule has groups");
    int32_t const other = params.shared_extent;
    table.build(params.group_rows, [other](int32_t rows) { return group_ids(rows, other, GroupM); }, lane);
  }

  CUTLASS_DEVICE WorkTileInfo initial_work() const {
    if constexpr (Grouped) return grouped_at(worker_);
    else return first_work(params_, worker_, rank_m_, rank_n_);
  }

  CUTLASS_DEVICE WorkTileInfo next_work(WorkTileInfo const& cur) const {
    if constexpr (Grouped) return grouped_at(cur.tile_id + stride_);
    else return next_work_of(params_, cur, worker_, stride_, rank_m_, rank_n_);
  }

  // The rows a grouped tile covers (its l_idx is the group).
  CUTLASS_DEVICE GroupedTile grouped_tile(WorkTileInfo const& w) const {
    return {w.l_idx, groups_->row_begin[w.l_idx], groups_->row_end[w.l_idx]};
  }

  // The ids before group e: with GroupM and 1x1 clusters, its tiles of M before it times the
  // tiles of N (the SM100 grouped kernel's padded band of the group's first rows).
  CUTLASS_DEVICE int32_t ids_before(int32_t e) const { return groups_->item_begin[e]; }

  CUTLASS_DEVICE int worker() const { return worker_; }

 private:
  // The groups' extents (activation rows) against the shared one: the table's items are the ids.
  CUTLASS_DEVICE WorkTileInfo grouped_at(int32_t tile_id) const {
    GroupTable const* t = groups_;
    return grouped_work_at(t->item_begin, [t](int32_t e) { return t->row_end[e] - t->row_begin[e]; },
                           params_.group_rows.groups, params_.shared_extent, GroupM, tile_id, rank_m_, rank_n_);
  }

  Params params_;
  GroupTable const* groups_;
  int rank_m_, rank_n_, worker_, stride_;
#endif
};

// ---------------------------------------------------------------------------- selector ---
template <class Tag, int TileM, int TileN, class Enable = void>
struct TileSchedulerSelector {
  static_assert(sizeof(Tag) == 0,
                "persistent_gemm: unsupported tile scheduler tag (use scheduler::PersistentSchedule)");
};

template <int S, int CM, int CN, Raster R, int SK, bool StreamK, bool Lanes, bool Grouped, int TileM, int TileN>
struct TileSchedulerSelector<PersistentSchedule<S, CM, CN, R, SK, StreamK, Lanes, Grouped>, TileM, TileN> {
  using type = PersistentTileScheduler<PersistentSchedule<S, CM, CN, R, SK, StreamK, Lanes, Grouped>, TileM, TileN>;
};

}  // namespace persistent_gemm::scheduler
