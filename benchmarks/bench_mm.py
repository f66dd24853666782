"""Our mm / scaled_mm against cuBLAS (torch.mm, torch._scaled_mm), side by side in one process.

Like with like: each benchmark "op" pairs ours with the peer in the same accumulation mode,
output dtype (bf16) and inputs --

    mm              pg.mm                                 vs torch.mm
    scaled_mm       pg.scaled_mm(use_fast_accum=False)    vs torch._scaled_mm(use_fast_accum=False)
                    (both promote FP8 partial sums to fp32: torch's default)
    scaled_mm_fast  pg.scaled_mm(use_fast_accum=True)     vs torch._scaled_mm(use_fast_accum=True)

Timing: CUDA events around each call, median over `--iters` after `--warmup` calls, ours and
the peer interleaved call by call (same clocks and temperature for both); inputs rotate over
enough copies that together they exceed twice the L2, so no call finds its operands cached by
the previous one. Writes a CSV, a markdown table (ratio to the peer per
row, geometric mean) and a PNG.

    python benchmarks/bench_mm.py --out benchmarks/results/h200 [--suite quick|full] [--ops mm,scaled_mm,scaled_mm_fast]

``--cutlass-peer`` adds two columns for bf16: stock CUTLASS (GemmUniversal with CUTLASS's own
PersistentScheduler, swizzle 8) over the collectives of our primary bf16 config, and the same
under CUTLASS's StreamKScheduler forced to stream-K, JIT-built from
``benchmarks/peers/cutlass_sm90_stock.cu``; they isolate what our kernel and scheduler are worth.

``--sweep`` also times every built config, forced with ``config=``, on every shape of the suite,
beside the dispatcher's pick, its cost-model estimate and the peer, interleaved with them
(``<out>_sweep.csv``): the data the heuristic's constants are fitted to. ``--configs`` adds
configs that are not built (JIT-compiled first, in parallel) to the sweep; ``--shapes``
replaces the suite with one group of ``MxNxK`` shapes. ``--overhead`` times back-to-back calls on a tiny problem,
where the GPU waits on the host, to show each op's host cost per call (``<out>_overhead.csv``).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from pathlib import Path

import torch

import persistent_gemm as pg
from persistent_gemm.explain import SWEEP_OPS  # each op's problem as explain() spells it

SUITE = {
    "square": [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)],
    "prefill": [(4096, 7168, 2048), (8192, 28672, 8192), (8192, 8192, 28672)],
    "decode": [(1, 8192, 8192), (16, 8192, 8192), (64, 8192, 8192), (128, 8192, 8192), (128, 28672, 8192)],
    "ragged": [(1000, 3000, 5000), (257, 4096, 4096), (3000, 8192, 8192), (5000, 8192, 8192)],
    "unaligned": [(8191, 8191, 8192)],
}
QUICK = {"square": [(8192, 8192, 8192)], "ragged": [(3000, 8192, 8192)], "unaligned": [(8191, 8191, 8192)]}


def write_csv(path, rows: list, fieldnames=None) -> None:
    """``rows`` (dicts) to the CSV file ``path``, its folder made; the header is ``fieldnames``, else
    the first row's keys. Every benchmark writes its table through this."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fieldnames or list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def copies_for(nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(16, math.ceil(2 * l2 / max(nbytes, 1)) + 1))


#: GPU clock cycles of the spin queued before each timed call in kernel-time mode (~100 us):
#: longer than any contender's host work, so the call's kernels are queued before the start
#: event runs and the events bracket GPU time alone.
SPIN_CYCLES = 200_000


def time_interleaved(fns: dict, inputs, warmup: int, iters: int, kernel_time: bool = False) -> dict:
    """Median ms per call of each fn, timed round-robin: iteration i runs every fn once, so all
    of them meet the same clocks and temperature (an H200 under GEMM load drifts by 10% over
    seconds, which timing one fn after the other turns into a bias). A fn that raises during
    warm-up (cuBLAS refusing a shape) gets NaN. ``kernel_time``: a GPU spin before the start
    event hides the host's launch work, so a call costs its kernels' time (and the gaps between
    them), not its Python and dispatcher time; without it an idle GPU waits for the launch."""
    live, out = {}, {}
    for label, fn in fns.items():
        try:
            for i in range(warmup):
                fn(*inputs[i % len(inputs)])
            live[label] = fn
        except RuntimeError as e:
            print(f"  {label}: {str(e).splitlines()[0]}")
            out[label] = float("nan")
    torch.cuda.synchronize()
    times = {label: [] for label in live}
    for i in range(iters):
        args = inputs[i % len(inputs)]
        for label, fn in live.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if kernel_time:
                torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times[label].append(start.elapsed_time(end))
    out.update({label: statistics.median(t) for label, t in times.items()})
    return out


