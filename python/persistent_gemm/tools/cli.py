"""Command line: ``python -m persistent_gemm COMMAND ...``; ``--help`` lists the commands (argparse
builds that list from the parser, and tests/test_cli.py holds one example per command here).

``schedule`` is pure Python (it imports :mod:`persistent_gemm.schedule`,
:mod:`persistent_gemm.footprint` and :mod:`persistent_gemm.catalogue` only, never the compiled
extension): it prints a config's
canonical name, its tile/cluster grid, the waves of persistent workers and the per-wave
operand footprint, and optionally draws the visit order to a PNG.

Examples::

    python -m persistent_gemm list --arch sm90a
    python -m persistent_gemm explain --m 128 --n 8192 --k 8192 --dtype fp8_fp4
    python -m persistent_gemm schedule --m 8192 --n 8192 --k 8192 --swizzle 8 --out order.png
    python -m persistent_gemm schedule --m 4096 --n 4096 --config sm90a_bf16_128x256x64_c2x1_sw8_row_coop
    python -m persistent_gemm precompile sm90a_bf16_128x64x64_c1x2_sw3_column_pp
    python -m persistent_gemm tune --m 4096 --n 4096 --k 4096 --op mm --jit
    python -m persistent_gemm demo
    python -m persistent_gemm selfcheck

``explain``, ``precompile``, ``tune``, ``demo`` and ``selfcheck`` need the compiled extension
(``tune`` and ``selfcheck`` a GPU); ``list`` says when it is not built.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from ..archs import ARCH_NAMES, ARCHS
from ..catalogue import DTYPES, KernelConfig
from ..explain import DTYPES as EXPLAIN_DTYPES
from ..library import FAMILY_ALIASES
from ..schedule import TileSchedule

# Flags that build a KernelConfig field by field; they conflict with --config. Their defaults are
# TileSchedule()'s and KernelConfig()'s own, so the CLI and the Python API mean the same thing.
_SCHEDULE_DEFAULT = TileSchedule()
_KERNEL_DEFAULT = KernelConfig()
_CONFIG_DEFAULTS = {
    "swizzle": _SCHEDULE_DEFAULT.swizzle,
    "cluster": "x".join(map(str, _SCHEDULE_DEFAULT.cluster)),
    "raster": _SCHEDULE_DEFAULT.raster,
    "tile": "x".join(map(str, _KERNEL_DEFAULT.tile)),
    "kernel": None,  # first style of the arch
    "dtype": _KERNEL_DEFAULT.dtype,
    "arch": _KERNEL_DEFAULT.arch,
    "stages": None,
    "split_k": None,
    "stream_k": None,
}
_KERNEL_ALIASES = {"coop": "cooperative", "pp": "pingpong"}


#: The CLI walks every cluster id of the problem in Python; past this many it would seem to hang.
MAX_IDS = 1_000_000


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): exit status 2 as argparse's own."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help` for usage)\n")


def _ints(text: str, n: int, what: str) -> tuple[int, ...]:
    parts = text.lower().split("x")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != n:
        raise argparse.ArgumentTypeError(f"{what} must look like {'x'.join(['N'] * n)}, got {text!r}")
    return vals


def _build_config(args: argparse.Namespace):
    from ..catalogue import KERNEL_STYLES, KernelConfig
    from ..schedule import TileSchedule

    given = [k for k in _CONFIG_DEFAULTS if getattr(args, k) is not None]
    if args.config is not None:
        if given:
            raise ValueError(f"--config already names the kernel; drop --{', --'.join(given)}")
        return KernelConfig.from_name(args.config)
    v = {k: (getattr(args, k) if getattr(args, k) is not None else d) for k, d in _CONFIG_DEFAULTS.items()}
    kernel = v["kernel"]
    if kernel is None:
        kernel = ARCHS[v["arch"]].default_style if v["arch"] in ARCHS else KERNEL_STYLES.get(v["arch"], ("cooperative",))[0]
    kernel = _KERNEL_ALIASES.get(kernel, kernel)
    schedule = TileSchedule(swizzle=v["swizzle"], cluster=_ints(v["cluster"], 2, "--cluster"), raster=v["raster"],
                            split_k=v["split_k"] or 1, stream_k=bool(v["stream_k"]))
    return KernelConfig(
        tile=_ints(v["tile"], 3, "--tile"),
        schedule=schedule,
        stages=v["stages"],
        kernel=kernel,
        dtype=v["dtype"],
        arch=v["arch"],
    )


def _cmd_schedule(args: argparse.Namespace) -> int:
    from .. import footprint as fp
    from ..catalogue import ConfigError
    from ..schedule import default_workers

    try:
        config = _build_config(args)
    except (ConfigError, ValueError, TypeError, argparse.ArgumentTypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        # Before the report, not after it: the picture is what was asked for.
        print(f"error: --out {args.out!r}: folder {os.path.dirname(os.path.abspath(args.out))!r} does not exist",
              file=sys.stderr)
        return 2
    s = config.schedule
    if args.workers is not None:
        workers, how = args.workers, "given"
    else:
        workers = default_workers(args.sms, s)
        how = f"{args.sms} SMs / {s.cluster_m * s.cluster_n}-CTA clusters"
    try:
        g = config.grid(args.m, args.n, K=args.k)
        if g.num_ids > MAX_IDS:
            raise ValueError(f"--m {args.m} --n {args.n} make {g.num_ids} cluster ids; this tool walks each "
                             f"one and stops at {MAX_IDS}")
        fps = fp.wave_footprint(config, args.m, args.n, args.k, workers)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = fp.footprint_summary(config, args.m, args.n, args.k, workers, footprints=fps)
    a_el, b_el = fp.operand_bytes(config.dtype)
    waves = g.waves(workers)
    last = g.num_ids - (waves - 1) * workers
    print(f"config    {config.name}")
    print(f"build     {_build_line(config, given=args.config is not None)}")
    print(f"problem   M={args.m} N={args.n} K={args.k}  ({config.dtype}: A {float(a_el):g} B/elem, B {float(b_el):g} B/elem)")
    print(
        f"grid      tiles Mt x Nt = {g.tiles_m} x {g.tiles_n} ({config.cta_tile[0]}x{config.cta_tile[1]} per CTA), "
        f"clusters Mc x Nc = {g.clusters_m} x {g.clusters_n} ({s.cluster_m}x{s.cluster_n}), ids = {g.num_ids}"
    )
    if g.splits > 1:
        print(f"split-K   {g.splits} units per tile, each a range of the {g.k_tiles} K-tiles, reduced in a fixed order")
    if s.stream_k:
        part = g.stream_k(workers)
        last = part.sk_units or last
        if part.sk_units:
            lanes = f" in {part.lanes} lanes of {part.parts}" if part.lanes > 1 else ""
            print(f"stream-K  {part.dp_units} ids data-parallel, then {part.sk_units} shared by {part.sk_workers} workers"
                  f"{lanes} in K-tiles ({part.items * part.lanes} of them, {part.items // part.parts}-"
                  f"{-(-part.items // part.parts)} a worker)")
        else:
            print("stream-K  whole waves only: every id data-parallel")
    print(f"workers   {workers} ({how}); waves = {waves} (last wave {last} ids)")
    print("footprint (distinct A row-panels / B column-panels per wave, "
          + ("per K range)" if g.splits > 1 or s.stream_k else "full K)"))
    print("  " + fp.format_summary(summary).replace("\n", "\n  "))
    if args.per_wave:
        print(fp.format_footprint(fps))
    if args.out:
        try:
            from .picture import plot

            path = plot(config, args.m, args.n, args.out, workers=workers, color_by=args.color_by, K=args.k,
                            highlight=args.highlight)
        except ImportError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except (OSError, ValueError, TypeError) as e:  # unwritable folder, unknown suffix, tile off the grid
            print(f"error: cannot write --out {args.out!r}: {e}", file=sys.stderr)
            return 2
        print(f"wrote     {path}")
    return 0


def _build_line(config, given: bool) -> str:
    """Whether ``config`` runs here, for the schedule's report (the picture's title says the same)."""
    from .picture_data import NO_EXTENSION_STATUS, build_status

    status = build_status(config)
    if status == NO_EXTENSION_STATUS:
        return "no extension built here: the schedule below is the config's, nothing runs it on this install"
    if status.startswith("not built") and not given:
        # The defaults (TileSchedule()'s, KernelConfig()'s) name a spec, not necessarily a built kernel.
        status += "; the flags' defaults name a spec, not a built kernel: `python -m persistent_gemm list` shows those"
    return status


def _need_extension(what: str) -> bool:
    import persistent_gemm as pg

    if not pg.extension_available():
        print(f"error: {what} needs persistent_gemm's compiled extension, which is not built here; "
              "scripts/setup_and_demo.sh builds it", file=sys.stderr)
        return False
    return True


def _cmd_precompile(args: argparse.Namespace) -> int:
    from .. import jit
    from ..catalogue import ConfigError

    if not _need_extension("precompile"):
        return 1
    try:
        results = jit.ensure_many(args.configs, jobs=args.jobs)
    except (ConfigError, ValueError) as e:  # a bad name or --jobs: before anything compiles
        print(f"error: {e}", file=sys.stderr)
        return 2
    rc = 0
    for r in results:
        if isinstance(r, Exception):
            print(f"error: {r}", file=sys.stderr)
            rc = 2 if isinstance(r, ConfigError) else 1
        else:
            print(f"ready     {r}")
    return rc


def _cmd_tune(args: argparse.Namespace) -> int:
    from .. import jit
    from ..tuning import tune

    if not _need_extension("tune"):
        return 1
    vary = True if args.jit == "all" else (tuple(args.jit.split(",")) if args.jit else False)
    try:
        r = tune(args.m, args.n, args.k, op=args.op, dtype=args.dtype, layout=args.layout, out_dtype=args.out_dtype,
                 scale=args.scale, use_fast_accum=args.fast_accum, jit_search=vary, max_jit=args.max_jit,
                 candidates=args.candidate, store=not args.no_store, reps=args.reps)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, jit.JitCompileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(r)
    return 0


def _cmd_selfcheck(args) -> int:
    import torch

    from .. import require_extension, selfcheck

    ext = require_extension()
    if not torch.cuda.is_available():
        print("error: selfcheck needs a CUDA GPU", file=sys.stderr)
        return 2
    major, minor = torch.cuda.get_device_capability(args.device)
    arch = next((a for a, info in ext.arch_info().items() if tuple(info["sm"]) == (major, minor)), None)
    if arch is None:
        print(f"error: no kernel module is built for this GPU (sm_{major}{minor})", file=sys.stderr)
        return 2
    # Grouped kernels (MoE experts) refuse the self-check's one-GEMM problems: their GPU suite
    # (tests/test_gpu_grouped.py) checks them, and the dispatcher never self-checks them.
    built = sorted({k["config"] for k in ext.built_kernels() if k["arch"] == arch})
    configs = [c for c in built if not KernelConfig.from_name(c).schedule.grouped]
    for c in sorted(set(built) - set(configs)):
        print(f"skip {c} (grouped: tests/test_gpu_grouped.py checks it)")
    verdicts = selfcheck.verdicts(arch, args.device, configs, use_cache=False if args.no_cache else None)
    for config, passed, report in verdicts:
        print(f"{'pass' if passed else 'FAIL'} {config}" + ("" if passed else f"\n    {report}"))
    failed = sum(not v[1] for v in verdicts)
    print(f"{len(verdicts)} kernels, {failed} failed")
    return 1 if failed else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import persistent_gemm as pg

    if not pg.extension_available():  # say so in one line, not with an ImportError traceback
        print("error: the demo needs persistent_gemm's compiled extension, which is not built here; "
              "scripts/setup_and_demo.sh builds it and runs the demo", file=sys.stderr)
        return 1
    from .demo import main  # lazily: the demo imports torch and runs the ops

    rc = main(model_weights=args.model_weights, model=not args.no_model)
    return rc if isinstance(rc, int) else 0


def _cmd_list(args: argparse.Namespace) -> int:
    import persistent_gemm as pg

    built = set(pg.built_configs())
    rows = [c for c in pg.CATALOGUE if args.arch is None or c.arch == args.arch]
    if not pg.extension_available():
        print("(the compiled extension is not built here: nothing runs; the catalogue follows)")
    for c in rows:
        print(f"{'built    ' if c.name in built else 'not built'}  {c.name}")
    for name in sorted(built - {c.name for c in pg.CATALOGUE}):
        if args.arch is None or name.startswith(args.arch + "_"):
            print(f"jit      {name}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    import persistent_gemm as pg

    if not pg.extension_available():
        print("error: explain consults the built kernel tables; the compiled extension is not built here",
              file=sys.stderr)
        return 1
    try:
        d = pg.explain(args.m, args.n, args.k, dtype=args.dtype, out_dtype=args.out_dtype, layout=args.layout,
                       scale=args.scale, arch=args.arch, sm_count=args.sms, config=args.config,
                       use_fast_accum=args.fast_accum)
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(d)
    return 0


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = _Parser(prog="python -m persistent_gemm", description="persistent_gemm tools")
    p.add_argument("--version", action="version", version=f"persistent_gemm {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ls = sub.add_parser("list", help="the catalogue, each config marked built or not, and loaded JIT configs")
    ls.add_argument("--arch", choices=ARCH_NAMES, help="only this arch")
    ls.set_defaults(func=_cmd_list)

    ex = sub.add_parser("explain", help="the kernel mm/scaled_mm/the MX ops would run for a problem, and why")
    ex.add_argument("--m", type=int, required=True)
    ex.add_argument("--n", type=int, required=True)
    ex.add_argument("--k", type=int, required=True)
    # explain's own names and their aliases (the op's name, the pg.nn format): one table, library's.
    ex.add_argument("--dtype", choices=EXPLAIN_DTYPES + tuple(FAMILY_ALIASES), default="bf16",
                    help="operand family, or an alias: the op's name or the pg.nn format (default bf16)")
    ex.add_argument("--out-dtype", choices=("bf16", "fp16", "fp32"))
    ex.add_argument("--layout", default="rc", help="a then b: r row-major, c column-major (default rc)")
    ex.add_argument("--scale", choices=("none", "tensor", "row"), default="none",
                    help="scaled_mm scales (e4m3 needs tensor or row)")
    ex.add_argument("--arch", choices=ARCH_NAMES, default="sm90a")
    ex.add_argument("--sms", type=int, help="SM count (default: the arch's reference part)")
    ex.add_argument("--config", help="force a config by name")
    ex.add_argument("--fast-accum", action="store_true", help="e4m3: allow fast-accumulation kernels")
    ex.set_defaults(func=_cmd_explain)

    q = sub.add_parser(
        "schedule",
        help="show a config's persistent tile schedule and per-wave L2 footprint (no GPU needed)",
        description="Print the tile/cluster grid, waves and per-wave operand footprint of a kernel "
        "config on an M x N x K problem; optionally draw the visit order.",
    )
    q.add_argument("--m", type=int, required=True, help="rows of C")
    q.add_argument("--n", type=int, required=True, help="columns of C")
    q.add_argument("--k", type=int, default=8192, help="reduction depth (default 8192)")
    q.add_argument("--config", help="canonical config name, e.g. sm90a_bf16_128x256x64_c2x1_sw8_row_coop")
    q.add_argument("--swizzle", type=int, help=f"panel width in clusters (default {_CONFIG_DEFAULTS['swizzle']}, "
                   "TileSchedule()'s)")
    q.add_argument("--cluster", help=f"cluster_m x cluster_n (default {_CONFIG_DEFAULTS['cluster']}, TileSchedule()'s)")
    q.add_argument("--raster", choices=("row", "column"), help="default row")
    q.add_argument("--tile", help="tile_m x tile_n x tile_k (default 128x256x64)")
    q.add_argument(
        "--kernel",
        choices=tuple(dict.fromkeys(s for a in ARCHS.values() for s in a.styles)) + tuple(_KERNEL_ALIASES),
        help="kernel style (default: " + ", ".join(f"{a.default_style} on {a.name}" for a in ARCHS.values()) + ")",
    )
    q.add_argument("--dtype", choices=DTYPES, help="default bf16")
    q.add_argument("--arch", choices=ARCH_NAMES, help=f"default {_CONFIG_DEFAULTS['arch']}")
    q.add_argument("--stages", type=int, help="pipeline stages (default: auto)")
    q.add_argument("--split-k", type=int, help="work units per tile, each a K range, reduced in a fixed order "
                   "(default 1; the sm90a 16-bit and e4m3 kernels run it)")
    q.add_argument("--stream-k", action="store_true", default=None,
                   help="whole waves data-parallel, the rest shared out in K-tiles (the sm90a 16-bit and e4m3 kernels)")
    w = q.add_mutually_exclusive_group()
    w.add_argument("--workers", type=int, help="persistent workers (clusters)")
    w.add_argument("--sms", type=int, default=132, help="SM count; workers = sms // cluster size (default 132)")
    q.add_argument("--per-wave", action="store_true", help="also print the footprint of every wave")
    q.add_argument("--out", help="write the visit-order picture here (PNG; needs matplotlib)")
    q.add_argument("--color-by", choices=("wave", "worker"), default="wave", help="picture colours (default wave)")
    q.add_argument("--highlight", type=lambda t: _ints(t, 2, "--highlight"), metavar="MxN",
                   help="outline tile (m, n) in the picture and name its worker and step, e.g. 3x5")
    q.set_defaults(func=_cmd_schedule)

    pc = sub.add_parser("precompile", help="compile configs that are not built (the JIT cache) ahead of use",
                        description="Compile each named config into the JIT cache ($PGEMM_CACHE_DIR, default "
                        "~/.cache/persistent_gemm), or load it if it is there already.")
    pc.add_argument("configs", nargs="+", metavar="CONFIG", help="canonical config names")
    pc.add_argument("--jobs", type=int, help="configs compiled at once (default: one per 8 cores)")
    pc.set_defaults(func=_cmd_precompile)

    from ..tuning import OPS, VARY

    t = sub.add_parser("tune", help="time candidate configs for a problem on this GPU and keep the fastest",
                       description="Time the configs that can run an M x N x K problem (built ones, optionally JIT "
                       "candidates) and store the winner in the tuning cache the dispatcher consults.")
    t.add_argument("--m", type=int, required=True)
    t.add_argument("--n", type=int, required=True)
    t.add_argument("--k", type=int, required=True)
    t.add_argument("--op", choices=tuple(OPS), default="mm")
    t.add_argument("--dtype", help="operand family: bf16 or fp16 for mm (default: the op's own)")
    t.add_argument("--layout", default="rc", help="a then b: r row-major, c column-major (default rc)")
    t.add_argument("--out-dtype", choices=("bf16", "fp16", "fp32"))
    t.add_argument("--scale", choices=("tensor", "row"), default="row", help="scaled_mm scales (default row)")
    t.add_argument("--fast-accum", action="store_true", help="scaled_mm: allow fast-accumulation kernels")
    t.add_argument("--jit", nargs="?", const="all", default="",
                   help=f"also JIT-compile specs near the fastest built one; optionally the knobs to vary, "
                   f"comma-separated from {','.join(VARY)}")
    t.add_argument("--max-jit", type=int, default=6, help="at most this many JIT candidates (default 6)")
    t.add_argument("--candidate", action="append", help="a config to time as well (repeatable)")
    t.add_argument("--reps", type=int, default=20, help="timed replays per candidate (default 20)")
    t.add_argument("--no-store", action="store_true", help="report only; leave the dispatcher as it is")
    t.set_defaults(func=_cmd_tune)

    d = sub.add_parser("demo", help="run every op once against float64 (needs the compiled extension; runs the "
                       "CPU reference implementations where no GPU kernels are built), then a small real "
                       "model (GPT-2 from microformer-mgm) swapped to each format")
    d.add_argument("--model-weights", metavar="PATH", default=None,
                   help="the real model's weights: microformer_mgm-0.5.8-py3-none-any.whl or its pytorch_model.bin "
                        "(default: $PGEMM_DEMO_WEIGHTS, else the installed package from "
                        "`pip install --no-deps microformer-mgm==0.5.8`, else .whl/ in a source checkout; "
                        "without them that part is skipped)")
    d.add_argument("--no-model", action="store_true", help="skip the real-model part")
    d.set_defaults(func=_cmd_demo)

    sc = sub.add_parser("selfcheck", help="check every built kernel of this GPU's arch against the reference "
                        "implementations, each in a child process with a timeout (what the first use of an arch "
                        "not validated on hardware does automatically); prints the verdicts")
    sc.add_argument("--device", type=int, default=0, help="CUDA device (default 0)")
    sc.add_argument("--no-cache", action="store_true", help="check again instead of reading cached verdicts")
    sc.set_defaults(func=_cmd_selfcheck)
    return p


#: The exit status of a process killed by SIGPIPE (128 + 13), what `git log | head` leaves behind.
BROKEN_PIPE_STATUS = 141


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = _parser().parse_args(argv)
        # Counts and extents: checked here so each message names the flag as typed.
        for flag in ("m", "n", "k", "workers", "sms", "reps", "max_jit"):
            v = getattr(args, flag, None)
            if v is not None and v < 1:
                print(f"error: --{flag.replace('_', '-')} must be >= 1, got {v}", file=sys.stderr)
                return 2
        rc = args.func(args)
        sys.stdout.flush()  # a reader gone (`list | head`) shows here, not in the interpreter's last flush
        return rc
    except BrokenPipeError:
        # Python's documented idiom: stdout to devnull so the final flush cannot raise again. The
        # status is SIGPIPE's, as C tools report it: the output was cut short, which a shell with
        # pipefail should see, but no traceback for what is the reader's choice.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_STATUS


if __name__ == "__main__":
    sys.exit(main())
