"""The picture of a schedule as data, all pure Python: which worker produces each output tile, at
which step (wave). :func:`visit_grid` (step and worker per tile), :func:`wave_edges` (the
boundaries between waves), :func:`cluster_outlines` and :func:`panel_outlines` (the clusters and
swizzle panels as tile rectangles), :func:`wave_operand_footprint` (the A rows and B columns one
wave reads, in bytes, against every tile loading its own), :func:`build_status` (built,
JIT-compiled at first use, or impossible) and :func:`panel_data` (everything a picture says,
titles and captions included). :mod:`.picture_layers` draws it; :mod:`.picture` is the face.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from functools import lru_cache
from fractions import Fraction
from typing import NamedTuple, Optional, Sequence

from ..kernel_config import as_config
from ..footprint import grid_operand_bytes
from ..schedule import ceil_div, check_int, default_workers

#: Largest tile grid (per side) whose tiles get their worker id written on them.
PLOT_ANNOTATE_MAX = 64
#: The first colours of a series (waves, or workers): a qualitative palette (matplotlib's tab10
#: and tab20 lights) without red, which marks wave boundaries, and pink, near the highlight's magenta.
WAVE_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22", "#17becf",
                "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5")
#: Past the palette, :func:`series_colour` generates colours: _HUES hues in the same red- and
#: pink-free arc, visited with a stride so neighbours (waves s and s+1) differ by about 110
#: degrees, in _BANDS lightness / saturation bands. Each distinct, so a picture of up to
#: SERIES_COLOURS waves or workers (132 or 148 SMs' worth of workers) repeats none.
_HUES, _HUE_STRIDE, _HUE_ARC = 32, 13, (25.0, 285.0)
# (lightness, saturation): the first band darker than any palette colour, so colour 12 is not
# mistaken for colour 0-11; then alternately light and dark, never near white (unvisited tiles).
_BANDS = ((0.27, 0.65), (0.60, 0.85), (0.40, 0.45), (0.74, 0.70), (0.20, 0.45), (0.50, 0.60), (0.66, 0.45),
          (0.34, 0.85))
SERIES_COLOURS = len(WAVE_PALETTE) + _HUES * len(_BANDS)
#: Legend entries listed before the rest is summarised in one "…" entry.
LEGEND_MAX = 12
#: The caption's sentence for the numbers written on the tiles (clustered configs name the cluster).
NUMBER_CAPTION = "number in a tile = the persistent worker that computes it"
JIT_STATUS = "not built — JIT-compiles on first use (persistent_gemm.precompile)"
NO_EXTENSION_STATUS = "extension not built here"


def visit_grid(config, M: int, N: int, workers: int, K: Optional[int] = None):
    """``(step, worker)``: two ``Mt x Nt`` lists of lists; tile ``(m, n)`` is produced by worker
    ``worker[m][n]`` at its step ``step[m][n]`` (batch 1). With split-K (``K`` given), the unit
    of split 0 stands for its tile (the other splits run on the next workers, same wave); with
    stream-K, piece 0 (the reducer), and a tail tile's step is the tail's wave."""
    config = as_config(config)
    workers = check_int("workers", workers)
    g = config.grid(M, N, K=K)
    step = [[-1] * g.tiles_n for _ in range(g.tiles_m)]
    worker = [[-1] * g.tiles_n for _ in range(g.tiles_m)]
    head = g.stream_k(workers).dp_units // workers if config.schedule.stream_k else None
    for w in range(workers):
        for v in g.tiles_of(w, workers):
            if v.split:  # split 0 stands for the tile
                continue
            for m, n in g.cta_tiles(v.cluster_row, v.cluster_col):
                step[m][n], worker[m][n] = (v.step if head is None else min(v.step, head)), w
    return step, worker


def wave_edges(step) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """The boundaries between waves on the tile grid, as line segments ``((y0, y1), (x0, x1))``
    in tile coordinates (tile centres are integers): one per pair of neighbouring tiles whose
    visit steps differ."""
    Mt, Nt = len(step), len(step[0]) if step else 0
    segs = []
    for m in range(Mt):
        for n in range(Nt):
            if n + 1 < Nt and step[m][n] != step[m][n + 1]:
                segs.append(((m - 0.5, m + 0.5), (n + 0.5, n + 0.5)))
            if m + 1 < Mt and step[m][n] != step[m + 1][n]:
                segs.append(((m + 0.5, m + 0.5), (n - 0.5, n + 0.5)))
    return segs


# -- outlines ---------------------------------------------------------------------------------
class TileRect(NamedTuple):
    """Tile rows ``[row0, row1)`` by tile columns ``[col0, col1)`` of the ``Mt x Nt`` grid."""

    row0: int
    col0: int
    row1: int
    col1: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.row1 - self.row0, self.col1 - self.col0)

    def __contains__(self, tile) -> bool:
        m, n = tile
        return self.row0 <= m < self.row1 and self.col0 <= n < self.col1


def cluster_outlines(config, M: int, N: int) -> list[TileRect]:
    """One rectangle per cluster coordinate ``(r, c)``, row-major: the in-bounds tiles of that
    cluster (:meth:`ScheduleGrid.cta_tiles`), ``cluster_m x cluster_n`` except where the grid
    edge cuts off its tail CTAs."""
    g = as_config(config).grid(M, N)
    cm, cn = g.schedule.cluster
    return [TileRect(r * cm, c * cn, min((r + 1) * cm, g.tiles_m), min((c + 1) * cn, g.tiles_n))
            for r in range(g.clusters_m) for c in range(g.clusters_n)]


def panel_index(config, M: int, N: int) -> list[list[int]]:
    """``Mt x Nt``: the swizzle panel of each tile. The schedule cuts the cluster grid into
    panels of ``swizzle`` cluster rows (raster ``"row"``) or columns (``"column"``), the last
    one narrowed; its ids walk one panel completely before the next (:meth:`ScheduleGrid.coord`)."""
    g = as_config(config).grid(M, N)
    s, row = g.schedule.swizzle, g.schedule.raster == "row"
    out = [[-1] * g.tiles_n for _ in range(g.tiles_m)]
    for r in range(g.clusters_m):
        for c in range(g.clusters_n):
            for m, n in g.cta_tiles(r, c):
                out[m][n] = (r if row else c) // s
    return out


def panel_outlines(config, M: int, N: int) -> list[TileRect]:
    """One rectangle per swizzle panel, in visit order (see :func:`panel_index`). They
    partition the tile grid; with ``swizzle`` at least the cluster rows (columns), one panel
    is the whole grid."""
    idx = panel_index(config, M, N)
    boxes: dict[int, list[int]] = {}
    for m, row in enumerate(idx):
        for n, p in enumerate(row):
            b = boxes.setdefault(p, [m, n, m + 1, n + 1])
            b[0], b[1], b[2], b[3] = min(b[0], m), min(b[1], n), max(b[2], m + 1), max(b[3], n + 1)
    return [TileRect(*boxes[p]) for p in sorted(boxes)]


# -- one wave's operands ------------------------------------------------------------------------
def wave_operand_footprint(config, M: int, N: int, K: int, workers: int, wave: int) -> dict:
    """What wave ``wave`` (every worker's ``wave``-th visit: ids ``wave*W .. wave*W + W - 1``)
    reads, as a dict:

    ``tiles`` (sorted in-bounds ``(m, n)``), ``units`` (work units: tiles x their splits in this
    wave), ``rows`` and ``cols`` (sorted tile rows / columns touched: the A row-panels and B
    column-panels), ``a_bytes`` and ``b_bytes`` (each touched panel once, clipped to M or N,
    over the K range of each split present), ``bytes`` (their sum), ``naive_bytes`` (every unit
    loading its own A rows and B columns), ``reuse`` (``naive_bytes / bytes``) and ``swap_ab``.

    Element sizes are :func:`~persistent_gemm.footprint.operand_bytes` of the config's dtype
    (e2m1 is half a byte). A swap-AB config's rows are the weight (the op's B) and its
    columns the op's A, so the grid's row operand takes the weight's element size."""
    config = as_config(config)
    K, workers = check_int("K", K), check_int("workers", workers)
    g = config.grid(M, N, K=K)
    waves = g.waves(workers)
    wave = check_int("wave", wave, minimum=0)
    if wave >= waves:
        raise ValueError(f"wave must be in [0, {waves - 1}] ({waves} waves of {workers} workers), got {wave}")
    a_el, b_el = grid_operand_bytes(config)
    tm, tn, tk = g.tile_m, g.tile_n, config.tile[2]
    rows, cols, tiles = set(), set(), set()
    units = a_naive = b_naive = 0
    for v in g.wave(workers, wave):
        kx = min(K, v.k_end * tk) - v.k_begin * tk  # elements of K this unit reduces
        for m, n in g.cta_tiles(v.cluster_row, v.cluster_col):
            hm, wn = min(tm, g.M - m * tm), min(tn, g.N - n * tn)
            rows.add((m, v.k_begin, hm * kx))
            cols.add((n, v.k_begin, wn * kx))
            tiles.add((m, n))
            units += 1
            a_naive += hm * kx
            b_naive += wn * kx

    def nbytes(elems: int, el: Fraction) -> int:
        return ceil_div(elems * el.numerator, el.denominator)

    a_b, b_b = nbytes(sum(e for *_, e in rows), a_el), nbytes(sum(e for *_, e in cols), b_el)
    naive = nbytes(a_naive, a_el) + nbytes(b_naive, b_el)
    return {"wave": wave, "tiles": sorted(tiles), "units": units, "rows": sorted({m for m, *_ in rows}),
            "cols": sorted({n for n, *_ in cols}), "a_bytes": a_b, "b_bytes": b_b, "bytes": a_b + b_b,
            "naive_bytes": naive, "reuse": naive / (a_b + b_b), "swap_ab": config.swap_ab}


