"""The persistent tile schedule: the user-visible object and its pure-Python reference.

Semantics (one iteration clock, identical in Python and in
``include/persistent_gemm/scheduler/tile_scheduler.hpp``):

* The (M, N) output is cut into ``tile_m x tile_n`` tiles: ``Mt = ceil(M / tile_m)``,
  ``Nt = ceil(N / tile_n)``.
* Tiles are grouped into clusters of ``cluster_m x cluster_n`` CTAs. The cluster grid is
  ``Mc = ceil(Mt / cluster_m)`` by ``Nc = ceil(Nt / cluster_n)``; a CTA of rank
  ``(rank_m, rank_n)`` in cluster ``(r, c)`` owns tile ``(r * cluster_m + rank_m,
  c * cluster_n + rank_n)``. A tile outside ``Mt x Nt`` belongs to a *tail* cluster: that CTA
  does no loads or stores of its own but still joins its cluster's barriers and multicasts.
* ``W`` persistent workers (clusters). Worker ``w`` visits linear ids ``w, w + W, w + 2W, ...``
  while the id is below ``L * Mc * Nc`` (``L`` batches stacked on top).
* ``coord(t)`` maps a linear id to a cluster coordinate. Raster ``"row"``: the cluster grid is
  cut into panels of ``swizzle`` cluster rows; ids walk one panel completely before the next,
  going down the panel's rows first and then along N. The last panel is narrowed to the rows
  that are left, so no id is padded, wasted or dropped. Raster ``"column"`` is the transpose
  (panels of ``swizzle`` cluster columns). ``swizzle=1`` is plain raster order.

For a 1x1 cluster and row raster this is the order of Triton's ``GROUP_SIZE_M`` and of
DeepGEMM's grouped swizzle.

* Split-K (``split_k = S > 1``): each cluster coordinate is ``S' = min(S, Kt)`` work units
  (``Kt = ceil(K / tile_k)`` K-tiles), unit ``s`` reducing the K-tiles
  ``[s * Kt // S', (s + 1) * Kt // S')``. Linear id ``t`` is unit ``t % S'`` of the cluster
  coordinate ``coord`` gives for ``t // S'``, so a tile's units are consecutive on the clock and
  run side by side in one wave. The sm90a 16-bit and e4m3 kernels reduce them; others refuse
  split-K (:meth:`~persistent_gemm.catalogue.KernelConfig.kernel_rejection`).

* Stream-K (``stream_k=True``): the ``U = L * Mc * Nc`` units are cut by
  :func:`stream_k_partition` into a data-parallel head and a stream-K tail. With ``U`` a multiple
  of ``W`` every unit is data-parallel. Otherwise the tail is the last ``U % W + W`` units (all
  ``U`` when ``U < W``) and the head the ``(U // W - 1) * W`` before it, walked as above (ids
  ``w, w + W, ...``). The tail's ``units x Kt`` (unit, K-tile) iterations, unit-major, are dealt
  to ``W' <= W`` workers as contiguous ranges differing in length by at most one
  (``begin(w) = w * q + min(w, r)``, ``q, r = divmod(iterations, W')``). After its head ids a
  worker visits its range cut at unit boundaries: each *piece* is one unit's K-tiles
  ``[k_begin, k_end)``, ``split`` its index among that unit's pieces in K order. Piece 0 of a unit
  reduces it and writes D; a later piece (only ever its worker's first) publishes fp32 partial
  sums that piece 0 adds in worker order, so the sum is fixed by (shape, W). The last wave is
  filled at any K-tile boundary, not only at whole units.
* Stream-K lanes (``stream_k_lanes=True``, the default): dealt unit-major, the tail's units
  that share an operand strip (a column's bands, row raster) would be reduced by different
  workers at unrelated K offsets, so the strip is read from DRAM once per band. Instead the tail
  is cut into ``Λ`` lanes (:func:`stream_k_lanes`: the width of the panel the tail lies in, when
  the tail is whole panel columns; else 1): tail unit ``u`` is position ``u // Λ`` of lane
  ``u % Λ``, worker ``w`` works in lane ``w % Λ`` as its ``w // Λ``-th worker, and each lane's
  positions are dealt as above to ``W' / Λ`` workers (``W'`` rounded down to a multiple of
  ``Λ``). Workers ``Λj .. Λj + Λ - 1`` then reduce the same column's bands over the same K
  ranges at the same time, and the strip is read once.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Iterator, Literal, NamedTuple, Optional, Sequence

from .stream_k import STREAM_K_MIN_ITERS, EvenShare, StreamKPartition, stream_k_lanes, stream_k_partition

Raster = Literal["row", "column"]

#: Cluster extents a Hopper/Blackwell launch accepts per dimension (portable cluster size <= 8).
CLUSTER_EXTENTS = (1, 2, 4)
MAX_CLUSTER_SIZE = 8
MAX_SWIZZLE = 64
MAX_SPLIT_K = 16
#: Other spellings of a raster order, normalised to "row" / "column" (the canonical name's token).
RASTER_ALIASES = {"row": "row", "rows": "row", "r": "row", "column": "column", "col": "column",
                  "columns": "column", "c": "column"}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_int(name: str, value, minimum: Optional[int] = 1, maximum: Optional[int] = None) -> int:
    """``value`` as a plain int, or a TypeError/ValueError naming ``name`` and the value.

    Anything with ``__index__`` (int, numpy integers) is accepted; bool is not (``True`` as an
    extent is always a bug), nor is a float, even a whole one (``2.0`` hides a division).
    ``minimum=1`` is for counts and extents, ``minimum=0`` for indices, ``None`` for no bound
    (the caller checks the range itself)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    v = operator.index(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        if maximum is not None:
            raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {v}")
        what = "a positive int" if minimum == 1 else "a non-negative int" if minimum == 0 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {v}")
    return v


@dataclass(frozen=True)
class TileSchedule:
    """How persistent workers walk the output tiles.

    Parameters
    ----------
    swizzle : int
        Panel width S in clusters (rows for ``raster="row"``, columns for ``"column"``).
        Ids walk one panel of S cluster rows before the next panel starts, so a wave of
        workers covers a near-square block of S rows by W/S columns instead of one long row:
        it touches fewer B column-panels (row raster) for a few more A row-panels, and the
        sum is what has to stay in L2 (see :func:`persistent_gemm.footprint.footprint_summary`).
        ``1`` is plain raster order. Must be in ``[1, 64]``.
    cluster : tuple of int
        ``(cluster_m, cluster_n)``: CTAs per thread-block cluster. Each extent is 1, 2 or 4
        and their product at most 8. On SM90 a cluster multicasts A along N and B along M.
    raster : {"row", "column"}
        ``"row"``: consecutive panels go down M, and inside a panel ids move along N after
        covering the panel's rows. ``"column"``: the transpose.
    split_k : int
        Work units per output tile, each reducing a contiguous range of K-tiles (module
        docstring); ``1`` (the default) is one unit per tile. Must be in ``[1, 16]``.
    stream_k : bool
        Data-parallel for the full waves, stream-K over the rest (module docstring): the last
        wave is shared out in K-tiles, not whole tiles. Excludes ``split_k > 1``.
    stream_k_lanes : bool
        With ``stream_k``: deal the tail in lanes, so that the units sharing an operand strip
        run side by side over the same K ranges (module docstring); ``False`` deals it
        unit-major. Must stay ``True`` (its default) without ``stream_k``.
    grouped : bool
        Walk a grouped problem (MoE experts, ``pg.grouped_mm``): ``E`` problems sharing N and K
        whose row counts are known only on the device (torch's ``offs``). Each group's rows are
        cut into items of ``tile_n`` rows (a few-row group is one item, not padded to a full
        tile), and the items' (item, tile, K-chunk) units are dealt like one problem's: every
        worker computes the same item table from ``offs`` at launch, so nothing reads ``offs``
        on the host (:func:`persistent_gemm.strip_schedule.grouped_strip_stream_k` is the
        reference walk). Tile kernels walk groups by :mod:`persistent_gemm.grouped_walk`: each
        group's tiles by the dense map over its own grid, group after group (no split-K or
        stream-K); the grouped kernels built are the decode GEMV and the sm90a MX bf16 route's
        prefill tiles.

    Examples
    --------
    A 4x4 tile grid, 1x1 cluster, swizzle 2, row raster. Ids fill a 2-row panel
    column by column, then the next panel:

    >>> s = TileSchedule(swizzle=2)
    >>> g = s.over(M=4 * 128, N=4 * 128, tile=(128, 128))
    >>> [g.coord(t) for t in range(6)]
    [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]

    Three cluster rows with swizzle 2: the last panel is narrowed to one row, not padded:

    >>> g = TileSchedule(swizzle=2).over(M=3 * 128, N=2 * 128, tile=(128, 128))
    >>> [g.coord(t) for t in range(g.num_ids)]
    [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]

    With two workers, worker 1 visits ids 1, 3, 5:

    >>> [w.tile_id for w in g.tiles_of(1, workers=2)]
    [1, 3, 5]
    """

    swizzle: int = 1
    cluster: tuple[int, int] = (1, 1)
    raster: Raster = "row"
    split_k: int = 1
    stream_k: bool = False
    stream_k_lanes: bool = True
    grouped: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.swizzle, bool) or not isinstance(self.swizzle, int):
            raise TypeError(f"swizzle must be an int, got {self.swizzle!r}")
        if not 1 <= self.swizzle <= MAX_SWIZZLE:
            raise ValueError(f"swizzle must be in [1, {MAX_SWIZZLE}], got {self.swizzle}")
        try:
            cluster = tuple(self.cluster)
        except TypeError:  # e.g. cluster=2: say which argument, not "int is not iterable"
            raise TypeError(f"cluster must be a pair of ints (cluster_m, cluster_n), got {self.cluster!r}") from None
        if len(cluster) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) for c in cluster):
            raise ValueError(f"cluster must be a pair of ints (cluster_m, cluster_n), got {self.cluster!r}")
        if any(c not in CLUSTER_EXTENTS for c in cluster):
            raise ValueError(f"cluster extents must each be one of {CLUSTER_EXTENTS}, got {cluster}")
        if cluster[0] * cluster[1] > MAX_CLUSTER_SIZE:
            raise ValueError(f"cluster size {cluster[0]}x{cluster[1]} exceeds the portable maximum of {MAX_CLUSTER_SIZE} CTAs")
        object.__setattr__(self, "cluster", cluster)
        if isinstance(self.raster, str) and self.raster.lower() in RASTER_ALIASES:
            object.__setattr__(self, "raster", RASTER_ALIASES[self.raster.lower()])
        if not isinstance(self.raster, str) or self.raster not in ("row", "column"):
            raise ValueError(f"raster must be 'row' or 'column' (aliases {sorted(RASTER_ALIASES)}), "
                             f"got {self.raster!r}")
        if isinstance(self.split_k, bool) or not isinstance(self.split_k, int):
            raise TypeError(f"split_k must be an int, got {self.split_k!r}")
        if not 1 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(f"split_k must be in [1, {MAX_SPLIT_K}], got {self.split_k}")
        if not isinstance(self.stream_k, bool):
            raise TypeError(f"stream_k must be a bool, got {self.stream_k!r}")
        if self.stream_k and self.split_k > 1:
            raise ValueError(f"stream_k=True and split_k={self.split_k} are two ways to split K: choose one")
        if not isinstance(self.stream_k_lanes, bool):
            raise TypeError(f"stream_k_lanes must be a bool, got {self.stream_k_lanes!r}")
        if not self.stream_k_lanes and not self.stream_k:
            raise ValueError("stream_k_lanes=False deals a stream-K tail unit-major: it needs stream_k=True")
        if not isinstance(self.grouped, bool):
            raise TypeError(f"grouped must be a bool, got {self.grouped!r}")

    @property
    def cluster_m(self) -> int:
        return self.cluster[0]

    @property
    def cluster_n(self) -> int:
        return self.cluster[1]

    def over(self, M: int, N: int, tile: Sequence[int], batch: int = 1, K: Optional[int] = None) -> "ScheduleGrid":
        """Bind the schedule to a problem: an (M, N) output (``batch`` of them) cut into ``tile``
        (``(tile_m, tile_n[, tile_k])``). ``K`` with a ``tile_k`` gives the K-tiles that
        split-K divides; without them the problem is one K-tile deep."""
        if isinstance(tile, (str, bytes)) or not hasattr(tile, "__getitem__") or not hasattr(tile, "__len__"):
            raise TypeError(f"tile must be a sequence (tile_m, tile_n[, tile_k]) of ints, got {tile!r}")
        if len(tile) not in (2, 3):
            raise ValueError(f"tile must be (tile_m, tile_n) or (tile_m, tile_n, tile_k), got {tile!r}")
        k_tiles = 1
        if K is not None:
            if len(tile) != 3:
                raise ValueError(f"K needs a tile with a tile_k, got {tile!r}")
            k_tiles = ceil_div(check_int("K", K), check_int("tile_k", tile[2]))
        return ScheduleGrid(self, M, N, tile[0], tile[1], batch, k_tiles)

    def replace(self, **changes) -> "TileSchedule":
        return dataclasses.replace(self, **changes)


