"""The picture of a schedule: which worker produces each output tile, at which step (wave).

:func:`visit_grid` is the data, :func:`plot` draws it (matplotlib, imported only when drawing),
:func:`wave_edges` gives the boundaries between waves. Any valid config can be pictured, built,
JIT-compiled or neither. Re-exported by :mod:`persistent_gemm.schedule`.
"""

from __future__ import annotations

from typing import Optional

from .schedule import _as_config, _config_grid, check_int, default_workers

#: Largest tile grid (per side) whose tiles get their worker id written on them.
PLOT_ANNOTATE_MAX = 64


def visit_grid(config, M: int, N: int, workers: int, K: Optional[int] = None):
    """``(step, worker)``: two ``Mt x Nt`` lists of lists; tile ``(m, n)`` is produced by worker
    ``worker[m][n]`` at its step ``step[m][n]`` (batch 1). With split-K (``K`` given), the unit
    of split 0 stands for its tile (the other splits run on the next workers, same wave)."""
    config = _as_config(config)
    workers = check_int("workers", workers)
    g = _config_grid(config, M, N, K=K)
    step = [[-1] * g.tiles_n for _ in range(g.tiles_m)]
    worker = [[-1] * g.tiles_n for _ in range(g.tiles_m)]
    for t in range(0, g.num_ids, g.splits):  # split-K: the unit of split 0 stands for the tile
        for m, n in g.cta_tiles(*g.coord(t)):
            step[m][n], worker[m][n] = divmod(t, workers)
    return step, worker


def plot(config, M: int, N: int, path, workers: int | None = None, sm_count: int = 132, *,
         color_by: str = "wave", highlight: Optional[tuple[int, int]] = None, K: Optional[int] = None):
    """Draw the ``Mt x Nt`` tile grid of ``config`` (any spec: built, JIT-compiled or neither)
    over an (M, N) problem and save it to ``path`` (PNG, or whatever the suffix says).

    ``color_by``: ``"wave"`` (the visit step, i.e. the wave a tile belongs to) or ``"worker"``
    (one colour per persistent worker). Wave boundaries are drawn as red lines between tiles of
    different waves, cluster boundaries as thin white lines. Tiles carry their worker id when the
    grid is at most :data:`PLOT_ANNOTATE_MAX` tiles a side. ``highlight=(m, n)`` outlines that
    tile and names its worker and step in the title. ``workers`` defaults to
    :func:`default_workers` of ``sm_count``. ``K`` matters for split-K schedules only (the
    units per tile). Returns ``path``. Needs matplotlib."""
    # Arguments first: a bad one is reported whether or not matplotlib is there.
    config = _as_config(config)
    check_int("sm_count", sm_count)  # checked even when workers is given: still a mistake
    if workers is None:
        workers = default_workers(sm_count, config.schedule)
    else:
        workers = check_int("workers", workers)
    if color_by not in ("wave", "worker"):
        raise ValueError(f"color_by must be 'wave' or 'worker', got {color_by!r}")
    g = _config_grid(config, M, N, K=K)
    M, N = g.M, g.N
    Mt, Nt = g.tiles_m, g.tiles_n
    if highlight is not None:
        if (not isinstance(highlight, (tuple, list)) or len(highlight) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in highlight)):
            raise TypeError(f"highlight must be a (tile_row, tile_col) pair of ints, got {highlight!r}")
        if not (0 <= highlight[0] < Mt and 0 <= highlight[1] < Nt):
            raise ValueError(f"highlight={tuple(highlight)} is outside the {Mt} x {Nt} tile grid")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.collections import LineCollection
        from matplotlib.patches import Rectangle
    except ImportError as e:
        raise ImportError(
            "persistent_gemm.schedule.plot needs matplotlib: pip install matplotlib "
            "(or pip install 'persistent_gemm[plot]')"
        ) from e
    step, worker = visit_grid(config, M, N, workers, K=K)
    cell = 0.32 if max(Mt, Nt) <= PLOT_ANNOTATE_MAX else 0.1
    w_in = min(max(Nt * cell + 2.0, 4.0), 24.0)
    h_in = min(max(Mt * cell + 1.5, 3.0), 24.0)
    fig = Figure(figsize=(w_in, h_in), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if color_by == "wave":
        im = ax.imshow(step, cmap="viridis", interpolation="nearest", aspect="auto", origin="upper")
        fig.colorbar(im, ax=ax, label="visit step (wave)")
    else:
        im = ax.imshow(worker, cmap="tab20", interpolation="nearest", aspect="auto", origin="upper",
                       vmin=0, vmax=max(19, workers - 1))
        fig.colorbar(im, ax=ax, label="worker (colours repeat every 20)")
    if max(Mt, Nt) <= PLOT_ANNOTATE_MAX:
        cell_pt = min((w_in - 2.0) * 72 / Nt, (h_in - 1.5) * 72 / Mt)
        fs = max(2.5, min(9.0, 0.4 * cell_pt))
        waves = max(1, g.waves(workers) - 1)
        for m in range(Mt):
            for n in range(Nt):
                dark = step[m][n] < 0.6 * waves if color_by == "wave" else False
                ax.text(n, m, str(worker[m][n]), ha="center", va="center", fontsize=fs,
                        color="white" if dark else "black")
    cm, cn = config.schedule.cluster
    for x in range(cn, Nt, cn):
        ax.axvline(x - 0.5, color="white", lw=0.3, alpha=0.5)
    for y in range(cm, Mt, cm):
        ax.axhline(y - 0.5, color="white", lw=0.3, alpha=0.5)
    edges = [((x0, y0), (x1, y1)) for (y0, y1), (x0, x1) in wave_edges(step)]
    ax.add_collection(LineCollection(edges, colors="red", linewidths=1.0, label="wave boundary"))
    title = f"{config.name}\nM={M} N={N}, {workers} workers, {g.waves(workers)} waves"
    if g.splits > 1:
        title += f", split-K {g.splits} (tile = {g.splits} units; split 0 shown)"
    if highlight is not None:
        hm, hn = highlight
        ax.add_patch(Rectangle((hn - 0.5, hm - 0.5), 1, 1, fill=False, edgecolor="magenta", lw=2.5))
        title += f"; tile ({hm}, {hn}): worker {worker[hm][hn]}, step {step[hm][hn]}"
    ax.set_xlabel(f"tile column n (Nt={Nt})")
    ax.set_ylabel(f"tile row m (Mt={Mt})")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


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
