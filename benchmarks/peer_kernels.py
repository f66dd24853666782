"""Which kernels the peer (cuBLAS through torch) launches for a shape, with grid, block and time.

    python benchmarks/peer_kernels.py --shapes 257x4096x4096,1000x3000x5000 [--op mm|scaled_mm|scaled_mm_fast]

A cuBLAS kernel's name spells its tile, cluster and K-splitting ("segment_k", "splitK"), which
is the schedule our dispatcher competes with on that shape (issue 27). Prints one line per kernel.
"""
import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile


def peer_call(op: str, m: int, n: int, k: int):
    if op == "mm":
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        return lambda: torch.mm(a, b)
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    fast = op == "scaled_mm_fast"
    return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=fast)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True, help="comma-separated MxNxK")
    ap.add_argument("--op", default="mm", choices=["mm", "scaled_mm", "scaled_mm_fast"])
    ap.add_argument("--plain", action="store_true", help="just call the peer 8 times (for ncu; no profiler)")
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        call = peer_call(args.op, m, n, k)
        try:
            for _ in range(5):
                call()
        except RuntimeError as e:  # e.g. torch._scaled_mm refuses K % 16 != 0
            print(f"{args.op} {shape} refused by the peer: {str(e).splitlines()[0]}")
            continue
        torch.cuda.synchronize()
        if args.plain:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
        events = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
        for e in events[-len(events) // 3:]:  # the last call's kernels
            a = e.get("args", {})
            print(f"{args.op} {shape} {e['dur']:.1f}us grid={a.get('grid')} block={a.get('block')} "
                  f"smem={a.get('shared memory')} regs={a.get('registers per thread')} {e['name'][:200]}")


if __name__ == "__main__":
    main()
