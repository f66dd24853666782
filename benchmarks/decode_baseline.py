"""bf16 torch.mm at decode shapes and the copy bandwidth, timed as gemv_probe.cu times the MX
decode GEMV (CUDA-graph replay of 20 calls over weights rotated past L2, median), for a same-run
baseline beside the probe when the extension is not built.

    python benchmarks/decode_baseline.py [M,N,K ...]
"""

from __future__ import annotations

import statistics
import sys

import torch


def graph_us(fns, iters=15):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for f in fns[:3]:
            f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(20):
            fns[i % len(fns)]()
    times = []
    for _ in range(iters + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / 20)
    return statistics.median(times[3:])


def main() -> int:
    shapes = [tuple(map(int, s.split(","))) for s in sys.argv[1:]] or [(1, 8192, 8192), (16, 8192, 8192),
                                                                      (1, 28672, 8192)]
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_us([lambda: dst.copy_(src)], iters=5)
    print(f"copy: {2 * src.numel() / us / 1e6:.2f} TB/s read + written")
    del src, dst
    for m, n, k in shapes:
        copies = max(1, (200 << 20) // (n * k * 2) + 1)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t = graph_us([lambda w=w: torch.mm(x, w.t()) for w in ws])
        print(f"torch.mm bf16 {m}x{n}x{k}: {t:.2f} us, {n * k * 2 / t / 1e6:.2f} TB/s of weight")
        del ws
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
