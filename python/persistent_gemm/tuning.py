"""Time candidate configs for one problem on the current GPU and keep the fastest.

:func:`tune` times the built configs that can serve the problem (the dispatcher's own rules
decide which: each candidate is asked through ``explain(config=...)``), and, when asked, JIT
candidates made by varying the fastest built config's schedule (swizzle, cluster, raster) and
its tile or kernel style. Every candidate runs on the same inputs, interleaved call by call,
each timed as a CUDA-graph replay of a few calls on inputs rotated past L2 (so a ~10 us kernel
is not hidden behind a ~12 us host launch), and the median of the replays is its time.

The winner is handed to the dispatcher, which takes it for that exact problem before its cost
model (``explain()`` says "tuned: ..."), and written to the tuning cache
``$PGEMM_CACHE_DIR/tuning.json``, which ``import persistent_gemm`` reads back
(``PGEMM_TUNING=0`` turns that off). :func:`clear_tuning` forgets it all.
"""

from __future__ import annotations

import fcntl
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from . import jit
from .catalogue import CATALOGUE, ConfigError, KernelConfig
from .explain import _check_args
from .schedule import TileSchedule

__all__ = ["OPS", "TuneResult", "TuneRow", "tune", "load_tuning", "clear_tuning", "tuning_path", "TUNING_ENV",
           "jit_candidates"]

TUNING_ENV = "PGEMM_TUNING"
#: op -> (dtype families it takes, default family). The family names are explain()'s dtypes.
OPS = {"mm": (("bf16", "fp16"), "bf16"), "scaled_mm": (("e4m3",), "e4m3"), "mxfp8_mm": (("mxfp8",), "mxfp8"),
       "fp8_fp4_mm": (("e4m3xe2m1",), "e4m3xe2m1")}
#: What jit_candidates may vary, and the values it tries.
SWIZZLES = (1, 2, 4, 8)
CLUSTERS = ((1, 1), (2, 1), (1, 2))
RASTERS = ("row", "column")
VARY = ("raster", "swizzle", "cluster", "tile", "style")


@dataclass(frozen=True)
class TuneRow:
    config: str
    us: float           # median CUDA-graph replay time per call
    source: str         # "built" or "jit"
    estimate_us: float  # the cost model's estimate (nan for a config it cannot price)


@dataclass
class TuneResult:
    problem: dict
    rows: list = field(default_factory=list)  # TuneRow, fastest first
    winner: str = ""
    stored: bool = False
    device: str = ""

    def __str__(self) -> str:
        p = self.problem
        head = (f"tune {p['op']} {p['dtype']} M={p['M']} N={p['N']} K={p['K']} layout={p['layout']} "
                f"out={p['out_dtype']}" + (f" scale={p['scale']}" if p['scale'] != "none" else "")
                + (" fast_accum" if p["use_fast_accum"] else "") + f" on {self.device}")
        best = self.rows[0].us if self.rows else float("nan")
        w = max([len(r.config) for r in self.rows] + [6])
        lines = [head, f"  {'config':<{w}}  {'us':>9}  {'vs best':>7}  {'model us':>9}  source"]
        for r in self.rows:
            lines.append(f"  {r.config:<{w}}  {r.us:9.2f}  {r.us / best:7.3f}  {r.estimate_us:9.2f}  {r.source}"
                         + ("   <- winner" if r.config == self.winner else ""))
        lines.append(f"  winner {self.winner}" + (" (stored: the dispatcher takes it for this problem)"
                                                  if self.stored else " (not stored)"))
        return "\n".join(lines)


# -- the tuning cache ---------------------------------------------------------------------------
def tuning_path() -> Path:
    return jit.cache_dir() / "tuning.json"