class WorkTile(NamedTuple):
    """One visit of a worker: the step on its clock, the linear id, the cluster coordinate and
    the K-tile range ``[k_begin, k_end)`` it reduces (split ``split``; the whole K without split-K)."""

    step: int
    tile_id: int
    batch: int
    cluster_row: int
    cluster_col: int
    split: int = 0
    k_begin: int = 0
    k_end: int = 1


@dataclass(frozen=True)
class ScheduleGrid:
    """A :class:`TileSchedule` bound to one problem shape. This is the reference the C++
    scheduler is tested against, tile for tile."""

    schedule: TileSchedule
    M: int
    N: int
    tile_m: int
    tile_n: int
    batch: int = 1
    k_tiles: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, TileSchedule):
            raise TypeError(f"schedule must be a TileSchedule, got {type(self.schedule).__name__}")
        for name in ("M", "N", "tile_m", "tile_n", "batch", "k_tiles"):
            object.__setattr__(self, name, check_int(name, getattr(self, name)))

    # -- extents ---------------------------------------------------------------------------
    @property
    def tiles_m(self) -> int:
        return ceil_div(self.M, self.tile_m)

    @property
    def tiles_n(self) -> int:
        return ceil_div(self.N, self.tile_n)

    @property
    def clusters_m(self) -> int:
        return ceil_div(self.tiles_m, self.schedule.cluster_m)

    @property
    def clusters_n(self) -> int:
        return ceil_div(self.tiles_n, self.schedule.cluster_n)

    @property
    def panel_extents(self) -> tuple[int, int]:
        """``(major, minor)`` in clusters: panels are stacked along major (M for row raster),
        ids sweep minor inside a panel."""
        cm, cn = self.clusters_m, self.clusters_n
        return (cm, cn) if self.schedule.raster == "row" else (cn, cm)

    @property
    def splits(self) -> int:
        """Work units per cluster coordinate: ``split_k``, clamped to the K-tiles."""
        return min(self.schedule.split_k, self.k_tiles)

    @property
    def num_ids(self) -> int:
        """Linear ids on the clock: one per cluster-sized work unit, over all batches and splits."""
        return self.batch * self.clusters_m * self.clusters_n * self.splits

    # -- the map ---------------------------------------------------------------------------
    def coord(self, t: int) -> tuple[int, int]:
        """Cluster coordinate ``(cluster_row, cluster_col)`` of linear id ``t`` (batch dropped)."""
        return self.coord_batched(t)[1:]

    def coord_batched(self, t: int) -> tuple[int, int, int]:
        if type(t) is not int:  # the hot path (property tests, order) skips the slower check
            t = check_int("t", t, minimum=None)
        if not 0 <= t < self.num_ids:
            raise IndexError(f"tile id t = {t} outside [0, {self.num_ids})")
        t //= self.splits  # the splits of one cluster coordinate are consecutive ids
        per_batch = self.clusters_m * self.clusters_n
        l, t = divmod(t, per_batch)
        s = self.schedule.swizzle
        major, minor = self.panel_extents
        panel, within = divmod(t, s * minor)
        width = min(s, major - panel * s)  # the last panel is narrowed, never padded
        a = panel * s + within % width
        b = within // width
        return (l, a, b) if self.schedule.raster == "row" else (l, b, a)

    def k_range(self, t: int) -> tuple[int, int, int]:
        """``(split, k_begin, k_end)`` of linear id ``t``: the K-tiles its work unit reduces."""
        v = self._id_visit(0, t)  # coord_batched checks the id
        return v.split, v.k_begin, v.k_end

    def cta_tiles(self, cluster_row: int, cluster_col: int) -> list[tuple[int, int]]:
        """In-bounds CTA tiles (m, n) of one cluster; tail CTAs (outside Mt x Nt) are left out."""
        if type(cluster_row) is not int or type(cluster_col) is not int:  # hot path: plain ints
            cluster_row = check_int("cluster_row", cluster_row, minimum=0)
            cluster_col = check_int("cluster_col", cluster_col, minimum=0)
        if not (0 <= cluster_row < self.clusters_m and 0 <= cluster_col < self.clusters_n):
            raise IndexError(f"cluster_row, cluster_col = ({cluster_row}, {cluster_col}) outside the "
                             f"{self.clusters_m} x {self.clusters_n} cluster grid")
        cm, cn = self.schedule.cluster
        return [
            (cluster_row * cm + rm, cluster_col * cn + rn)
            for rm in range(cm)
            for rn in range(cn)
            if cluster_row * cm + rm < self.tiles_m and cluster_col * cn + rn < self.tiles_n
        ]

    # -- the clock -------------------------------------------------------------------------
    def tiles_of(self, worker: int, workers: int) -> Iterator[WorkTile]:
        """What worker ``worker`` of ``workers`` visits, step by step."""
        # Checked here, not on the first next(): a bad call fails where it is made.
        workers = check_int("workers", workers)
        worker = check_int("worker", worker, minimum=None)
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} outside [0, {workers})")
        return self._visits(worker, workers)

    def _visits(self, worker: int, workers: int) -> Iterator[WorkTile]:
        if not self.schedule.stream_k:
            for step, t in enumerate(range(worker, self.num_ids, workers)):
                yield self._id_visit(step, t)
            return
        part = self.stream_k(workers)
        for step, t in enumerate(range(worker, part.dp_units, workers)):
            yield self._id_visit(step, t)
        yield from self._tail_visits(worker, part, part.dp_units // workers)

    def _id_visit(self, step: int, t: int) -> WorkTile:
        """Linear id ``t`` visited at ``step``: its coordinate and its split's K range."""
        S, Kt = self.splits, self.k_tiles
        l, r, c = self.coord_batched(t)
        s = t % S
        return WorkTile(step, t, l, r, c, s, s * Kt // S, (s + 1) * Kt // S)

    def _tail_visits(self, worker: int, part: StreamKPartition, step: int) -> Iterator[WorkTile]:
        """Worker ``worker``'s stream-K pieces from ``step`` on: its range cut at unit boundaries."""
        if worker >= part.sk_workers:
            return
        Kt, head, lanes = self.k_tiles, part.dp_units, part.lanes
        lane, j = worker % lanes, worker // lanes
        b, e = part.begin(j), part.begin(j + 1)
        for pos in range(b // Kt, ceil_div(e, Kt)):  # the lane positions this range meets, in K order
            u = pos * lanes + lane
            l, r, c = self.coord_batched(head + u)
            yield WorkTile(step, head + u, l, r, c, j - part.owner(pos * Kt), max(b, pos * Kt) - pos * Kt,
                           min(e, (pos + 1) * Kt) - pos * Kt)
            step += 1

    def stream_k(self, workers: int) -> StreamKPartition:
        """This problem's stream-K head and tail on ``workers`` workers (:func:`stream_k_partition`),
        in lanes unless the schedule says ``stream_k_lanes=False``."""
        part = stream_k_partition(self.num_ids, self.k_tiles, check_int("workers", workers))
        if not self.schedule.stream_k_lanes:
            return part
        return part.with_lanes(stream_k_lanes(part, *self.panel_extents, self.schedule.swizzle))

    def order(self, workers: int) -> list[tuple[int, int, int, int, int]]:
        """Full order: ``(worker, step, batch, cluster_row, cluster_col)`` for every visit,
        sorted by worker then step. This is what the C++ parity entry point returns."""
        workers = check_int("workers", workers)
        return [(w, *self._flat(v)) for w in range(workers) for v in self.tiles_of(w, workers)]

    @staticmethod
    def _flat(v: WorkTile) -> tuple[int, int, int, int]:
        return (v.step, v.batch, v.cluster_row, v.cluster_col)

    def work_order(self, workers: int) -> list[tuple[int, ...]]:
        """:meth:`order` with each unit's K range: ``(worker, step, batch, cluster_row,
        cluster_col, split, k_begin, k_end)``. This is what the C++ parity entry point returns."""
        workers = check_int("workers", workers)
        return [(w, v.step, v.batch, v.cluster_row, v.cluster_col, v.split, v.k_begin, v.k_end)
                for w in range(workers) for v in self.tiles_of(w, workers)]

    def wave_visits(self, workers: int) -> list[list[WorkTile]]:
        """Every visit, grouped by wave (:meth:`wave`)."""
        return [self.wave(workers, s) for s in range(self.waves(workers))]

    def wave(self, workers: int, s: int) -> list[WorkTile]:
        """The visits of wave ``s``: step ``s`` of every worker, ids ``s*W .. s*W + W - 1``; a
        stream-K tail (its pieces run side by side, one range per worker) is the last wave whole."""
        workers = check_int("workers", workers)
        head = self.num_ids
        if self.schedule.stream_k:
            part = self.stream_k(workers)
            head = part.dp_units
            if s * workers >= head:
                return [v for w in range(workers) for v in self._tail_visits(w, part, s)]
        return [self._id_visit(s, t) for t in range(s * workers, min((s + 1) * workers, head))]

    def waves(self, workers: int) -> int:
        """Steps of the busiest worker, counting a stream-K tail's range as one wave."""
        if self.schedule.stream_k:
            part = self.stream_k(workers)
            return part.dp_units // workers + (1 if part.sk_units else 0)
        return ceil_div(self.num_ids, check_int("workers", workers))


def default_workers(sm_count: int, schedule: TileSchedule) -> int:
    """Persistent workers that fit: one CTA per SM, whole clusters only."""
    sm_count = check_int("sm_count", sm_count)
    if not isinstance(schedule, TileSchedule):
        raise TypeError(f"schedule must be a TileSchedule, got {type(schedule).__name__}")
    return max(1, sm_count // (schedule.cluster_m * schedule.cluster_n))
