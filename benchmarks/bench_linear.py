"""The per-Linear cost of a swapped module (issue 23): host microseconds per call and GPU time
under CUDA-graph replay, for each persistent_gemm.nn format beside torch's bf16 ``F.linear``, on
one Linear and on a synthetic Llama-shaped block (q, k, v, o, gate, up, down; SiLU gating).

    python benchmarks/bench_linear.py [--d 4096] [--ffn 14336] [--tokens 1,16] [--dtypes bf16,fp16]
                                      [--formats mxfp8,fp8_fp4,...] [--out benchmarks/results/h200_linear.csv]

Eager µs/call: wall time of ``--calls`` back-to-back forwards divided by their count, the queue
drained before and after (at decode sizes the GPU is idle most of that time, so this is the host
cost: quantization, checks, launches). Graph µs/call: the same forwards captured once in a CUDA
graph, replays timed with CUDA events (median of ``--iters``), weights rotated past L2.
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import persistent_gemm as pg
from persistent_gemm import nn as pgnn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Block(torch.nn.Module):
    """The Linear layers of one Llama decoder block, without attention's softmax (GEMMs only)."""

    def __init__(self, d: int, ffn: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(d, ffn, bias=False), torch.nn.Linear(d, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        h = x + self.o(self.q(x) + self.k(x) + self.v(x))
        return h + self.down(F.silu(self.gate(h)) * self.up(h))


def eager_us(fn, x, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(models, x, iters: int) -> float:
    """Median µs per forward of replaying a graph that runs each of ``models`` once (copies of
    one model: their weights together exceed L2, so no replay reads a cached weight)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for m in models:
            m(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for m in models:
            m(x)
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(models))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--formats", default=",".join(f for f in pgnn.FORMATS if f != "bf16"))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/h200_linear.csv")
    args = ap.parse_args()
    if not pg.extension_available() or not torch.cuda.is_available():
        raise SystemExit("bench_linear.py needs a GPU and persistent_gemm's CUDA kernels")
    gpu = torch.cuda.get_device_name()
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for kind in ("linear", "block"):
        base = (torch.nn.Sequential(torch.nn.Linear(args.d, args.d, bias=False)) if kind == "linear"
                else Block(args.d, args.ffn)).cuda()
        wbytes = sum(p.numel() * 2 for p in base.parameters())
        copies = max(2, min(8, -(-2 * l2 // wbytes) + 1))
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            ref = copy.deepcopy(base).to(dtype)
            for fmt in ["torch"] + args.formats.split(","):
                if fmt == "torch":
                    models = [copy.deepcopy(ref) for _ in range(copies)]
                else:
                    try:
                        models = [pgnn.quantize_(copy.deepcopy(base).to(dtype), fmt) for _ in range(copies)]
                    except Exception as e:  # a format the build cannot serve
                        print(f"{kind} {dname} {fmt}: not run: {str(e).splitlines()[0]}", flush=True)
                        continue
                for t in (int(v) for v in args.tokens.split(",")):
                    x = torch.randn(t, args.d, device="cuda", dtype=dtype)
                    try:
                        with torch.no_grad():
                            y, want = models[0](x), ref(x)
                            err = ((y.float() - want.float()).norm() / want.float().norm()).item()
                            host = eager_us(models[0], x, args.calls)
                            graph = graph_us(models, x, args.iters)
                    except Exception as e:
                        print(f"{kind} {dname} {fmt} M={t}: failed: {str(e).splitlines()[0]}", flush=True)
                        torch.cuda.synchronize()
                        continue
                    rows.append(dict(kind=kind, dtype=dname, format=fmt, tokens=t, d=args.d, ffn=args.ffn,
                                     out_dtype=str(y.dtype).replace("torch.", ""), eager_us=host, graph_us=graph,
                                     rel_err_vs_torch=err, gpu=gpu))
                    print(f"{kind:<6} {dname} {fmt:<18} M={t:<4} eager {host:8.1f} us/call  graph {graph:8.1f} us  "
                          f"out {rows[-1]['out_dtype']:<9} err vs torch {err:.1e}", flush=True)
                del models
                torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
