"""FP8 accuracy of scaled_mm against float64, ours and torch._scaled_mm, in both accumulation modes.

Same inputs for all four contenders (e4m3 operands from randn, tensorwise or rowwise scales),
fp32 output so the output rounding does not hide the accumulation error; relative Frobenius
error of each against the float64 product of the dequantized operands. Writes a CSV and a
markdown table.

    python benchmarks/accuracy_scaled_mm.py --out benchmarks/results/h200_scaled_mm_accuracy
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import persistent_gemm as pg
from bench_mm import write_csv

KS = (4096, 8192, 16384, 28672)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/scaled_mm_accuracy")
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    # "ours fast" forces the first built fast-accumulation config: with use_fast_accum=True the
    # dispatcher may still pick a promoting kernel (it is allowed to), which would hide the mode.
    built = {k["config"] for k in pg._C.built_kernels() if k["fast_accum"]}
    fast_cfg = next((c.name for c in pg.CATALOGUE if c.name in built), None)
    if fast_cfg is None:
        ap.error("no fast-accumulation e4m3 config is built")
    rows = []
    for k in KS:
        for scale in ("tensor", "row"):
            errs: dict[str, list[float]] = {}
            for seed in range(args.seeds):
                g = torch.Generator(device="cuda").manual_seed(seed)
                a = torch.randn(args.m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
                b = torch.randn(args.n, k, device="cuda", generator=g).to(torch.float8_e4m3fn).t()
                if scale == "tensor":
                    sa = torch.rand((), device="cuda", generator=g) + 0.5
                    sb = torch.rand((), device="cuda", generator=g) + 0.5
                else:
                    sa = torch.rand(args.m, 1, device="cuda", generator=g) + 0.5
                    sb = torch.rand(1, args.n, device="cuda", generator=g) + 0.5
                ref = (a.double() @ b.double()) * sa.double() * sb.double()
                runs = {
                    "ours_promoted": lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32),
                    "ours_fast": lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, use_fast_accum=True,
                                                      config=fast_cfg),
                    "torch_promoted": lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32),
                    "torch_fast": lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32,
                                                           use_fast_accum=True),
                }
                for label, fn in runs.items():
                    errs.setdefault(label, []).append(rel_err(fn(), ref))
            row = dict(m=args.m, n=args.n, k=k, scale=scale, fast_config=fast_cfg,
                       **{label: max(v) for label, v in errs.items()})
            rows.append(row)
            print(" ".join(f"{key}={val:.3e}" if isinstance(val, float) else f"{key}={val}"
                           for key, val in row.items()), flush=True)
    out = Path(args.out)
    write_csv(out.with_suffix(".csv"), rows)
    lines = [f"GPU: {torch.cuda.get_device_name()}; fp32 output, relative Frobenius error vs float64, "
             f"worst of {args.seeds} seeds, M = {args.m}, N = {args.n}", "",
             "| K | scales | ours promoted | torch promoted | ours fast | torch fast | our fast kernel |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['scale']} | {r['ours_promoted']:.2e} | {r['torch_promoted']:.2e} | "
                     f"{r['ours_fast']:.2e} | {r['torch_fast']:.2e} | `{r['fast_config']}` |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