#: benchmark op -> (input kind, use_fast_accum for both contenders, peer label). One table:
#: the timing loop, the sweep, the CSV and the markdown all read it.
OPS = {
    "mm": ("bf16", None, "torch.mm"),
    "scaled_mm": ("e4m3", False, "torch._scaled_mm(use_fast_accum=False)"),
    "scaled_mm_fast": ("e4m3", True, "torch._scaled_mm(use_fast_accum=True)"),
}


def make_inputs(op: str, m: int, n: int, k: int):
    if OPS[op][0] == "bf16":
        per = (m * k + k * n) * 2
        mk = lambda: (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                      torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t())
    else:
        per = m * k + k * n
        def mk():
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda")
            return a, b, one, one
    return [mk() for _ in range(copies_for(per))]


def peers(op: str):
    kind, fast, peer = OPS[op]
    if kind == "bf16":
        return {"ours": lambda a, b, **kw: pg.mm(a, b, **kw), peer: lambda a, b: torch.mm(a, b)}
    return {
        "ours": lambda a, b, sa, sb, **kw: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16,
                                                        use_fast_accum=fast, **kw),
        peer: lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast),
    }


def cutlass_peer():
    """Build (once, cached by torch) and load the stock-CUTLASS peer for bf16 mm, with the
    package's own flags and toolkit/CUTLASS lookup (persistent_gemm.build_flags)."""
    from persistent_gemm import build_flags
    from persistent_gemm.archs import ARCHS

    root = Path(__file__).resolve().parent.parent
    cuda, (cutlass, why) = build_flags.find_cuda_home(), build_flags.find_cutlass()
    if cuda is None or cutlass is None:
        raise RuntimeError(why or "no CUDA toolkit found (set CUDA_HOME)")
    return build_flags.torch_cpp_extension(cuda).load(
        name="pgemm_cutlass_peer",
        sources=[str(root / "benchmarks" / "peers" / f"cutlass_sm90_stock.{ext}") for ext in ("cpp", "cu")],
        extra_include_paths=build_flags.include_dirs(root, cutlass, cuda),
        extra_cuda_cflags=build_flags.nvcc_flags(ARCHS["sm90a"].gencode),  # wgmma/TMA: the 'a' target
        extra_cflags=list(build_flags.CXX_FLAGS),
        verbose=False,
    )


def op_takes(op: str, config) -> bool:
    """Whether benchmark ``op`` may run ``config``: its dtype, and no fast-accumulation kernel for
    a promoted op."""
    kind, fast, _ = OPS[op]
    return config.dtype == kind and (fast or config.accum != "fast")


def built_configs(op: str, extra=()) -> list[str]:
    """Built configs the op may run, and those of ``extra`` (KernelConfigs) it may run."""
    from persistent_gemm.kernel_config import as_config
    names = {k["config"] for k in pg._C.built_kernels()} | {c.name for c in extra}
    return sorted(n for n in names if op_takes(op, as_config(n)))


def sweep(op: str, suite, warmup: int, iters: int, out: Path, kernel_time: bool = False, extra=()) -> None:
    """Every built config of the op's dtype (and those of ``extra``) forced on every shape,
    interleaved with the peer: measured vs the model."""
    rows = []
    fns = peers(op)
    ours, peer_label, configs = fns.pop("ours"), next(iter(fns)), built_configs(op, extra)
    for group, shapes in suite.items():
        for m, n, k in shapes:
            inputs = make_inputs(op, m, n, k)
            kinds = SWEEP_OPS[op]
            picked = pg.explain(m, n, k, out_dtype="bf16", **kinds).config
            times = time_interleaved({**{cfg: (lambda *a, cfg=cfg: ours(*a, config=cfg)) for cfg in configs},
                                      peer_label: fns[peer_label]}, inputs, warmup, iters, kernel_time)
            for cfg in configs:
                forced = pg.explain(m, n, k, out_dtype="bf16", config=cfg, **kinds)
                ms = times[cfg]
                rows.append(dict(op=op, group=group, m=m, n=n, k=k, config=cfg, ms=ms,
                                 tflops=2.0 * m * n * k / ms / 1e9, estimate_us=forced.estimate_us,
                                 picked=int(cfg == picked), peer_ms=times[peer_label]))
                print(f"sweep {op:<9} {m:>5}x{n:>5}x{k:>5} {cfg:<45} {rows[-1]['tflops']:7.1f} TFLOP/s "
                      f"({ms * 1e3:8.1f} us, model {forced.estimate_us:8.1f}, peer {times[peer_label] * 1e3:8.1f})"
                      f"{' <- picked' if rows[-1]['picked'] else ''}", flush=True)
            del inputs
    path = out.with_name(out.name + "_sweep.csv")
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


