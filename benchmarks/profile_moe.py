"""Run one MoE expert GEMM contender a few times, for a profiler to catch (ncu, nsys): the same
weights, routing and calls as bench_moe.py (one shape, one token count, input copy 0).

    ncu --kernel-name regex:'sm90_mx_gemv|matmul_ogs' --launch-skip 3 --launch-count 1 --set full \\
        python benchmarks/profile_moe.py --shape gpt-oss-20b-up --tokens 16 --label ours:mxfp4_weight_only

Labels as bench_moe.contenders (torch:bf16, ours:<format>, tk:mxfp4_weight_only). Prints each label
as it finishes, and for ours the config the chooser picks (pg.explain)."""
import argparse

import torch

import bench_moe as bm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="gpt-oss-20b-up")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--label", action="append", required=True, help="repeat for several (each runs --calls times)")
    ap.add_argument("--calls", type=int, default=6)
    args = ap.parse_args()
    ours = sorted({lab.split(":", 1)[1] for lab in args.label if lab.startswith("ours:")})
    tk = bm.load_tk() if any(lab.startswith("tk:") for lab in args.label) else None
    tk = None if isinstance(tk, str) else tk
    # triton_kernels' weight is made from the FP4 one.
    fmts = sorted(set(ours) | ({"mxfp4_weight_only"} if tk is not None else set()))
    (s,) = bm.select_shapes(args.shape)
    w = bm.build_weights(s, fmts, tk, bias=False)
    case = bm.build_case(w, args.tokens, fmts, tk)
    case.copies = case.copies[:1]
    calls = bm.contenders(case, w, fmts, tk)
    rows = case.copies[0]["a"].shape[0]
    for label in args.label:
        (f,) = calls[label]
        for _ in range(args.calls):
            f()
        torch.cuda.synchronize()
        fmt = label.split(":", 1)[1]
        pick = bm.pg.explain(rows, s.n, s.k, dtype=fmt, groups=s.experts).config if label.startswith("ours:") else ""
        print(label, pick, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