# -- build status -------------------------------------------------------------------------------
def build_status(config) -> str:
    """Whether ``config`` runs here: ``"built"`` (in the extension, or JIT-compiled and loaded
    in this process), :data:`JIT_STATUS` (valid, compiled at first use),
    ``"not built — PGEMM_JIT=0 ..."``, ``"cannot be built: <reason>"``
    (:meth:`KernelConfig.kernel_rejection`), or :data:`NO_EXTENSION_STATUS`."""
    config = as_config(config)
    reason = config.kernel_rejection()
    if reason:
        return f"cannot be built: {reason}"
    # From _extension, not the package face: the face imports explain, which draws with this module.
    from .._extension import built_configs, extension_available

    if not extension_available():
        return NO_EXTENSION_STATUS
    if config.name in built_configs():
        return "built"
    from .. import jit

    if not jit.enabled():
        return f"not built — {jit.JIT_ENV}=0 turns the JIT off, so it cannot run"
    return JIT_STATUS


# -- colours and legends -------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _generated_colour(i: int) -> str:
    hue_slot, band = (i * _HUE_STRIDE) % _HUES, (i // _HUES) % len(_BANDS)
    lo, hi = _HUE_ARC
    lightness, saturation = _BANDS[band]
    r, g, b = colorsys.hls_to_rgb((lo + (hi - lo) * (hue_slot + 0.5) / _HUES) / 360.0, lightness, saturation)
    return "#" + "".join(f"{round(255 * c):02x}" for c in (r, g, b))


def series_colour(i: int) -> str:
    """Colour ``i`` of a series (wave ``i``, or worker ``i``): :data:`WAVE_PALETTE`, then generated
    ones; all :data:`SERIES_COLOURS` of them distinct, then they repeat. The same index always gets
    the same colour, so two pictures side by side agree."""
    i = check_int("i", i, minimum=0) % SERIES_COLOURS
    return WAVE_PALETTE[i] if i < len(WAVE_PALETTE) else _generated_colour(i - len(WAVE_PALETTE))


def wave_colour(wave: int) -> str:
    """The colour of wave ``wave`` (:func:`series_colour`)."""
    return series_colour(check_int("wave", wave, minimum=0))


def worker_colour(worker: int) -> str:
    """The colour of worker ``worker`` with ``color_by="worker"`` (:func:`series_colour`)."""
    return series_colour(check_int("worker", worker, minimum=0))


def legend_labels(count: int, what: str = "wave", cap: int = LEGEND_MAX) -> list[str]:
    """``"wave 0"``, ``"wave 1"``, ... for ``count`` entries, the first ``cap`` of them and then
    one ``"…"`` entry saying how many there are (and, past :data:`SERIES_COLOURS`, that colours repeat)."""
    count, cap = check_int("count", count, minimum=0), check_int("cap", cap)
    labels = [f"{what} {i}" for i in range(min(count, cap))]
    if count > cap:
        repeat = f"; colours repeat every {SERIES_COLOURS}" if count > SERIES_COLOURS else ", each its own colour"
        labels.append(f"… {count} {what}s in all{repeat}")
    return labels


def text_colour(hex_colour: str) -> str:
    """``"black"`` or ``"white"``: whichever reads on ``hex_colour`` (``"#rrggbb"``)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:g} B"


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'s' * (count != 1)}"


def _ranges(idx: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (at most four runs, then "…")."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    return ", ".join(text[:4]) + (", …" if len(text) > 4 else "")


# -- what a picture says ------------------------------------------------------------------------
@dataclass
class Panel:
    """Everything one pictured schedule shows, as data (:func:`panel_data`); the drawing code
    (:mod:`persistent_gemm.picture_layers`) only lays it out."""

    config: object
    grid: object  #: the ScheduleGrid (the kernel's M, N)
    workers: int
    K: Optional[int]
    step: list
    worker: list
    color_by: str
    highlight: Optional[tuple[int, int]]
    footprint: Optional[dict]  #: wave_operand_footprint of footprint_wave (K = tile_k if no K)
    clusters: list
    panels: list
    annotate: bool
    true_aspect: bool
    tile_ticks: bool
    status: str
    title: list
    caption: list
    xlabel: str = ""  #: the grid's axes, named as the op's extents (a swap-AB grid is (N, M))
    ylabel: str = ""

    @property
    def waves(self) -> int:
        return self.grid.waves(self.workers)


def _opt_bool(name: str, value, allow_none: bool = False):
    if (value is None and allow_none) or isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be {'None, ' if allow_none else ''}True or False, got {value!r}")


#: Beyond this elongation (long side : short side, in elements) the grid is not drawn to scale
#: unless ``true_aspect=True`` says so: a 512:1 picture shows nothing.
MAX_TRUE_ASPECT = 12


def panel_data(config, M: int, N: int, workers: int | None = None, sm_count: int = 132, *,
               color_by: str = "wave", highlight=None, K: Optional[int] = None, footprint_wave: Optional[int] = 0,
               true_aspect: Optional[bool] = None, tile_ticks: bool = False) -> Panel:
    """Check the arguments of :func:`plot` and compute what it draws: no matplotlib needed."""
    config = as_config(config)
    check_int("sm_count", sm_count)  # checked even when workers is given: still a mistake
    workers = default_workers(sm_count, config.schedule) if workers is None else check_int("workers", workers)
    if color_by not in ("wave", "worker"):
        raise ValueError(f"color_by must be 'wave' or 'worker', got {color_by!r}")
    true_aspect = _opt_bool("true_aspect", true_aspect, allow_none=True)
    tile_ticks = _opt_bool("tile_ticks", tile_ticks)
    g = config.grid(M, N, K=K)
    Mt, Nt, tm, tn = g.tiles_m, g.tiles_n, g.tile_m, g.tile_n
    if highlight is not None:
        if (not isinstance(highlight, (tuple, list)) or len(highlight) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in highlight)):
            raise TypeError(f"highlight must be a (tile_row, tile_col) pair of ints, got {highlight!r}")
        if not (0 <= highlight[0] < Mt and 0 <= highlight[1] < Nt):
            raise ValueError(f"highlight={tuple(highlight)} is outside the {Mt} x {Nt} tile grid")
        highlight = tuple(highlight)
    waves = g.waves(workers)
    fp = None
    if footprint_wave is not None:
        footprint_wave = check_int("footprint_wave", footprint_wave, minimum=None)
        if not 0 <= footprint_wave < waves:
            raise ValueError(f"footprint_wave must be None or in [0, {waves - 1}] ({waves} waves), got {footprint_wave}")
        fp = wave_operand_footprint(config, g.M, g.N, K if K is not None else config.tile[2], workers, footprint_wave)
    step, worker = visit_grid(config, g.M, g.N, workers, K=K)
    long_side, short_side = max(Mt * tm, Nt * tn), min(Mt * tm, Nt * tn)
    stretched = true_aspect is False or (true_aspect is None and long_side > MAX_TRUE_ASPECT * short_side)
    s = config.schedule
    cm, cn = s.cluster
    status = build_status(config)

    # A swap-AB kernel walks D^T: its rows are the weight's (the op's N), its columns the tokens.
    extents = (f"M={g.N} N={g.M} (swap-AB: the kernel's grid is N x M)" if config.swap_ab else f"M={g.M} N={g.N}")
    title = [config.name,
             extents + (f" K={K}" if K is not None else "")
             + f": {Mt} x {Nt} tiles of {tm}x{tn}, {workers} workers, {waves} wave{'s' * (waves != 1)}"
             + (f", split-K {g.splits} (tile = {g.splits} units; split 0 shown)" if g.splits > 1 else "")
             + (f", stream-K over the last wave (its {g.stream_k(workers).sk_units} tiles shared out in K-tiles; "
                "the reducer shown)" if s.stream_k and g.stream_k(workers).sk_units else ""),
             status]
    if highlight is not None:
        hm, hn = highlight
        title[1] += f"; tile ({hm}, {hn}): worker {worker[hm][hn]}, step {step[hm][hn]}"
    annotate = max(Mt, Nt) <= PLOT_ANNOTATE_MAX
    caption = []
    if annotate:
        caption.append(NUMBER_CAPTION + ("" if cm * cn == 1 else
                                         f" (a worker is a {cm}x{cn} cluster of CTAs, so its tiles share a number)"))
    caption.append("colour = " + ("wave: wave s is every worker's s-th tile (ids s·W … s·W+W−1); "
                                  if color_by == "wave" else "worker; ") + "red lines = wave boundaries")
    line = "row" if s.raster == "row" else "column"
    caption.append((f"black outlines = {cm}x{cn} clusters; " if cm * cn > 1 else "clusters are 1x1 (one tile); ")
                   + (f"dashed = swizzle panels of {_n(s.swizzle, 'cluster ' + line)}, walked one after another, "
                      + ("ids going down each column of a panel, then along N" if line == "row" else
                         "ids going along each row of a panel, then down M") if s.swizzle > 1 else
                      f"swizzle 1 = plain {line} raster: ids walk each cluster {line} in turn (each its own panel)"))
    if fp is not None:
        rows_op, cols_op = ("W (weight)", "X") if config.swap_ab else ("A", "B")
        head = (f"wave {fp['wave']} reads {rows_op} tile rows {_ranges(fp['rows'])} ({_n(len(fp['rows']), 'row-panel')}, "
                f"left strip) and {cols_op} tile columns {_ranges(fp['cols'])} ({_n(len(fp['cols']), 'column-panel')}, "
                "top strip)")
        if K is not None:
            caption += [head, f"  = {format_bytes(fp['a_bytes'])} + {format_bytes(fp['b_bytes'])} = "
                              f"{format_bytes(fp['bytes'])} for its {_n(len(fp['tiles']), 'tile')}; each tile loading its own "
                              f"would read {format_bytes(fp['naive_bytes'])}: reuse {fp['reuse']:.1f}x"]
        else:
            caption += [head, f"  for its {_n(len(fp['tiles']), 'tile')}: {fp['reuse']:.1f}x less than each tile loading "
                              f"its own (pass K= for bytes)"]
    if config.swap_ab:
        caption.append("swap-AB: the kernel computes D^T, so its M is the op's N (weight rows) and its N the op's M")
    if stretched:
        caption.append(f"not to scale: the grid is {long_side}:{short_side} elements, cells stretched to be seen")
    if g.M % tm or g.N % tn:
        caption.append("hatched = tile padding beyond M or N (computed, not stored)")
    # Axes in the op's terms: a swap-AB grid's rows are the op's N (weight rows), its columns its M.
    (rn, rw, rk), (cn, cw, ck) = ((("N", "weight rows", "; the kernel's M"), ("M", "tokens", "; the kernel's N"))
                                  if config.swap_ab else (("M", "rows", ""), ("N", "columns", "")))
    ylabel = f"tile row m (Mt={Mt}, {tm} {rw} each)" if tile_ticks else f"{rn} ({rw}{rk}, elements)"
    xlabel = f"tile column n (Nt={Nt}, {tn} {cw} each)" if tile_ticks else f"{cn} ({cw}{ck}, elements)"
    return Panel(config, g, workers, K, step, worker, color_by, highlight, fp, cluster_outlines(config, g.M, g.N),
                 panel_outlines(config, g.M, g.N), annotate, not stretched, tile_ticks, status, title, caption,
                 xlabel, ylabel)
