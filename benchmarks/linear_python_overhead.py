"""The Python share of a swapped Linear's host cost (issue 23), on any device: a tiny (1 x 64)
bf16 Linear's forward against the op it calls, timed directly, per format (mean wall time of
many calls under inference_mode after a warm-up). The difference is the module's own lines.

    python benchmarks/linear_python_overhead.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import time

import torch

import persistent_gemm as pg


def us_per_call(fn, calls: int) -> float:
    for _ in range(200):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def the_op(lin: pg.nn.Linear, x: torch.Tensor):
    """The op call the module's forward makes for ``x`` (2-D, bf16), with its operands bound."""
    ops, q, out = torch.ops.persistent_gemm, lin.qconfig, torch.bfloat16
    if q.format == "bf16":
        w = lin.weight.t()
        return lambda: ops.mm.default(x, w, out, None, lin.bias)
    if q.format.endswith("_weight_only"):
        w = lin.weight_q.t()
        return lambda: ops.weight_only_mm.default(x, w, lin.weight_scale, out, "blocked", None, lin.bias)
    return lambda: ops.quantized_linear.default(x, lin.weight_q, lin.weight_scale, q.format, out, lin.bias, q.rule,
                                                q.use_fast_accum, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        for fmt in ("bf16", "mxfp8_weight_only", "mxfp8"):
            lin = pg.nn.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 64)), fmt)[0].to(torch.bfloat16)
            fwd, op = us_per_call(lambda: lin(x), args.calls), us_per_call(the_op(lin, x), args.calls)
            print(f"{fmt:20s} forward {fwd:6.1f} us  op {op:6.1f} us  python {fwd - op:5.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
