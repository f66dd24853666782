"""Our mm / scaled_mm against cuBLAS (torch.mm, torch._scaled_mm), side by side in one process.

Timing: CUDA events around each call, median over `--iters` after `--warmup` calls; inputs
rotate over enough copies that together they exceed twice the L2, so no call finds its
operands cached by the previous one. Writes a CSV, a markdown table (ratio to the peer per
row, geometric mean) and a PNG.

    python benchmarks/bench_mm.py --out benchmarks/results/h200 [--suite quick|full] [--ops mm,scaled_mm]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path

import torch

import persistent_gemm as pg

SUITE = {
    "square": [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)],
    "prefill": [(4096, 7168, 2048), (8192, 28672, 8192), (8192, 8192, 28672)],
    "decode": [(1, 8192, 8192), (16, 8192, 8192), (64, 8192, 8192), (128, 8192, 8192), (128, 28672, 8192)],
    "ragged": [(1000, 3000, 5000), (257, 4096, 4096), (3000, 8192, 8192), (5000, 8192, 8192)],
    "unaligned": [(8191, 8191, 8192)],
}
QUICK = {"square": [(8192, 8192, 8192)], "ragged": [(3000, 8192, 8192)], "unaligned": [(8191, 8191, 8192)]}


def copies_for(nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(16, math.ceil(2 * l2 / max(nbytes, 1)) + 1))


def time_ms(fn, inputs, warmup: int, iters: int) -> float:
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        args = inputs[i % len(inputs)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def make_inputs(op: str, m: int, n: int, k: int):
    if op == "mm":
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
    if op == "mm":
        return {"ours": lambda a, b: pg.mm(a, b), "torch.mm": lambda a, b: torch.mm(a, b)}
    return {
        "ours": lambda a, b, sa, sb: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
        "torch._scaled_mm": lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/bench", help="output path stem (.csv/.md/.png added)")
    ap.add_argument("--suite", choices=["quick", "full"], default="full")
    ap.add_argument("--ops", default="mm,scaled_mm")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    suite = SUITE if args.suite == "full" else QUICK
    gpu = torch.cuda.get_device_name()
    rows = []
    for op in args.ops.split(","):
        for group, shapes in suite.items():
            for m, n, k in shapes:
                inputs = make_inputs(op, m, n, k)
                res = {}
                for label, fn in peers(op).items():
                    try:
                        res[label] = time_ms(fn, inputs, args.warmup, args.iters)
                    except RuntimeError as e:  # e.g. cuBLAS refusing an fp8 shape
                        print(f"{op} {m}x{n}x{k} {label}: {str(e).splitlines()[0]}")
                        res[label] = float("nan")
                ours, (peer_name, peer) = res["ours"], [(k_, v) for k_, v in res.items() if k_ != "ours"][0]
                flops = 2.0 * m * n * k
                row = dict(op=op, group=group, m=m, n=n, k=k, peer=peer_name,
                           ours_ms=ours, peer_ms=peer, ours_tflops=flops / ours / 1e9,
                           peer_tflops=flops / peer / 1e9, speedup=peer / ours, gpu=gpu)
                rows.append(row)
                print(f"{op:<9} {group:<9} {m:>5}x{n:>5}x{k:>5}  ours {row['ours_tflops']:7.1f} TFLOP/s  "
                      f"{peer_name} {row['peer_tflops']:7.1f}  x{row['speedup']:.2f}", flush=True)
                del inputs
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"GPU: {gpu}; medians of {args.iters} CUDA-event timings after {args.warmup} warm-up calls", "",
             "| op | group | M×N×K | ours TFLOP/s | peer | peer TFLOP/s | speedup |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['group']} | {r['m']}×{r['n']}×{r['k']} | {r['ours_tflops']:.1f} | "
                     f"{r['peer']} | {r['peer_tflops']:.1f} | {r['speedup']:.2f}× |")
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
