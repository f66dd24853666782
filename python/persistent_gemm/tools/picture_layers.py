"""The drawing half of :mod:`persistent_gemm.tools.picture`: lays out :class:`~persistent_gemm.tools.picture_data.Panel`
data with matplotlib (imported here, so importing this module needs it; ``picture`` imports it
only when drawing). Everything a picture says is decided in ``picture_data.panel_data``; this module
only places it: the tile grid at its true aspect (cells ``tile_n`` wide, ``tile_m`` tall, axes
in elements), the operand strips of one wave's footprint, the outlines, titles, captions and a
legend shared by all panels.
"""

from __future__ import annotations

import textwrap

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FixedLocator

from .picture_data import (LEGEND_MAX, NO_EXTENSION_STATUS, legend_labels, text_colour, wave_colour, wave_edges,
                           worker_colour)

# Lengths in inches.
GRID_MAX_W, GRID_MAX_H = 11.0, 9.0  # the grid of one panel at most
GRID_MIN = 2.5  # its long side at least
CELL_MAX = 0.6  # a tile's short side at most
STRIP = 0.28  # an operand strip's thickness
LEFT, RIGHT, BOTTOM = 0.95, 0.3, 0.55  # tick labels and axis label room
PANEL_MIN_W = 5.5
LEGEND_W = 2.3
LINE = 0.16  # one caption line (7.5 pt)
CAPTION_PT = 7.5

_HEX = {}


def _rgb(colour: str) -> tuple[float, float, float]:
    if colour not in _HEX:
        _HEX[colour] = tuple(int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return _HEX[colour]


def _status_colour(status: str) -> str:
    if status == "built":
        return "#1a7f37"
    if status.startswith("cannot"):
        return "#c62828"
    return "#666666" if status == NO_EXTENSION_STATUS else "#b26a00"


def _grid_sizes(panels) -> list[tuple[float, float]]:
    """(width, height) in inches of each panel's grid: one length scale for the true-aspect ones."""
    ext = [(p.grid.tiles_n * p.grid.tile_n, p.grid.tiles_m * p.grid.tile_m) for p in panels]
    true = [(w, h) for p, (w, h) in zip(panels, ext) if p.true_aspect]
    u = None
    if true:
        max_w = GRID_MAX_W if len(panels) == 1 else GRID_MAX_W * 0.7  # side by side: narrower each
        u = min(min(max_w / w, GRID_MAX_H / h) for w, h in true)
        u = min(u, min(CELL_MAX / min(p.grid.tile_m, p.grid.tile_n) for p in panels if p.true_aspect))
        u = max(u, max(GRID_MIN / max(w, h) for w, h in true))
    out = []
    for p, (w, h) in zip(panels, ext):
        if p.true_aspect:
            out.append((w * u, h * u))
        else:  # stretched: each side sized by its tile count
            out.append((min(max(p.grid.tiles_n * 0.35, GRID_MIN), GRID_MAX_W),
                        min(max(p.grid.tiles_m * 0.35, GRID_MIN), GRID_MAX_H)))
    return out


def _wrap(lines, width_in: float, pt: float) -> list[str]:
    chars = max(30, int(width_in * 72 / (0.5 * pt)))
    out = []
    for line in lines:
        indent = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, chars, subsequent_indent=indent + "  ") or [""]
    return out


