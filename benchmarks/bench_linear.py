"""The per-Linear cost of a swapped module (issue 23): host microseconds per call and GPU time
under CUDA-graph replay, for each persistent_gemm.nn format beside torch's bf16 ``F.linear``, on
one Linear and on a synthetic Llama-shaped block (q, k, v, o, gate, up, down; SiLU gating).

    python benchmarks/bench_linear.py [--d 4096] [--ffn 14336] [--tokens 1,16] [--dtypes bf16,fp16]
                                      [--formats mxfp8,fp8_fp4,...] [--out benchmarks/results/h200_linear.csv]
                                      [--breakdown]

``--breakdown`` only splits one Linear's host µs (M = 1, bf16) into its parts: the whole forward,
the activation quantizer op, the GEMM op on pre-quantized operands, the one-call
``quantized_linear`` op the module uses, beside ``F.linear`` and an empty aten op -- where a
swapped Linear's host time goes.

Eager µs/call: wall time of ``--calls`` back-to-back forwards divided by their count, the queue
drained before and after (at decode sizes the GPU is idle most of that time, so this is the host
cost: quantization, checks, launches). Graph µs/call: the same forwards captured once in a CUDA
graph, replays timed with CUDA events (median of ``--iters``), weights rotated past L2.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

import persistent_gemm as pg
from persistent_gemm import nn as pgnn

from bench_mm import copies_for, write_csv  # L2 rotation, the CSV writer
from gpu_timing import capture, host_us_per_call, time_graphs  # the MX tables' graph and eager timing

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


def breakdown(d: int, calls: int) -> None:
    """Host µs of one swapped Linear's parts at M = 1 (see the module docstring)."""
    ops = torch.ops.persistent_gemm
    x = torch.randn(1, d, device="cuda", dtype=torch.bfloat16)
    lin = torch.nn.Linear(d, d, bias=False).cuda().bfloat16()
    rows = [("F.linear", lambda: F.linear(x, lin.weight)), ("aten.alias (empty op)", lambda: torch.ops.aten.alias(x))]
    for fmt in ("fp8_rowwise", "mxfp8", "fp8_fp4", "mxfp4_weight_only"):
        m = pgnn.quantize_(copy.deepcopy(torch.nn.Sequential(lin)), fmt)[0]
        q, wt, ws = m.qconfig, m.weight_q.t(), m.weight_scale
        if fmt == "fp8_rowwise":
            # (every lambda binds its operands now: a loop variable read later is the last one's)
            quant = lambda: ops.quantize_rowwise_e4m3(x)  # noqa: E731
            xq, xs = quant()
            gemm = lambda xq=xq, xs=xs, wt=wt, ws=ws, q=q: ops.scaled_mm.default(  # noqa: E731
                xq, wt, xs, ws, torch.bfloat16, q.use_fast_accum, None, None)
        elif fmt == "mxfp4_weight_only":
            quant = None
            gemm = lambda wt=wt, ws=ws: ops.weight_only_mm.default(x, wt, ws, torch.bfloat16, "blocked", None, None)  # noqa: E731
        else:
            quant = lambda q=q: ops.quantize_mxfp8.default(x, q.rule)  # noqa: E731
            xq, xs = quant()
            op = ops.mxfp8_mm if fmt == "mxfp8" else ops.fp8_fp4_mm
            gemm = lambda op=op, xq=xq, xs=xs, wt=wt, ws=ws: op.default(  # noqa: E731
                xq, wt, xs, ws, torch.bfloat16, "plain", None, "blocked", None)
        rows += [(f"{fmt}: forward", lambda m=m: m(x)), (f"{fmt}: GEMM op", gemm)]
        if quant is not None:
            fused = lambda m=m, fmt=fmt, q=q: ops.quantized_linear.default(  # noqa: E731
                x, m.weight_q, m.weight_scale, fmt, torch.bfloat16, None, q.rule, q.use_fast_accum, None)
            rows += [(f"{fmt}: quantizer op", quant), (f"{fmt}: quantized_linear op", fused)]
    for mode, ctx in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        with ctx():
            for name, fn in rows:
                for _ in range(20):
                    fn()
                us = min(host_us_per_call([fn], calls) for _ in range(5))
                print(f"breakdown {mode:<14} {name:<32} {us:7.1f} us/call", flush=True)


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
    ap.add_argument("--breakdown", action="store_true", help="only split one Linear's host time into its parts")
    args = ap.parse_args()
    if not pg.extension_available() or not torch.cuda.is_available():
        raise SystemExit("bench_linear.py needs a GPU and persistent_gemm's CUDA kernels")
    if args.breakdown:
        breakdown(args.d, args.calls)
        return 0
    gpu = torch.cuda.get_device_name()
    torch.manual_seed(0)
    rows = []
    for kind in ("linear", "block"):
        base = (torch.nn.Sequential(torch.nn.Linear(args.d, args.d, bias=False)) if kind == "linear"
                else Block(args.d, args.ffn)).cuda()
        copies = copies_for(sum(p.numel() * 2 for p in base.parameters()))  # bf16 weights past 2x L2
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
                            host = host_us_per_call([lambda m=models[0]: m(x)], args.calls)
                            # one graph runs each copy once: no replay reads a weight from L2
                            graph = time_graphs({fmt: capture([lambda m=m: m(x) for m in models], len(models))},
                                                len(models), args.iters)[fmt] * 1e3
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
    write_csv(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