def host_overhead(out: Path, calls: int = 2000) -> None:
    """Host time per call: back-to-back calls on a tiny problem, one synchronize at the end."""
    a, b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16), torch.randn(64, 64, device="cuda",
                                                                                     dtype=torch.bfloat16)
    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    cases = {
        "pg.mm": lambda: pg.mm(a, b),
        "torch.mm": lambda: torch.mm(a, b),
        "pg.scaled_mm": lambda: pg.scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
        "torch._scaled_mm": lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
    }
    rows = []
    for label, fn in cases.items():
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / calls * 1e6
        rows.append(dict(call=label, us_per_call=us))
        print(f"host overhead {label:<18} {us:6.2f} us/call", flush=True)
    write_csv(out.with_name(out.name + "_overhead.csv"), rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/bench", help="output path stem (.csv/.md/.png added)")
    ap.add_argument("--suite", choices=["quick", "full"], default="full")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {list(OPS)}")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--sweep", action="store_true", help="also time every built config on every shape")
    ap.add_argument("--configs", default="",
                    help="comma-separated config names that are not built, JIT-compiled and added to the sweep")
    ap.add_argument("--shapes", default="", help="comma-separated MxNxK shapes replacing the suite (one group)")
    ap.add_argument("--kernel-time", action="store_true",
                    help="time the GPU work alone (a spin hides each call's host launch work; see time_interleaved)")
    ap.add_argument("--overhead", action="store_true", help="also measure host time per call")
    ap.add_argument("--cutlass-peer", action="store_true", help="also time stock CUTLASS (bf16 mm)")
    args = ap.parse_args()
    unknown = [o for o in args.ops.split(",") if o not in OPS]
    if unknown:
        ap.error(f"--ops: unknown {unknown}; choose from {list(OPS)}")
    suite = SUITE if args.suite == "full" else QUICK
    if args.shapes:
        try:
            suite = {"given": [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]}
        except ValueError:
            ap.error(f"--shapes: expected MxNxK[,MxNxK...], got {args.shapes!r}")
        if any(len(s) != 3 for s in suite["given"]):
            ap.error(f"--shapes: expected MxNxK[,MxNxK...], got {args.shapes!r}")
    extra = []
    if args.configs:
        from persistent_gemm.kernel_config import ConfigError, as_config
        if not args.sweep:
            ap.error("--configs adds configs to the sweep: pass --sweep too")
        try:
            extra = [as_config(c) for c in args.configs.split(",")]  # a bad name fails here, before any timing
        except (ConfigError, ValueError) as e:
            ap.error(f"--configs: {e}")
        for cfg, res in zip(extra, pg.jit.ensure_many(extra, jobs=min(len(extra), 8))):
            if isinstance(res, Exception):
                ap.error(f"--configs: {cfg.name}: {str(res).splitlines()[0]}")
    gpu = torch.cuda.get_device_name()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    peer_cutlass = cutlass_peer() if args.cutlass_peer else None
    if args.overhead:
        host_overhead(out)
    if args.sweep:
        sweep_path = out.with_name(out.name + "_sweep.csv")
        if sweep_path.exists():
            sweep_path.unlink()
        for op in args.ops.split(","):
            sweep(op, suite, args.warmup, args.iters, out, args.kernel_time, extra)
    rows = []
    for op in args.ops.split(","):
        for group, shapes in suite.items():
            for m, n, k in shapes:
                inputs = make_inputs(op, m, n, k)
                fns = peers(op)
                if peer_cutlass is not None and OPS[op][0] == "bf16":
                    fns["cutlass"] = lambda a, b: peer_cutlass.mm(a, b, 8, 0)
                    fns["cutlass_sk"] = lambda a, b: peer_cutlass.mm(a, b, 8, 1)
                res = time_interleaved(fns, inputs, args.warmup, args.iters, args.kernel_time)
                cutlass_ms, cutlass_sk_ms = res.pop("cutlass", float("nan")), res.pop("cutlass_sk", float("nan"))
                ours, (peer_name, peer) = res["ours"], [(k_, v) for k_, v in res.items() if k_ != "ours"][0]
                flops = 2.0 * m * n * k
                accum = "fp32" if OPS[op][1] is None else ("fast" if OPS[op][1] else "promoted")
                picked = pg.explain(m, n, k, out_dtype="bf16", **SWEEP_OPS[op]).config
                row = dict(op=op, accum=accum, group=group, m=m, n=n, k=k, config=picked, peer=peer_name,
                           ours_ms=ours, peer_ms=peer, ours_tflops=flops / ours / 1e9,
                           peer_tflops=flops / peer / 1e9, speedup=peer / ours, gpu=gpu,
                           cutlass_ms=cutlass_ms, cutlass_tflops=flops / cutlass_ms / 1e9,
                           cutlass_sk_ms=cutlass_sk_ms)
                rows.append(row)
                print(f"{op:<9} {group:<9} {m:>5}x{n:>5}x{k:>5}  ours {row['ours_tflops']:7.1f} TFLOP/s  "
                      f"{peer_name} {row['peer_tflops']:7.1f}  x{row['speedup']:.2f}"
                      + (f"  stock CUTLASS {cutlass_ms * 1e3:.1f} us, its stream-K {cutlass_sk_ms * 1e3:.1f} us"
                         if math.isfinite(cutlass_ms) else ""),
                      flush=True)
                del inputs
    write_csv(out.with_suffix(".csv"), rows)
    lines = [f"GPU: {gpu}; medians of {args.iters} CUDA-event timings per call"
             + (" (kernel time: host launch work hidden behind a GPU spin)" if args.kernel_time else " (host launch included)")
             + ", ours and the peer interleaved, "
             f"after {args.warmup} warm-up calls", "",
             "Each row compares like with like: same inputs, bf16 output, same accumulation mode "
             "(`accum`: fp32 for bf16 mm; FP8 `promoted` = use_fast_accum=False on both sides, `fast` = True on both).",
             "",
             "| op | accum | group | M×N×K | ours TFLOP/s | our kernel | peer | peer TFLOP/s | speedup |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['accum']} | {r['group']} | {r['m']}×{r['n']}×{r['k']} | {r['ours_tflops']:.1f} | "
                     f"`{r['config']}` | {r['peer']} | {r['peer_tflops']:.1f} | {r['speedup']:.2f}× |")
    with_cutlass = [r for r in rows if math.isfinite(r["cutlass_ms"])]
    if with_cutlass:
        lines += ["", "Stock CUTLASS (GemmUniversal + CUTLASS's PersistentScheduler, swizzle 8, same collectives "
                  "as our sm90a_bf16_128x256x64_c2x1_sw8_row_coop; and the same under its StreamKScheduler forced "
                  "to stream-K, deterministic reduction, its workspace memset included), interleaved in the same "
                  "run. Ours is the dispatcher's pick: that same config on the large rows, other tiles on decode "
                  "and small ragged rows.", "",
                  "| M×N×K | ours µs | stock CUTLASS µs | its stream-K µs | ours / CUTLASS |", "|---|---|---|---|---|"]
        for r in with_cutlass:
            lines.append(f"| {r['m']}×{r['n']}×{r['k']} | {r['ours_ms'] * 1e3:.1f} | {r['cutlass_ms'] * 1e3:.1f} | "
                         f"{r['cutlass_sk_ms'] * 1e3:.1f} | {r['cutlass_ms'] / r['ours_ms']:.2f}× |")
    for op in dict.fromkeys(r["op"] for r in rows):
        sp = [r["speedup"] for r in rows if r["op"] == op and math.isfinite(r["speedup"])]
        if sp:
            gm = math.exp(sum(map(math.log, sp)) / len(sp))
            lines.append(f"\n**{op}**: geometric mean speedup {gm:.3f}× over {len(sp)} shapes (min {min(sp):.2f}×)")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-3:]))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.5), 4))
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["ours_tflops"] for r in rows], 0.4, label="persistent_gemm")
        ax.bar([x + 0.2 for x in xs], [r["peer_tflops"] for r in rows], 0.4, label="peer (cuBLAS)")
        ax.set_xticks(list(xs), [f"{r['op']}\n{r['m']}x{r['n']}x{r['k']}" for r in rows], rotation=90, fontsize=6)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(gpu)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)
    except ImportError:
        print("matplotlib missing: no PNG")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