def _tile_ticks(axis, count: int, size: int) -> None:
    every = max(1, -(-count // 16))
    idx = list(range(0, count, every))
    axis.set_major_locator(FixedLocator([(i + 0.5) * size for i in idx]))
    axis.set_ticklabels([str(i) for i in idx])


def draw(panels, path) -> None:
    """Lay ``panels`` out side by side with one legend and save the figure to ``path``."""
    sizes = _grid_sizes(panels)
    plans = []
    for p, (gw, gh) in zip(panels, sizes):
        strip = STRIP + 0.05 if p.footprint is not None else 0.0
        width = max(LEFT + strip + gw + RIGHT, PANEL_MIN_W)
        title = [(t, i) for i, line in enumerate(p.title) for t in _wrap([line], width, 8.5)]
        caption = _wrap(p.caption, width - 0.2, CAPTION_PT)
        top = 0.2 * len(title) + 0.2 + strip
        plans.append((p, gw, gh, strip, width, title, caption, top, BOTTOM + LINE * len(caption) + 0.2))
    fig_w = sum(pl[4] for pl in plans) + LEGEND_W
    fig_h = max(pl[7] + pl[2] + pl[8] for pl in plans)
    fig = Figure(figsize=(fig_w, fig_h), dpi=110)
    FigureCanvasAgg(fig)
    x = 0.0
    for plan in plans:
        _draw_panel(fig, x, fig_w, fig_h, *plan)
        x += plan[4]
    _legend(fig, panels, x, fig_w, fig_h)
    fig.savefig(path)


def _axes(fig, fig_w, fig_h, left, top, w, h):
    """Axes at ``left`` inches from the left and ``top`` inches from the top."""
    return fig.add_axes((left / fig_w, 1 - (top + h) / fig_h, w / fig_w, h / fig_h))


def _draw_panel(fig, x0, fig_w, fig_h, p, gw, gh, strip, width, title, caption, top, bottom):
    g = p.grid
    Mt, Nt, tm, tn = g.tiles_m, g.tiles_n, g.tile_m, g.tile_n
    W_el, H_el = Nt * tn, Mt * tm
    left = x0 + LEFT + strip
    ax = _axes(fig, fig_w, fig_h, left, top, gw, gh)
    if p.color_by == "wave":
        colour = [[_rgb(wave_colour(s)) if s >= 0 else (1, 1, 1) for s in row] for row in p.step]
    else:
        colour = [[_rgb(worker_colour(w)) if w >= 0 else (1, 1, 1) for w in row] for row in p.worker]
    ax.imshow(colour, extent=(0, W_el, H_el, 0), interpolation="nearest", aspect="auto", zorder=0)
    ax.set_xlim(0, W_el)
    ax.set_ylim(H_el, 0)
    cell_pt = min(gw / Nt, gh / Mt) * 72  # a tile's short side in points
    lw_cluster = min(1.8, max(0.6, 0.1 * cell_pt))
    if max(Mt, Nt) <= 160:  # thin white tile lines
        segs = [((n * tn, 0), (n * tn, H_el)) for n in range(1, Nt)] + [((0, m * tm), (W_el, m * tm)) for m in range(1, Mt)]
        ax.add_collection(LineCollection(segs, colors="white", linewidths=0.4, alpha=0.8, zorder=1))
    # Padding beyond M and N: the part of the last tiles outside the problem.
    pad = dict(facecolor=(1, 1, 1, 0.55), edgecolor=(0.35, 0.35, 0.35), hatch="////", lw=0, zorder=1.5)
    if g.N < W_el:
        ax.add_patch(Rectangle((g.N, 0), W_el - g.N, H_el, **pad))
    if g.M < H_el:
        ax.add_patch(Rectangle((0, g.M), g.N, H_el - g.M, **pad))
    cm, cn = g.schedule.cluster
    if cm * cn > 1:
        for r in p.clusters:
            ax.add_patch(Rectangle((r.col0 * tn, r.row0 * tm), (r.col1 - r.col0) * tn, (r.row1 - r.row0) * tm,
                                   fill=False, edgecolor="black", lw=lw_cluster, alpha=min(1.0, 0.4 + cell_pt / 30),
                                   zorder=3))
    edges = [(((x0_ + 0.5) * tn, (y0 + 0.5) * tm), ((x1 + 0.5) * tn, (y1 + 0.5) * tm))
             for (y0, y1), (x0_, x1) in wave_edges(p.step)]
    ax.add_collection(LineCollection(edges, colors="red", linewidths=max(1.2, lw_cluster * 1.1), zorder=4))
    # Swizzle panels: white dashes on black, unlike any cluster line or tile colour. Not drawn for
    # swizzle 1, whose panels are the cluster rows (columns) themselves; the caption says so.
    for r in p.panels if g.schedule.swizzle > 1 else ():
        xy, w, h = (r.col0 * tn, r.row0 * tm), (r.col1 - r.col0) * tn, (r.row1 - r.row0) * tm
        ax.add_patch(Rectangle(xy, w, h, fill=False, edgecolor="black", lw=lw_cluster * 2.6, zorder=5))
        ax.add_patch(Rectangle(xy, w, h, fill=False, edgecolor="white", lw=lw_cluster * 1.1, ls=(0, (3, 3)),
                               zorder=5.1))
    if p.highlight is not None:
        hm, hn = p.highlight
        ax.add_patch(Rectangle((hn * tn, hm * tm), tn, tm, fill=False, edgecolor="magenta", lw=2.5, zorder=6))
    if p.annotate:
        digits = len(str(max(1, p.workers - 1)))
        fs = max(3.0, min(9.0, 0.55 * min(gh / Mt, gw / Nt / (0.3 * digits + 0.4)) * 72))
        for m in range(Mt):
            for n in range(Nt):
                s = p.step[m][n] if p.color_by == "wave" else p.worker[m][n]
                bg = wave_colour(s) if p.color_by == "wave" else worker_colour(s)
                ax.text((n + 0.5) * tn, (m + 0.5) * tm, str(p.worker[m][n]), ha="center", va="center", fontsize=fs,
                        color=text_colour(bg), zorder=7)
    rows_op, cols_op = ("W", "X") if p.config.swap_ab else ("A", "B")
    if p.tile_ticks:
        _tile_ticks(ax.xaxis, Nt, tn)
        _tile_ticks(ax.yaxis, Mt, tm)
    ax.set_xlabel(p.xlabel, fontsize=8)
    ax.tick_params(labelsize=7)
    yax = ax
    fp = p.footprint
    if fp is not None:
        shade = wave_colour(fp["wave"])
        rows, cols = set(fp["rows"]), set(fp["cols"])
        ax_a = _axes(fig, fig_w, fig_h, left - strip, top, STRIP, gh)
        ax_a.sharey(ax)
        for m in range(Mt):
            ax_a.add_patch(Rectangle((0, m * tm), 1, tm, facecolor=shade if m in rows else "#e6e6e6",
                                     edgecolor="white", lw=0.3))
        ax_a.set_xlim(0, 1)
        ax_a.set_xticks([])
        ax_a.set_xlabel(rows_op, fontsize=8, fontweight="bold")
        ax.tick_params(labelleft=False)
        yax = ax_a
        ax_b = _axes(fig, fig_w, fig_h, left, top - strip, gw, STRIP)
        ax_b.sharex(ax)
        for n in range(Nt):
            ax_b.add_patch(Rectangle((n * tn, 0), tn, 1, facecolor=shade if n in cols else "#e6e6e6",
                                     edgecolor="white", lw=0.3))
        ax_b.set_ylim(0, 1)
        ax_b.set_yticks([])
        ax_b.tick_params(labelbottom=False, bottom=False)
        ax_b.set_ylabel(cols_op, fontsize=8, fontweight="bold", rotation=0, ha="right", va="center")
        for a in (ax_a, ax_b):
            for sp in a.spines.values():
                sp.set_visible(False)
    yax.set_ylabel(p.ylabel, fontsize=8)
    yax.tick_params(labelsize=7)
    cx = (x0 + width / 2) / fig_w
    y = 1 - 0.12 / fig_h
    for line, i in title:  # (text, which title line it comes from): 0 the name, the last the build status
        first, status = i == 0, i == len(p.title) - 1
        fig.text(cx, y, line, ha="center", va="top", fontsize=9.5 if first else 8,
                 fontweight="bold" if first else "normal", color=_status_colour(p.status) if status else "black",
                 style="italic" if status else "normal")
        y -= 0.2 / fig_h
    y = 1 - (top + gh + BOTTOM + 0.05) / fig_h
    fig.text((x0 + 0.15) / fig_w, y, "\n".join(caption), ha="left", va="top", fontsize=CAPTION_PT, linespacing=1.3)


def _legend(fig, panels, x0, fig_w, fig_h) -> None:
    by_wave = panels[0].color_by == "wave"
    count = max(p.waves for p in panels) if by_wave else max(p.workers for p in panels)
    colour = wave_colour if by_wave else worker_colour
    labels = legend_labels(count, "wave" if by_wave else "worker", LEGEND_MAX)
    handles = [Patch(facecolor=colour(i), edgecolor="none", label=lab)
               for i, lab in enumerate(labels[:LEGEND_MAX])]
    if len(labels) > LEGEND_MAX:
        handles.append(Patch(facecolor="none", edgecolor="none", label="\n".join(textwrap.wrap(labels[-1], 26))))
    top = 1 - 0.3 / fig_h
    leg = fig.legend(handles=handles, loc="upper left", bbox_to_anchor=((x0 + 0.05) / fig_w, top), fontsize=7.5,
                     title="colour = " + ("wave" if by_wave else "worker"), title_fontsize=8, frameon=False,
                     handlelength=1.4)
    fig.add_artist(leg)
    keys = [(Line2D([], [], color="red", lw=1.2), "wave boundary")]
    if any(p.grid.schedule.cluster != (1, 1) for p in panels):
        keys.append((Line2D([], [], color="black", lw=1.6), "cluster"))
    if any(p.grid.schedule.swizzle > 1 for p in panels):
        keys.append(((Line2D([], [], color="black", lw=4.0), Line2D([], [], color="white", lw=1.6, ls=(0, (3, 3)))),
                     "swizzle panel"))
    if any(p.grid.M % p.grid.tile_m or p.grid.N % p.grid.tile_n for p in panels):
        keys.append((Patch(facecolor="white", edgecolor=(0.35, 0.35, 0.35), hatch="////", lw=0), "padding beyond M, N"))
    if any(p.footprint is not None for p in panels):
        keys.append((Patch(facecolor="#e6e6e6", edgecolor="none"), "operand panel not read\nby the footprint wave"))
    if any(p.highlight is not None for p in panels):
        keys.append((Patch(facecolor="none", edgecolor="magenta", lw=2), "highlighted tile"))
    n_rows = len(handles) + 1 + sum(h.get_label().count("\n") for h in handles)
    fig.legend(handles=[h for h, _ in keys], labels=[k for _, k in keys], loc="upper left", fontsize=7.5,
               frameon=False, handlelength=2.2,
               bbox_to_anchor=((x0 + 0.05) / fig_w, top - (0.19 * n_rows + 0.35) / fig_h))
