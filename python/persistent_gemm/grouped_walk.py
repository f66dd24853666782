"""The grouped tile walk (``TileSchedule(grouped=True)`` for tile kernels): the Python twin of
``PersistentTileScheduler::grouped_work_at`` (``scheduler/tile_scheduler.hpp``).

E problems share one extent (the weight's N for MoE experts) and each has its own other extent
(its rows, known on the device: ``offs``). Linear ids run group by group; group ``e`` owns the ids
``[ids_before[e], ids_before[e + 1])``, as many as the dense walk of its own grid has, and those
ids are walked by the dense map over that grid (the panel swizzle stays within a group, clusters
and raster as the schedule says). An empty group owns none. Worker ``w`` visits ids ``w, w + W,
...`` as in the dense walk; there is no split-K or stream-K over groups.

    >>> g = GroupedScheduleGrid(TileSchedule(swizzle=2), extents=(256, 0, 100), other=512, tile=(128, 128))
    >>> g.ids_before
    (0, 8, 8, 12)
    >>> g.coord(9)       # (group, cluster_row, cluster_col)
    (2, 0, 1)
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .schedule import ScheduleGrid, TileSchedule, check_int

__all__ = ["GroupedScheduleGrid"]


@dataclass(frozen=True)
class GroupedScheduleGrid:
    """``schedule`` over groups of ``extents`` (each group's M, or its N with ``group_m=False``:
    a swap-AB kernel's tokens) by the shared ``other`` extent, cut into ``tile`` (tile_m, tile_n)."""

    schedule: TileSchedule
    extents: tuple[int, ...]
    other: int
    tile: tuple[int, int]
    group_m: bool = True
    grids: tuple[Optional[ScheduleGrid], ...] = field(init=False, repr=False)
    ids_before: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        s = self.schedule
        if s.split_k > 1 or s.stream_k:
            raise ValueError("the grouped walk deals whole tiles: split_k and stream_k do not apply")
        extents = tuple(check_int(f"extents[{i}]", e, minimum=0) for i, e in enumerate(self.extents))
        other = check_int("other", self.other)
        tm, tn = (check_int("tile_m", self.tile[0]), check_int("tile_n", self.tile[1]))
        grids = tuple(None if e == 0 else
                      s.over(*((e, other) if self.group_m else (other, e)), (tm, tn)) for e in extents)
        before = [0]
        for g in grids:
            before.append(before[-1] + (g.num_ids if g else 0))
        object.__setattr__(self, "extents", extents)
        object.__setattr__(self, "grids", grids)
        object.__setattr__(self, "ids_before", tuple(before))

    @property
    def num_ids(self) -> int:
        return self.ids_before[-1]

    def coord(self, t: int) -> tuple[int, int, int]:
        """``(group, cluster_row, cluster_col)`` of linear id ``t``."""
        if not 0 <= t < self.num_ids:
            raise IndexError(f"tile id t = {t} outside [0, {self.num_ids})")
        e = bisect_right(self.ids_before, t) - 1  # the last group starting at or before t: never an empty one
        return (e, *self.grids[e].coord(t - self.ids_before[e]))

    def work_order(self, workers: int) -> list[tuple[int, int, int, int, int]]:
        """``(worker, step, group, cluster_row, cluster_col)`` of every visit, worker by worker."""
        workers = check_int("workers", workers)
        return [(w, step, *self.coord(t)) for w in range(workers)
                for step, t in enumerate(range(w, self.num_ids, workers))]
