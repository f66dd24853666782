"""CUDA timing for the MX and Linear benchmarks (bench_mx.py, bench_linear.py): CUDA-event times,
interleaved rounds over input copies, CUDA-graph capture and replay, host microseconds per call,
the device's copy bandwidth."""

from __future__ import annotations

import statistics
import time

import torch

from bench_mm import time_interleaved  # the round-robin over contenders and input copies

#: Calls per host-time measurement (the GPU idle: decode-sized work).
HOST_CALLS = 100

def event_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_events(calls: dict, warmup: int, iters: int) -> dict:
    """Median ms per call, bench_mm.time_interleaved's round-robin (iteration i runs every
    contender once on copy i); ``calls`` maps a contender to one zero-arg call per input copy."""
    if not calls:
        return {}
    copies = [(i,) for i in range(len(next(iter(calls.values()))))]
    return time_interleaved({label: (lambda i, fns=fns: fns[i]()) for label, fns in calls.items()}, copies,
                            warmup, iters)


def capture(fns: list, calls: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # lazy initialization (cuBLAS workspaces, JIT) off the capture
        for j in range(3):
            fns[j % len(fns)]()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fns[j % len(fns)]()
    return graph


def time_graphs(graphs: dict, calls: int, iters: int) -> dict:
    """Median ms per call: interleaved replays of each contender's graph of `calls` calls."""
    for g in list(graphs.values()) * 2:
        g.replay()
    torch.cuda.synchronize()
    times = {label: [] for label in graphs}
    for _ in range(iters):
        for label, g in graphs.items():
            times[label].append(event_ms(g.replay) / calls)
    return {label: statistics.median(t) for label, t in times.items()}


def host_us_per_call(fns: list, calls: int = HOST_CALLS) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for j in range(calls):
        fns[j % len(fns)]()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def bandwidth(nb: int = 2 << 30, iters: int = 20) -> dict:
    """Device copy bandwidth (bytes read + written per second, and the read side alone) and a
    read-only reference (a sum over the same bytes), GB/s."""
    a = torch.zeros(nb, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    out = {}
    for name, fn in (("copy", lambda: b.copy_(a)), ("sum", lambda: a.view(torch.float32).sum())):
        for _ in range(3):
            fn()
        out[name] = statistics.median(event_ms(fn) for _ in range(iters))
    del a, b
    torch.cuda.empty_cache()
    return dict(copy_rw_gbps=2 * nb / out["copy"] / 1e6, copy_read_gbps=nb / out["copy"] / 1e6,
                sum_read_gbps=nb / out["sum"] / 1e6)