def _read(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        warnings.warn(f"persistent_gemm: ignoring unreadable tuning cache {path}: {e}", stacklevel=3)
        return []
    return data.get("entries", []) if isinstance(data, dict) else []


def _key(e: dict) -> tuple:
    return tuple(e[k] for k in ("arch", "sm_count", "M", "N", "K", "dtype", "out_dtype", "layout", "scale",
                                "use_fast_accum"))


def _persist(entry: Optional[dict], clear: bool = False) -> None:
    """Add (or replace) one entry of the tuning file, or empty it; under a lock, atomically."""
    path = tuning_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = [] if clear else [e for e in _read(path) if entry is None or _key(e) != _key(entry)]
        if entry is not None:
            entries.append(entry)
        fd, tmp = tempfile.mkstemp(prefix="tuning-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"version": 1, "entries": entries}, f, indent=1)
        os.replace(tmp, path)


def _apply(ext, e: dict) -> None:
    ext.set_tuned(e["arch"], e["M"], e["N"], e["K"], e["dtype"], e["out_dtype"], e["layout"][0] == "r",
                  e["layout"][1] == "c", e["scale"], e["use_fast_accum"], e["sm_count"], e["config"])


def load_tuning(path: Optional[os.PathLike] = None) -> int:
    """Hand the tuning cache's winners to the dispatcher; returns how many were applied. A winner
    that is neither built nor in the JIT cache is skipped (nothing is compiled here)."""
    from ._extension import require_extension

    ext = require_extension()
    archs = set(ext.registered_arches())
    applied = 0
    for e in _read(Path(path) if path else tuning_path()):
        try:
            if e["arch"] not in archs:
                continue
            if jit.ensure(e["config"], quiet=True, allow_compile=False) is None:
                continue
            _apply(ext, e)
            applied += 1
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            warnings.warn(f"persistent_gemm: skipping tuning entry {e!r}: {err}", stacklevel=2)
    return applied


def clear_tuning(*, persisted: bool = True) -> None:
    """Forget every tuned winner in this process, and (``persisted``) in the tuning cache."""
    from ._extension import require_extension

    require_extension().clear_tuned()
    if persisted:
        _persist(None, clear=True)


# -- candidates ---------------------------------------------------------------------------------
def jit_candidates(base: KernelConfig, vary: Sequence[str] = VARY, limit: int = 6,
                   exclude: Iterable[str] = ()) -> list[KernelConfig]:
    """Valid specs near ``base``: one knob changed at a time (in ``vary``'s order), then pairs of
    schedule knobs; names in ``exclude`` (the built ones) are skipped. At most ``limit``."""
    bad = set(vary) - set(VARY)
    if bad:
        raise ValueError(f"vary must name knobs from {VARY}, got {sorted(bad)}")
    seen = set(exclude) | {base.name}
    out: list[KernelConfig] = []

    def add(**changes) -> None:
        sched = changes.pop("schedule", base.schedule)
        fields = dict(tile=base.tile, stages=base.stages, kernel=base.kernel, dtype=base.dtype, arch=base.arch,
                      accum=base.accum, swap_ab=base.swap_ab)
        fields.update(changes)
        try:
            cfg = KernelConfig(schedule=sched, **fields)
        except (ConfigError, TypeError, ValueError):
            return
        if cfg.name not in seen:
            seen.add(cfg.name)
            out.append(cfg)

    s = base.schedule
    singles = {
        "raster": [dict(schedule=s.replace(raster=r)) for r in RASTERS],
        "swizzle": [dict(schedule=s.replace(swizzle=w)) for w in SWIZZLES],
        "cluster": [dict(schedule=s.replace(cluster=c)) for c in CLUSTERS],
        "tile": [dict(tile=c.tile) for c in CATALOGUE if c.dtype == base.dtype and c.arch == base.arch],
        "style": [dict(kernel=k) for k in ("cooperative", "pingpong", "1sm", "2sm")],
    }
    for knob in vary:
        for ch in singles[knob]:
            add(**ch)
    for r in RASTERS if "raster" in vary else (s.raster,):
        for w in SWIZZLES if "swizzle" in vary else (s.swizzle,):
            for c in CLUSTERS if "cluster" in vary else (s.cluster,):
                add(schedule=TileSchedule(swizzle=w, cluster=c, raster=r))
    return out[:limit]


# -- timing -------------------------------------------------------------------------------------
def _inputs(op: str, family: str, M: int, N: int, K: int, layout: str, scale: str, device, copies: int):
    """``copies`` independent operand sets (rotated past L2), as the op's positional args."""
    import torch

    from .quant import quantize_mxfp4, quantize_mxfp8

    g = torch.Generator(device=device).manual_seed(0)

    def mat(rows, cols):  # row-major fp32; transposed views give the column-major operands
        return torch.randn(rows, cols, device=device, generator=g, dtype=torch.float32)

    sets = []
    for _ in range(copies):
        if op == "mm":
            dt = torch.float16 if family == "fp16" else torch.bfloat16
            a = mat(M, K).to(dt) if layout[0] == "r" else mat(K, M).to(dt).t()
            b = mat(K, N).to(dt) if layout[1] == "r" else mat(N, K).to(dt).t()
            sets.append((a, b))
        elif op == "scaled_mm":
            a = mat(M, K).to(torch.float8_e4m3fn)
            b = mat(N, K).to(torch.float8_e4m3fn).t()
            if scale == "row":
                sa = torch.rand(M, 1, device=device, generator=g) + 0.5
                sb = torch.rand(1, N, device=device, generator=g) + 0.5
            else:
                sa = torch.tensor(0.5, device=device)
                sb = torch.tensor(2.0, device=device)
            sets.append((a, b, sa, sb))
        else:
            a, a_s = quantize_mxfp8(mat(M, K))
            w = mat(N, K)
            if op == "mxfp8_mm":
                wq, ws = quantize_mxfp8(w)
            else:
                wq, ws = quantize_mxfp4(w)
            sets.append((a, wq.t(), a_s, ws))  # the ops' order: operands, then scales
    return sets


def _runner(op: str, args, out_dtype, use_fast_accum: bool, config: str):
    import torch

    from . import _ops  # the typed wrappers (the package exports the same functions)

    od = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[out_dtype]
    fn = getattr(_ops, op)
    if op == "scaled_mm":
        return lambda: fn(*args, out_dtype=od, use_fast_accum=use_fast_accum, config=config)
    return lambda: fn(*args, out_dtype=od, config=config)


def replay_times(calls, reps: int, inner: int, progress=lambda done, total: None) -> list[list[float]]:
    """Per candidate, ``reps`` replay times (us per call): each candidate's ``inner`` calls (over
    the rotated inputs) captured in one CUDA graph, replays interleaved across candidates."""
    import torch

    graphs = []
    stream = torch.cuda.Stream()
    for run in calls:
        for f in run:  # warm-up on the side stream, as capture requires
            f()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for i in range(inner):
                run[i % len(run)]()
        graphs.append(g)
    times = [[] for _ in calls]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(reps + 2):  # two untimed rounds warm clocks and caches
        for i, g in enumerate(graphs):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            if r >= 2:
                times[i].append(start.elapsed_time(end) * 1e3 / inner)
        progress(r + 1, reps + 2)
    return times


def _bar(label: str, enabled: bool):
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        if not enabled or (not tty and done != total):  # a log gets the last state only
            return
        n = 30 * done // total
        end = "\n" if done == total else ""
        print(f"\r{label} [{'#' * n}{'.' * (30 - n)}] {done}/{total}", end=end, file=sys.stderr, flush=True)
    return show


def tune(M: int, N: int, K: int, *, op: str = "mm", dtype: Optional[str] = None, layout: str = "rc",
         out_dtype: Optional[str] = None, scale: str = "row", use_fast_accum: bool = False,
         jit_search: Union[bool, Sequence[str]] = False, max_jit: int = 6,
         candidates: Optional[Sequence[Union[str, KernelConfig]]] = None, reps: int = 20, inner: int = 10,
         store: bool = True, progress: bool = True) -> TuneResult:
    """Time the configs that can run this problem on the current GPU; return the table, fastest
    first, and (``store``) make the fastest the dispatcher's choice for this exact problem.

    ``op``: ``"mm"``, ``"scaled_mm"``, ``"mxfp8_mm"`` or ``"fp8_fp4_mm"``; ``dtype`` the operand
    family (``"bf16"``/``"fp16"`` for mm, default bf16); ``layout``, ``out_dtype``: as for
    :func:`explain`; ``scale`` (``"tensor"``/``"row"``) and ``use_fast_accum`` for scaled_mm.
    Candidates: every built config the dispatcher would accept for the problem, plus the given
    ``candidates`` (names or :class:`KernelConfig`, compiled if need be), plus, with
    ``jit_search`` (True, or the knobs to vary from :data:`VARY`), up to ``max_jit`` specs near
    the fastest built one (:func:`jit_candidates`), compiled on first use.
    """
    import torch

    from ._extension import require_extension

    ext = require_extension()
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    families, default = OPS[op]
    family = default if dtype is None else dtype
    if family not in families:
        raise ValueError(f"dtype must be {' or '.join(families)} for op {op!r}, got {dtype!r}")
    scale = scale if op == "scaled_mm" else "none"
    if not torch.cuda.is_available():
        raise RuntimeError("tune times kernels on a GPU; torch sees none")
    dev = torch.device("cuda", torch.cuda.current_device())
    cc = torch.cuda.get_device_capability(dev)
    from .archs import ARCHS

    arch = next((a.name for a in ARCHS.values() if a.sm == cc), None)
    if arch is None or arch not in ext.registered_arches():
        raise RuntimeError(f"no kernel module is built for this GPU (compute capability {cc[0]}.{cc[1]})")
    sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
    M, N, K, _ = _check_args(M, N, K, family, out_dtype, layout, scale, arch, sm_count, None, use_fast_accum)
    if op == "fp8_fp4_mm" and K % 32:
        raise ValueError(f"K = {K} must be a multiple of 32 for fp8_fp4_mm")
    out = out_dtype or ("bf16" if family not in ("bf16", "fp16") else family)

    def fits(name: str) -> Optional[float]:
        try:
            d = ext.explain(arch, M, N, K, family, out, a_k_major=layout[0] == "r", b_k_major=layout[1] == "c",
                            scale=scale, sm_count=sm_count, config=name, fast_accum=use_fast_accum)
        except (RuntimeError, ValueError):
            return None
        return d["estimate_us"]

    pool: dict[str, tuple[str, float]] = {}
    for e in ext.built_kernels():
        n = e["config"]
        if e["arch"] == arch and n not in pool and KernelConfig.from_name(n).dtype == family:
            est = fits(n)
            if est is not None:
                pool[n] = ("built", est)
    for c in candidates or ():
        n = jit.runnable(c, op=op, family=family, device=dev)
        est = fits(n)
        if est is None:
            raise ValueError(f"candidate {n} cannot run this problem (explain(config=...) refuses it)")
        pool.setdefault(n, ("given", est))
    if not pool:
        raise RuntimeError(f"no built config of {family} on {arch} can run this problem")

    elem = {"bf16": 2, "fp16": 2}.get(family, 1)
    per_set = (M * K + N * K) * elem + M * N * 4
    copies = max(1, min(8, -(-(150 << 20) // per_set)))  # > 2x a 50 MB L2 in flight
    sets = _inputs(op, family, M, N, K, layout, scale, dev, copies)

    def run(names, label):
        calls = [[_runner(op, s, out, use_fast_accum, n) for s in sets] for n in names]
        t = replay_times(calls, reps, inner, _bar(label, progress))
        return {n: statistics.median(x) for n, x in zip(names, t)}

    measured = run(list(pool), f"tune: {len(pool)} built")
    if jit_search:
        vary = VARY if jit_search is True else tuple(jit_search)
        best = min(measured, key=measured.get)
        extra = []
        cands = jit_candidates(KernelConfig.from_name(best), vary, limit=max_jit, exclude=pool)
        if progress and cands:
            print(f"tune: preparing {len(cands)} JIT candidates: {', '.join(c.name for c in cands)}",
                  file=sys.stderr, flush=True)
        for cfg, n in zip(cands, jit.ensure_many(cands, quiet=not progress)):  # compiled concurrently
            if isinstance(n, Exception):
                warnings.warn(f"tune: skipping {cfg.name}: {n}", stacklevel=2)
                continue
            est = fits(n)
            if est is not None:
                pool[n] = ("jit", est)
                extra.append(n)
        if extra:  # timed again together with the best built one, interleaved
            measured.update(run([best] + extra, f"tune: {len(extra)} jit"))
    rows = sorted((TuneRow(n, measured[n], pool[n][0], pool[n][1]) for n in measured), key=lambda r: r.us)
    result = TuneResult(problem=dict(op=op, dtype=family, M=M, N=N, K=K, layout=layout, out_dtype=out, scale=scale,
                                     use_fast_accum=use_fast_accum),
                        rows=rows, winner=rows[0].config, device=torch.cuda.get_device_name(dev))
    if store:
        entry = dict(arch=arch, sm_count=sm_count, device=result.device, M=M, N=N, K=K, dtype=family, out_dtype=out,
                     layout=layout, scale=scale, use_fast_accum=use_fast_accum, config=result.winner,
                     us=rows[0].us, when=time.strftime("%Y-%m-%dT%H:%M:%S"))
        _apply(ext, entry)
        _persist(entry)
        result.stored = True
    return result
