"""The cost model's choices against a committed sweep (bench_mm.py --sweep --kernel-time): a
markdown table of (shape, chosen, best measured, ratio), the check issue 27 asks for
(tests/test_cost_model_choice.py holds the model to the same file).

    python benchmarks/choice_table.py tests/data/h200_issue27_suite_sweep_kernel_time.csv [--sm-count 132]
"""

from __future__ import annotations

import argparse
import csv
import math

from persistent_gemm.explain import choice_table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", help="a bench_mm.py *_sweep.csv")
    ap.add_argument("--sm-count", type=int, default=132, help="SMs of the GPU the sweep ran on")
    args = ap.parse_args()
    with open(args.sweep) as f:
        rows = choice_table(list(csv.DictReader(f)), sm_count=args.sm_count)
    print("| op | M×N×K | chosen | fastest measured | ratio |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['m']}×{r['n']}×{r['k']} | `{r['chosen']}` | `{r['best']}` | {r['ratio']:.3f} |")
    # A pick the sweep did not time (registered after it) has no ratio: counted apart, not in the mean.
    ratios = [r["ratio"] for r in rows if not math.isnan(r["ratio"])]
    print(f"\ngeometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f} over {len(ratios)} timed picks, "
          f"{sum(x > 1.03 for x in ratios)} over 1.03, worst {max(ratios):.3f}; "
          f"{len(rows) - len(ratios)} of {len(rows)} picks not timed by this sweep")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
