"""Per-wave L2 footprint of a kernel config's schedule: how many A row-panels and B column-panels
each wave of persistent workers touches, in bytes, and the plain-text tables of it.

It reads a :class:`~persistent_gemm.catalogue.KernelConfig` (tile, dtype, swap-AB) beside the
reference walk of :mod:`persistent_gemm.schedule`, which knows no configs.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple, Sequence

from .config_fields import DTYPE_B_BYTES, DTYPE_BYTES
from .kernel_config import as_config
from .schedule import ceil_div, check_int


class WaveFootprint(NamedTuple):
    """Operand panels one wave touches. Wave ``s`` is every worker's ``s``-th visit, i.e. ids
    ``s*W .. s*W + W - 1`` (a stream-K tail is one wave: ScheduleGrid.wave_visits). A *panel* is
    the full-K strip of A (one CTA tile row ``m``) or of B (one CTA tile column ``n``), or with
    split-K / stream-K the part of it in one unit's K range;
    tail CTAs of a cluster touch nothing. The last panel is clipped
    to M (or N). Byte counts cover the operands only (no block scales, no C/D)."""

    wave: int
    visits: int  #: cluster visits in this wave (``W``, fewer in the last wave; stream-K: its pieces)
    tiles: int  #: in-bounds CTA tiles produced
    a_panels: int  #: distinct (batch, m) A row-panels
    b_panels: int  #: distinct (batch, n) B column-panels
    a_bytes: int
    b_bytes: int
    total_bytes: int


def operand_bytes(dtype: str):
    """Bytes per element of A and of B as exact fractions (``e4m3xe2m1``: B is FP4, 1/2 byte)."""
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {tuple(DTYPE_BYTES)}, got {dtype!r}")
    a = Fraction(DTYPE_BYTES[dtype])
    return a, Fraction(DTYPE_B_BYTES[dtype]) if dtype in DTYPE_B_BYTES else a


def grid_operand_bytes(config):
    """Bytes per element of the kernel's rows operand and columns operand: :func:`operand_bytes`,
    swapped for a swap-AB config, whose rows are the weight (e2m1 for ``e4m3xe2m1``)."""
    a_el, b_el = operand_bytes(config.dtype)
    return (b_el, a_el) if config.swap_ab else (a_el, b_el)


def wave_footprint(config, M: int, N: int, K: int, workers: int, *, batch: int = 1) -> list[WaveFootprint]:
    """Per-wave footprint of ``config`` (a KernelConfig or canonical name) on an
    ``M x N x K`` GEMM run by ``workers`` persistent clusters.

    >>> from persistent_gemm.catalogue import KernelConfig
    >>> from persistent_gemm.schedule import TileSchedule
    >>> cfg = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=2))
    >>> [(f.a_panels, f.b_panels) for f in wave_footprint(cfg, 512, 512, 64, workers=8)]
    [(2, 4), (2, 4)]
    """
    config = as_config(config)
    K = check_int("K", K)
    workers = check_int("workers", workers)
    g = config.grid(M, N, batch=batch, K=K)
    M, N = g.M, g.N
    a_el, b_el = grid_operand_bytes(config)
    tm, tn, tk = g.tile_m, g.tile_n, config.tile[2]

    def k_extent(kb: int, ke: int) -> int:  # elements of K in a unit's K-tile range
        return min(K, ke * tk) - kb * tk

    out = []
    for s, visits in enumerate(g.wave_visits(workers)):
        ms, ns, tiles = set(), set(), 0
        for v in visits:  # a panel counts once per K range loaded in the wave (split-K, stream-K)
            for m, n in g.cta_tiles(v.cluster_row, v.cluster_col):
                ms.add((v.batch, m, v.k_begin, v.k_end))
                ns.add((v.batch, n, v.k_begin, v.k_end))
                tiles += 1
        a_elems = sum(min(tm, M - m * tm) * k_extent(kb, ke) for _, m, kb, ke in ms)
        b_elems = sum(min(tn, N - n * tn) * k_extent(kb, ke) for _, n, kb, ke in ns)
        a_b, b_b = ceil_div(a_elems * a_el.numerator, a_el.denominator), ceil_div(
            b_elems * b_el.numerator, b_el.denominator
        )
        out.append(WaveFootprint(s, len(visits), tiles, len(ms), len(ns), a_b, b_b, a_b + b_b))
    return out


def footprint_summary(
    config, M: int, N: int, K: int, workers: int, *, batch: int = 1, footprints=None
) -> dict:
    """Totals over the waves of :func:`wave_footprint` (pass ``footprints`` to reuse them).

    ``total_bytes`` is what the waves load if nothing survives in L2 from one wave to the next;
    ``compulsory_bytes`` is every operand byte once; their ratio is ``traffic_ratio``.
    """
    config = as_config(config)
    K, workers = check_int("K", K), check_int("workers", workers)
    g = config.grid(M, N, batch=batch, K=K)
    M, N, batch = g.M, g.N, g.batch
    fps = footprints if footprints is not None else wave_footprint(config, M, N, K, workers, batch=batch)
    if not fps:
        raise ValueError("footprints must hold at least one wave (as wave_footprint returns), got none")
    a_el, b_el = grid_operand_bytes(config)
    compulsory = ceil_div(batch * M * K * a_el.numerator, a_el.denominator) + ceil_div(
        batch * N * K * b_el.numerator, b_el.denominator
    )
    n = len(fps)
    total = sum(f.total_bytes for f in fps)
    return {
        "config": config.name,
        "M": M,
        "N": N,
        "K": K,
        "batch": batch,
        "tiles_m": g.tiles_m,
        "tiles_n": g.tiles_n,
        "clusters_m": g.clusters_m,
        "clusters_n": g.clusters_n,
        "num_ids": g.num_ids,
        "workers": workers,
        "waves": n,
        "mean_bytes": total / n,
        "max_bytes": max(f.total_bytes for f in fps),
        "mean_a_bytes": sum(f.a_bytes for f in fps) / n,
        "mean_b_bytes": sum(f.b_bytes for f in fps) / n,
        "mean_a_panels": sum(f.a_panels for f in fps) / n,
        "mean_b_panels": sum(f.b_panels for f in fps) / n,
        "max_a_panels": max(f.a_panels for f in fps),
        "max_b_panels": max(f.b_panels for f in fps),
        "a_panel_loads": sum(f.a_panels for f in fps),
        "b_panel_loads": sum(f.b_panels for f in fps),
        "panel_loads": sum(f.a_panels + f.b_panels for f in fps),
        "total_bytes": total,
        "compulsory_bytes": compulsory,
        "traffic_ratio": total / compulsory,
    }


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def format_footprint(footprints: Sequence[WaveFootprint], max_rows: int | None = None) -> str:
    """Plain-text table, one row per wave (the middle elided past ``max_rows``)."""
    if max_rows is not None:
        max_rows = check_int("max_rows", max_rows)
    head = ("wave", "ids", "tiles", "A panels", "B panels", "A MiB", "B MiB", "total MiB")
    rows = [
        (str(f.wave), str(f.visits), str(f.tiles), str(f.a_panels), str(f.b_panels), _mib(f.a_bytes), _mib(f.b_bytes), _mib(f.total_bytes))
        for f in footprints
    ]
    if max_rows is not None and len(rows) > max_rows:
        k = max(1, max_rows // 2)
        tail = rows[len(rows) - (max_rows - k):] if max_rows > k else []
        rows = rows[:k] + [("...",) + ("",) * (len(head) - 1)] + tail
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, rows)])


def format_summary(summary: dict) -> str:
    """Plain-text block for a :func:`footprint_summary` dict."""
    s = summary
    return "\n".join(
        [
            f"waves               {s['waves']} ({s['workers']} workers, {s['num_ids']} ids)",
            f"A panels per wave   mean {s['mean_a_panels']:.2f}  max {s['max_a_panels']}",
            f"B panels per wave   mean {s['mean_b_panels']:.2f}  max {s['max_b_panels']}",
            f"bytes per wave      mean {_mib(s['mean_bytes'])} MiB (A {_mib(s['mean_a_bytes'])} + B {_mib(s['mean_b_bytes'])})"
            f"  max {_mib(s['max_bytes'])} MiB",
            f"panel loads         {s['panel_loads']} (A {s['a_panel_loads']} + B {s['b_panel_loads']};"
            f" {s['tiles_m'] * s['batch']} + {s['tiles_n'] * s['batch']} distinct)",
            f"total bytes         {_mib(s['total_bytes'])} MiB over all waves"
            f" = {s['traffic_ratio']:.2f}x compulsory {_mib(s['compulsory_bytes'])} MiB",
        ]
    )


