"""Where a gpt-oss MoE layer's time goes, kernel by kernel: the bf16 layer (transformers'
GptOssMLP, experts_implementation="grouped_mm") and its experts swapped by pg.nn.quantize_, built as
bench_moe_layer.py builds them, each run eagerly under torch.profiler (CUPTI kernel records, so
launch gaps are not counted: the sum is GPU time, which CUDA-graph replay also pays). Prints each
kernel's mean time per forward, grouped by name, and the sum.

    python benchmarks/profile_moe_layer.py [--tokens 1,16] [--formats mxfp4_weight_only] [--model gpt-oss-20b]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from bench_moe_layer import LAYER_MODELS, LayerShape, build_layer, load_transformers, make_inputs, swapped

REPS = 20


def kernel_times(fn, reps: int = REPS) -> dict[str, float]:
    """kernel name -> microseconds per call (mean over ``reps`` calls after two warm-ups)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    return {name: t / reps for name, t in total.items()}


def short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--formats", default="mxfp4_weight_only")
    ap.add_argument("--model", default="gpt-oss-20b", choices=sorted(LAYER_MODELS))
    args = ap.parse_args()
    tf = load_transformers()
    if isinstance(tf, str):
        raise SystemExit(f"needs transformers: {tf}")
    s = LayerShape(f"{args.model}-layer", args.model, *LAYER_MODELS[args.model])
    mlp = build_layer(s, tf)
    layers = {"torch:bf16": mlp, **{f"ours:{f}": swapped(mlp, f) for f in args.formats.split(",")}}
    print(f"GPU: {torch.cuda.get_device_name()}; {s.name}, kernel time per forward (us), torch.profiler, eager")
    with torch.no_grad():
        for tokens in (int(t) for t in args.tokens.split(",")):
            x = make_inputs(tokens, s.hidden, copies=1)[0]
            for label, m in layers.items():
                times = kernel_times(lambda: m(x))
                print(f"\n{label} at {tokens} tokens: {sum(times.values()):.1f} us in {len(times)} kernels")
                for name, t in sorted(times.items(), key=lambda kv: -kv[1]):
                    print(f"  {t:8.2f}  {short(name)}")


if __name__ == "__main__":
    main()
