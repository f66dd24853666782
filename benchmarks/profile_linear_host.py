"""Where a swapped model's eager host time goes (issue 23): the demo's real model (MGM's GPT-2) in
bf16, its decode-like forward (64 sequences x 1 token) under torch.profiler, per format beside the
torch model: total CPU time per forward, the ops by self CPU time, and the kernels launched.

    python benchmarks/profile_linear_host.py --model-weights .whl/microformer_mgm-0.5.8-py3-none-any.whl
                                             [--formats bf16,mxfp8] [--rows 12]
"""

from __future__ import annotations

import argparse
import copy

import torch
from torch.profiler import ProfilerActivity, profile

import persistent_gemm as pg
from persistent_gemm.tools import demo_model as dm


@torch.no_grad()
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-weights", default=None)
    ap.add_argument("--formats", default="bf16,fp8_rowwise,mxfp8,mxfp4_weight_only")
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    model = dm.load_mgm(args.model_weights).cuda().bfloat16()
    tokens = torch.randint(dm.FIRST_GENUS, model.cfg.vocab, (64, 1), device="cuda")
    for fmt in ["torch"] + args.formats.split(","):
        net = model if fmt == "torch" else dm.swap(copy.deepcopy(model), fmt)
        for _ in range(5):
            net(tokens)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                net(tokens)
            torch.cuda.synchronize()
        ka = prof.key_averages()
        print(f"\n=== {fmt}: {args.iters} decode forwards (64 x 1 tokens)")
        print(ka.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
