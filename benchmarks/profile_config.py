"""Run one config on one shape a few times, for a profiler to catch (ncu, nsys):

    ncu --launch-skip 3 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/profile_config.py --op mm --shape 1000x3000x5000 --config <name>

Ops as in bench_mm.py (mm: bf16; scaled_mm / scaled_mm_fast: e4m3, tensor scales). A config that
is not built is JIT-compiled first. Prints nothing but the configs' names."""
import argparse

import torch

import persistent_gemm as pg
from bench_mm import make_inputs, peers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="mm", choices=["mm", "scaled_mm", "scaled_mm_fast"])
    ap.add_argument("--shape", required=True, help="MxNxK")
    ap.add_argument("--config", action="append", required=True, help="repeat for several (each runs --calls times)")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    m, n, k = (int(d) for d in args.shape.split("x"))
    pg.precompile(args.config)
    ours = peers(args.op)["ours"]
    inputs = make_inputs(args.op, m, n, k)
    for cfg in args.config:
        for i in range(args.calls):
            ours(*inputs[i % len(inputs)], config=cfg)
        torch.cuda.synchronize()
        print(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
