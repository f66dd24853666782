"""Scheduler instantiations for the parity tests alone (codegen writes them into the catalogue
table of ``_C``; no kernel is built for them): the kernel catalogue is kept lean for compile
time, but the scheduler's template space (swizzle, cluster, raster, narrowed panels, split-K,
stream-K) must be proven on more points than it uses (tests/test_scheduler_parity.py)."""

from __future__ import annotations

from .catalogue import CATALOGUE, KernelConfig
from .schedule import TileSchedule


def _probe_schedules() -> tuple[KernelConfig, ...]:
    """The probes: every raster, several swizzles and clusters, split-K and stream-K."""
    probes = []
    for swizzle in (1, 3, 8):
        for cluster in ((1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (1, 4)):
            for raster in ("row", "column"):
                sched = TileSchedule(swizzle=swizzle, cluster=cluster, raster=raster)
                probes.append(KernelConfig(tile=(128, 64, 64), schedule=sched, kernel="pingpong"))
    # Split-K: the K range of each unit, with clusters and both rasters (host walk only).
    for swizzle, cluster, raster, split_k in ((1, (1, 1), "row", 2), (3, (2, 1), "column", 3),
                                               (8, (1, 2), "row", 4), (2, (2, 2), "column", 16)):
        sched = TileSchedule(swizzle=swizzle, cluster=cluster, raster=raster, split_k=split_k)
        probes.append(KernelConfig(tile=(128, 64, 64), schedule=sched, kernel="pingpong"))
    # Stream-K: the head / tail cut and the tail's pieces, with clusters and both rasters.
    for swizzle, cluster, raster in ((1, (1, 1), "row"), (3, (2, 1), "column"), (8, (1, 2), "row"),
                                     (2, (2, 2), "column")):
        sched = TileSchedule(swizzle=swizzle, cluster=cluster, raster=raster, stream_k=True)
        probes.append(KernelConfig(tile=(128, 64, 64), schedule=sched, kernel="pingpong"))
    # ... and dealt unit-major (no lanes), which the catalogue does not use.
    probes.append(KernelConfig(tile=(128, 64, 64), kernel="pingpong",
                               schedule=TileSchedule(swizzle=3, cluster=(2, 1), stream_k=True, stream_k_lanes=False)))
    names = {c.name for c in CATALOGUE}
    return tuple(p for p in probes if p.name not in names)


PARITY_PROBES: tuple[KernelConfig, ...] = _probe_schedules()
