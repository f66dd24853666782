"""Decode GEMMs (M = 1..16 tokens against a large weight) in CUDA-graph replay, ours vs cuBLAS.

Serving stacks run decode inside CUDA graphs, and there a ~10-40 us kernel is not hidden behind
~12 us of host launch, as it is in a per-call event timing. So every contender here is timed
the same way: ``--inner`` calls on inputs rotated past L2 captured in one graph, the graphs of
all contenders replayed interleaved (``persistent_gemm.tuning.replay_times``), medians.

Like with like, per row (same inputs, same output dtype bf16, same accumulation):

    mm            pg.mm                                  vs torch.mm
    fp8_tensor    pg.scaled_mm, tensorwise, promoted     vs torch._scaled_mm, tensorwise, promoted
    fp8_row       pg.scaled_mm, rowwise, promoted        vs torch._scaled_mm, rowwise, promoted

Also per row: the achieved read stream (weight + activations + output bytes / time), the config
the dispatcher chose, and the eager host time per call of each (perf_counter over back-to-back
calls, GPU not waited on; the launch path's cost, which graphs remove).

    python benchmarks/bench_decode.py --out benchmarks/results/h200_decode
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

import persistent_gemm as pg
from persistent_gemm.tuning import replay_times
from bench_mm import write_csv

WEIGHTS = [(8192, 8192), (4096, 14336), (28672, 8192)]  # (N, K): the weight is N x K
TOKENS = [1, 8, 16]
OPS = ("mm", "fp8_tensor", "fp8_row")


def operands(op: str, m: int, n: int, k: int, copies: int):
    """``copies`` independent (a, b, scale_a, scale_b); b is the weight as a (K, N) column-major view."""
    out = []
    for i in range(copies):
        g = torch.Generator(device="cuda").manual_seed(1000 * i + m)
        a = torch.randn(m, k, device="cuda", generator=g)
        w = torch.randn(n, k, device="cuda", generator=g)
        if op == "mm":
            out.append((a.bfloat16(), w.bfloat16().t(), None, None))
            continue
        if op == "fp8_tensor":
            sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
        else:
            sa = torch.rand(m, 1, device="cuda", generator=g) + 0.5
            sb = torch.rand(1, n, device="cuda", generator=g) + 0.5
        out.append((a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t(), sa, sb))
    return out


def contenders(op: str, forced=()):
    """ours (the dispatcher's pick), cuBLAS, and each forced config of the op's family."""
    family = "bf16" if op == "mm" else "e4m3"
    forced = [c for c in forced if f"_{family}_" in c]
    if op == "mm":
        fns = {"ours": lambda a, b, sa, sb: pg.mm(a, b), "cublas": lambda a, b, sa, sb: torch.mm(a, b)}
        fns.update({c: (lambda a, b, sa, sb, c=c: pg.mm(a, b, config=c)) for c in forced})
        return fns
    fns = {
        "ours": lambda a, b, sa, sb: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=False),
        "cublas": lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16,
                                                        use_fast_accum=False),
    }
    fns.update({c: (lambda a, b, sa, sb, c=c: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, config=c))
                for c in forced})
    return fns


def host_us(fn, args, calls: int = 300) -> float:
    """Eager host time per call: back-to-back calls, timed on the CPU, the GPU not waited on."""
    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="path prefix: writes <out>.csv and <out>.md")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--inner", type=int, default=20, help="calls per captured graph")
    p.add_argument("--force", default="", help="comma-separated configs also timed, forced (<out>_forced.csv)")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--weights", default=",".join(f"{n}x{k}" for n, k in WEIGHTS), help="NxK,... (the weight is N x K)")
    a = p.parse_args()
    ops = a.ops.split(",")
    forced_names = [c for c in a.force.split(",") if c]
    rows, forced_rows = [], []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for op in ops:
        for n, k in (tuple(map(int, w.split("x"))) for w in a.weights.split(",")):
            for m in map(int, a.tokens.split(",")):
                elem = 2 if op == "mm" else 1
                weight = n * k * elem
                copies = max(2, min(8, math.ceil(2 * l2 / weight) + 1))
                ins = operands(op, m, n, k, copies)
                fns = contenders(op, forced_names)
                calls = [[(lambda f=f, x=x: f(*x)) for x in ins] for f in fns.values()]
                times = replay_times(calls, a.reps, a.inner)
                med = {label: statistics.median(t) for label, t in zip(fns, times)}
                moved = weight + m * k * elem + m * n * 2
                x = ins[0]
                choice = pg.explain(m, n, k, dtype="bf16" if op == "mm" else "e4m3",
                                    scale="none" if op == "mm" else ("tensor" if op == "fp8_tensor" else "row"))
                row = dict(op=op, M=m, N=n, K=k, ours_us=round(med["ours"], 2), cublas_us=round(med["cublas"], 2),
                           speedup=round(med["cublas"] / med["ours"], 3),
                           ours_gbps=round(moved / med["ours"] / 1e3, 1), cublas_gbps=round(moved / med["cublas"] / 1e3, 1),
                           ours_host_us=round(host_us(fns["ours"], x), 1),
                           cublas_host_us=round(host_us(fns["cublas"], x), 1), config=choice.config)
                rows.append(row)
                for label in fns:
                    if label not in ("ours", "cublas"):
                        forced_rows.append(dict(op=op, M=m, N=n, K=k, config=label, us=round(med[label], 2),
                                                gbps=round(moved / med[label] / 1e3, 1),
                                                vs_cublas=round(med["cublas"] / med[label], 3)))
                        print(f"  forced {label}: {med[label]:.2f} us ({forced_rows[-1]['vs_cublas']}x)", flush=True)
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    out = Path(a.out)
    write_csv(f"{out}.csv", rows)
    if forced_rows:
        write_csv(f"{out}_forced.csv", forced_rows)
    lines = [f"# Decode in CUDA-graph replay ({torch.cuda.get_device_name(0)}, torch {torch.__version__})", "",
             "| op | M | N | K | ours us | cuBLAS us | ours / cuBLAS speed | ours GB/s | cuBLAS GB/s | host us ours / cuBLAS | config |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['M']} | {r['N']} | {r['K']} | {r['ours_us']} | {r['cublas_us']} | "
                     f"{r['speedup']:.3f}x | {r['ours_gbps']} | {r['cublas_gbps']} | "
                     f"{r['ours_host_us']} / {r['cublas_host_us']} | `{r['config']}` |")
    for op in ops:
        s = [r["speedup"] for r in rows if r["op"] == op]
        lines.append(f"\n{op}: geometric mean {math.exp(sum(map(math.log, s)) / len(s)):.3f}x, min {min(s):.3f}x")
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
