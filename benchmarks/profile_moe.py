"""Run one MoE expert GEMM contender a few times, for a profiler to catch (ncu, nsys): the same
weights, routing and calls as bench_moe.py (one shape, one token count, input copy 0).

    ncu --kernel-name regex:'sm90_mx_gemv|matmul_ogs' --launch-skip 3 --launch-count 1 --set full \\
        python benchmarks/profile_moe.py --shape gpt-oss-20b-up --tokens 16 --label ours:mxfp4_weight_only

Labels as bench_moe.contenders (torch:bf16, ours:<format>, tk:mxfp4_weight_only); --config forces
ours' kernel. Prints the label and the kernel ours ran."""
import argparse

import torch

import bench_moe as bm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="gpt-oss-20b-up")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--label", action="append", required=True, help="repeat for several (each runs --calls times)")
    ap.add_argument("--config", default=None, help="ours: force this grouped config")
    ap.add_argument("--calls", type=int, default=6)
    args = ap.parse_args()
    fmts = sorted({lab.split(":", 1)[1] for lab in args.label if lab.startswith("ours:")} | {"mxfp4_weight_only"})
    tk = bm.load_tk() if any(lab.startswith("tk:") for lab in args.label) else None
    tk = None if isinstance(tk, str) else tk
    (s,) = bm.select_shapes(args.shape)
    w = bm.build_weights(s, fmts, tk, bias=False)
    case = bm.build_case(w, args.tokens, fmts, tk)
    case.copies = case.copies[:1]
    if args.config:
        orig = bm.pg.grouped_mm
        bm.pg.grouped_mm = lambda *a, **kw: orig(*a, config=args.config, **kw)
    calls = bm.contenders(case, w, fmts, tk)
    for label in args.label:
        (f,) = calls[label]
        for _ in range(args.calls):
            f()
        torch.cuda.synchronize()
        print(label, flush=True)
    c = case.copies[0]
    print("pick:", bm.pg.explain(c["a"].shape[0], s.n, s.k, dtype="bf16xe2m1", groups=s.experts).config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
