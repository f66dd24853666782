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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Literal, NamedTuple, Sequence

Raster = Literal["row", "column"]

#: Cluster extents a Hopper/Blackwell launch accepts per dimension (portable cluster size <= 8).
CLUSTER_EXTENTS = (1, 2, 4)
MAX_CLUSTER_SIZE = 8
MAX_SWIZZLE = 64


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TileSchedule:
    """How persistent workers walk the output tiles.

    Parameters
    ----------
    swizzle : int
        Panel width S in clusters (rows for ``raster="row"``, columns for ``"column"``).
        Ids walk one panel of S cluster rows before the next panel starts, which keeps the
        A row-panels (row raster) that a wave of workers touches few, so they stay in L2.
        ``1`` is plain raster order. Must be in ``[1, 64]``.
    cluster : tuple of int
        ``(cluster_m, cluster_n)``: CTAs per thread-block cluster. Each extent is 1, 2 or 4
        and their product at most 8. On SM90 a cluster multicasts A along N and B along M.
    raster : {"row", "column"}
        ``"row"``: consecutive panels go down M, and inside a panel ids move along N after
        covering the panel's rows. ``"column"``: the transpose.

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

    def __post_init__(self) -> None:
        if isinstance(self.swizzle, bool) or not isinstance(self.swizzle, int):
            raise TypeError(f"swizzle must be an int, got {self.swizzle!r}")
        if not 1 <= self.swizzle <= MAX_SWIZZLE:
            raise ValueError(f"swizzle must be in [1, {MAX_SWIZZLE}], got {self.swizzle}")
        cluster = tuple(self.cluster)
        if len(cluster) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) for c in cluster):
            raise ValueError(f"cluster must be a pair of ints (cluster_m, cluster_n), got {self.cluster!r}")
        if any(c not in CLUSTER_EXTENTS for c in cluster):
            raise ValueError(f"cluster extents must each be one of {CLUSTER_EXTENTS}, got {cluster}")
        if cluster[0] * cluster[1] > MAX_CLUSTER_SIZE:
            raise ValueError(f"cluster size {cluster[0]}x{cluster[1]} exceeds the portable maximum of {MAX_CLUSTER_SIZE} CTAs")
        object.__setattr__(self, "cluster", cluster)
        if self.raster not in ("row", "column"):
            raise ValueError(f"raster must be 'row' or 'column', got {self.raster!r}")

    @property
    def cluster_m(self) -> int:
        return self.cluster[0]

    @property
    def cluster_n(self) -> int:
        return self.cluster[1]

    def over(self, M: int, N: int, tile: Sequence[int], batch: int = 1) -> "ScheduleGrid":
        """Bind the schedule to a problem: an (M, N) output (``batch`` of them) cut into ``tile``."""
        return ScheduleGrid(self, M, N, int(tile[0]), int(tile[1]), batch)

    def replace(self, **changes) -> "TileSchedule":
        return dataclasses.replace(self, **changes)


class WorkTile(NamedTuple):
    """One visit of a worker: the step on its clock, the linear id and the cluster coordinate."""

    step: int
    tile_id: int
    batch: int
    cluster_row: int
    cluster_col: int


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

    def __post_init__(self) -> None:
        for name in ("M", "N", "tile_m", "tile_n", "batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")

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
    def num_ids(self) -> int:
        """Linear ids on the clock: one per cluster-sized work unit, over all batches."""
        return self.batch * self.clusters_m * self.clusters_n

    # -- the map ---------------------------------------------------------------------------
    def coord(self, t: int) -> tuple[int, int]:
        """Cluster coordinate ``(cluster_row, cluster_col)`` of linear id ``t`` (batch dropped)."""
        return self.coord_batched(t)[1:]

    def coord_batched(self, t: int) -> tuple[int, int, int]:
        if not 0 <= t < self.num_ids:
            raise IndexError(f"tile id {t} outside [0, {self.num_ids})")
        per_batch = self.clusters_m * self.clusters_n
        l, t = divmod(t, per_batch)
        s = self.schedule.swizzle
        # "major" is the dimension panels are stacked along, "minor" the one ids sweep.
        if self.schedule.raster == "row":
            major, minor = self.clusters_m, self.clusters_n
        else:
            major, minor = self.clusters_n, self.clusters_m
        panel, within = divmod(t, s * minor)
        width = min(s, major - panel * s)  # the last panel is narrowed, never padded
        a = panel * s + within % width
        b = within // width
        return (l, a, b) if self.schedule.raster == "row" else (l, b, a)

    def cta_tiles(self, cluster_row: int, cluster_col: int) -> list[tuple[int, int]]:
        """In-bounds CTA tiles (m, n) of one cluster; tail CTAs (outside Mt x Nt) are left out."""
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
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} outside [0, {workers})")
        for step, t in enumerate(range(worker, self.num_ids, workers)):
            l, r, c = self.coord_batched(t)
            yield WorkTile(step, t, l, r, c)

    def order(self, workers: int) -> list[tuple[int, int, int, int, int]]:
        """Full order: ``(worker, step, batch, cluster_row, cluster_col)`` for every visit,
        sorted by worker then step. This is what the C++ parity entry point returns."""
        return [(w, *self._flat(v)) for w in range(workers) for v in self.tiles_of(w, workers)]

    @staticmethod
    def _flat(v: WorkTile) -> tuple[int, int, int, int]:
        return (v.step, v.batch, v.cluster_row, v.cluster_col)

    def waves(self, workers: int) -> int:
        return ceil_div(self.num_ids, workers)


def default_workers(sm_count: int, schedule: TileSchedule) -> int:
    """Persistent workers that fit: one CTA per SM, whole clusters only."""
    return max(1, sm_count // (schedule.cluster_m * schedule.cluster_n))
