"""The picture of a schedule: which worker produces each output tile, at which step (wave).

The data, all pure Python, is :mod:`.picture_data` (re-exported here): :func:`visit_grid`,
:func:`wave_edges`, :func:`cluster_outlines`, :func:`panel_outlines`,
:func:`wave_operand_footprint`, :func:`build_status`, :func:`panel_data`. The drawing:
:func:`plot` (one schedule) and :func:`plot_compare` (two side by side), with matplotlib
imported only when drawing (:mod:`.picture_layers`). Any valid config can be pictured, built,
JIT-compiled or neither.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .picture_data import (JIT_STATUS, LEGEND_MAX, MAX_TRUE_ASPECT, NO_EXTENSION_STATUS, NUMBER_CAPTION,  # noqa: F401
                           PLOT_ANNOTATE_MAX, SERIES_COLOURS, WAVE_PALETTE, Panel, TileRect, build_status,
                           cluster_outlines, format_bytes, legend_labels, panel_data, panel_index,
                           panel_outlines, series_colour, text_colour, visit_grid, wave_colour, wave_edges,
                           wave_operand_footprint, worker_colour)


def _mpl():
    try:  # matplotlib itself first: picture_layers may be imported already, matplotlib gone since
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401

        from . import picture_layers
    except ImportError as e:
        raise ImportError(
            "persistent_gemm.tools.picture.plot needs matplotlib: pip install matplotlib "
            "(or, in the repository, pip install '.[plot]')"
        ) from e
    return picture_layers


def plot(config, M: int, N: int, path, workers: int | None = None, sm_count: int = 132, *,
         color_by: str = "wave", highlight: Optional[tuple[int, int]] = None, K: Optional[int] = None,
         footprint_wave: Optional[int] = 0, true_aspect: Optional[bool] = None, tile_ticks: bool = False):
    """Draw the ``Mt x Nt`` tile grid of ``config`` (any spec: built, JIT-compiled or neither)
    over an (M, N) problem and save it to ``path`` (PNG, or whatever the suffix says).

    Tiles are ``tile_n`` wide and ``tile_m`` tall, the axes in elements (``tile_ticks=True``:
    tile indices); ``true_aspect=None`` keeps that scale unless the grid is more than
    :data:`MAX_TRUE_ASPECT` times longer than wide (then cells are stretched, and the caption
    says so). ``color_by``: ``"wave"`` (one colour per wave) or ``"worker"``, each distinct up
    to :data:`SERIES_COLOURS` (:func:`series_colour`). Red lines separate waves, black outlines
    mark clusters and dashed ones the swizzle panels; tiles carry their worker id when the grid is at most
    :data:`PLOT_ANNOTATE_MAX` tiles a side. ``footprint_wave`` (default 0; None: off) shades
    the A rows and B columns that wave reads in strips beside the grid and gives the bytes
    (``K`` given) against every tile loading its own. ``highlight=(m, n)`` outlines that tile
    and names its worker and step. The title says whether the config is built
    (:func:`build_status`). ``workers`` defaults to :func:`default_workers` of ``sm_count``;
    ``K`` also sets split-K's units per tile. Returns ``path``. Needs matplotlib."""
    # Arguments first: a bad one is reported whether or not matplotlib is there.
    panel = panel_data(config, M, N, workers, sm_count, color_by=color_by, highlight=highlight, K=K,
                       footprint_wave=footprint_wave, true_aspect=true_aspect, tile_ticks=tile_ticks)
    _mpl().draw([panel], path)
    return path


def plot_compare(configs, M: int, N: int, path, workers=None, sm_count: int = 132, K: Optional[int] = None, **options):
    """Two schedules side by side over one (M, N) problem, on one colour scale (wave ``s`` has
    the same colour in both) and one length scale; each title names the config, whether it is
    built, its waves, workers, tiles and wave 0's footprint. ``configs``: two configs or names;
    ``workers``: None (each config's default for ``sm_count``), one int for both, or a pair.
    ``options`` are :func:`plot`'s keywords. Returns ``path``. Needs matplotlib."""
    if isinstance(configs, (str, bytes)) or not isinstance(configs, Sequence):
        raise TypeError(f"configs must be a sequence of 2 configs or names, got {type(configs).__name__}")
    if len(configs) != 2:
        raise ValueError(f"configs must hold exactly 2 configs to compare, got {len(configs)}")
    if workers is None or not isinstance(workers, (tuple, list)):
        workers = (workers, workers)
    elif len(workers) != 2:
        raise ValueError(f"workers must be None, an int or a pair of ints, got {workers!r}")
    unknown = set(options) - {"color_by", "highlight", "footprint_wave", "true_aspect", "tile_ticks"}
    if unknown:
        raise TypeError(f"plot_compare got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    panels = [panel_data(c, M, N, w, sm_count, K=K, **options) for c, w in zip(configs, workers)]
    if panels[0].true_aspect != panels[1].true_aspect and options.get("true_aspect") is None:
        panels = [panel_data(c, M, N, w, sm_count, K=K, **{**options, "true_aspect": False})
                  for c, w in zip(configs, workers)]
    for p in panels:
        g = p.grid
        fp0 = wave_operand_footprint(p.config, g.M, g.N, K if K is not None else p.config.tile[2], p.workers, 0)
        key = (f"{p.waves} waves · {p.workers} workers · {g.tiles_m}x{g.tiles_n} tiles · wave 0 reads "
               + (format_bytes(fp0["bytes"]) if K is not None else f"{len(fp0['rows'])}+{len(fp0['cols'])} panels")
               + f" (reuse {fp0['reuse']:.1f}x)")
        p.title = [p.config.name, key, p.status]
    _mpl().draw(panels, path)
    return path
