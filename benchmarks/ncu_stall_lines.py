"""The SASS lines with the most warp stall samples in an ncu source-page CSV
(``ncu --import R --page source --csv --print-source sass``), with each line's top stall reasons;
read by ``gpu_session.sh ncu_stalls``.

    python benchmarks/ncu_stall_lines.py report.sass.csv [top]
"""
import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(path, newline="") as f:
        lines = [row for row in csv.reader(f)]
    head = next((i for i, r in enumerate(lines) if any("Warp Stall Sampling (All Samples)" in c for c in r)), None)
    if head is None:
        print(f"{path}: no 'Warp Stall Sampling (All Samples)' column (ncu wrote: {' | '.join(lines[0])[:300] if lines else 'nothing'})")
        return 1
    cols = lines[head]
    total_col = next(i for i, c in enumerate(cols) if "Warp Stall Sampling (All Samples)" in c)
    src_col = next((i for i, c in enumerate(cols) if c.strip() in ("Source", "# Source")), 1)
    # Per-reason columns (ncu names them stall_<reason>, each with a "(Not Issued)" twin): the
    # issued-and-not-issued sample counts, not the twins or the totals.
    reason_cols = [i for i, c in enumerate(cols) if i != total_col and (c.startswith("stall_") or "Stall" in c)
                   and "Not Issued" not in c and "Not-issued" not in c and "All Samples" not in c]
    rows = [r for r in lines[head + 1:] if len(r) == len(cols)]
    total = sum(number(r[total_col]) for r in rows) or 1.0
    print(f"{len(rows)} SASS lines, {total:.0f} stall samples")
    for r in sorted(rows, key=lambda r: -number(r[total_col]))[:top]:
        reasons = sorted(((number(r[i]), cols[i]) for i in reason_cols), reverse=True)[:3]
        why = ", ".join(f"{name} {v:.0f}" for v, name in reasons if v > 0)
        print(f"{number(r[total_col]) / total:6.1%}  {r[src_col].strip()[:70]:<70}  {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
