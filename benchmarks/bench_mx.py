"""Our MX GEMMs (mxfp8_mm, fp8_fp4_mm) against what a Hopper user runs instead, in one process.

Every contender gets the same values (x (M, K) and w (N, K) quantized once with our
quantize_mxfp8 / quantize_mxfp4) and returns (M, N) bf16:

    ours               pg.mxfp8_mm / pg.fp8_fp4_mm on a pg.prepare_weight'ed weight
    ours_plain         the same op on the plain operands (wq.t(), ws): weight preparation per call
    ours_promote       the same op forced onto the per-32 promotion kernel (the prefill route before
                       the bf16 route), where it is built
    ours_fold          fp8_fp4_mm forced onto the fold route (the weight's scale folded into its
                       e4m3 conversion, one FFMA per element per 32-K block), where it is built
    dequant+mm         our CUDA dequantization of both operands to bf16 (persistent_gemm.dequantize_mx,
                       exact), then torch.mm: the fastest two-step alternative; both steps timed
    emulation          torchao-style: dequantize both operands to bf16 ((q.float() * scale
                       broadcast over each 1x32 block).to(bf16)), then torch.mm; dequant + mm timed
    torch.mm           bf16 torch.mm of the dequantized values (exact in bf16)
    scaled_mm_rowwise  torch._scaled_mm, e4m3 rowwise (fp32 scale_a (M,1), scale_b (1,N),
                       use_fast_accum=False); each row's scale is its largest MX block scale, so
                       the e4m3 values are the MX values, exactly where they stay e4m3-normal
    humming            humming-kernels (JIT, FP4/FP8 weights x e4m3 with 1x32 scales), when it
                       imports (benchmarks/peers/humming_peer.py); --no-humming skips it

Timing. Square and prefill rows: CUDA events around each call, median over --iters after
--warmup calls, contenders interleaved call by call (same clocks for all). Decode rows
(M <= 128): GRAPH_CALLS calls of a contender captured in one CUDA graph, the contenders' replays
interleaved and timed with events, ms = replay / GRAPH_CALLS (a failed capture falls back to
events; the `timing` column says which). Decode rows also give the eager wall time per call
(host_us_per_call: back-to-back eager calls, one synchronize) and the weight stream in GB/s (the
contender's weight bytes incl. scales / ms) beside the copy bandwidth measured in the same run.
Inputs rotate over enough copies that one contender's copies exceed twice the L2.

Correctness. Once per shape every contender's output is compared with the emulation's (relative
Frobenius error); above 5e-2 the row is flagged MISMATCH (a fast wrong kernel is worthless), and
the emulation's dequantization is checked bit-exact against pg.dequantize_mxfp8/mxfp4. A
contender that raises is recorded as NaN, its error printed.

Ratios are speedups: ratio_vs_X = X's ms / this contender's ms (> 1: this one is faster).

    python benchmarks/bench_mx.py [--out benchmarks/results/h200_mx.csv] [--suite quick|full]
                                  [--ops mxfp8_mm,fp8_fp4_mm] [--warmup N] [--iters N] [--no-humming]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

try:
    import persistent_gemm as pg
    from persistent_gemm.quant import E2M1_VALUES

    from bench_mm import copies_for, write_csv  # bench_mm's L2 rotation and CSV
    from gpu_timing import bandwidth, capture, host_us_per_call, time_events, time_graphs  # shared timing
    from mx_emulation import dequant_mxfp4_bf16, dequant_mxfp8_bf16, rowwise_e4m3  # the peers' dequantization
except ImportError:  # --help and the pure helpers work without the package
    pg = None
    E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

SUITE = {
    "square": [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)],
    "prefill": [(4096, 7168, 2048), (8192, 28672, 8192)],
    "decode": [(m, n, 8192) for n in (8192, 28672) for m in (1, 16, 32, 64, 128)],
}
#: --suite decode: issue 21's rows (the MX decode GEMV's range and one past it)
DECODE = {"decode": [(m, 8192, 8192) for m in (1, 16, 32, 64)] + [(1, 28672, 8192), (16, 28672, 8192)]}
#: --suite decode_min: the decode rows a short device session can afford
DECODE_MIN = {"decode": [(1, 8192, 8192), (16, 8192, 8192), (1, 28672, 8192)]}
QUICK = {"square": [(8192, 8192, 8192)], "decode": [(1, 8192, 8192), (16, 8192, 8192)]}
#: --suite prefill: issue 22's rows (the bf16 route's range and the decode/prefill crossover)
PREFILL = {"square": [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)],
           "prefill": [(2048, 8192, 8192), (4096, 7168, 2048), (8192, 28672, 8192)],
           "mid": [(m, 8192, 8192) for m in (128, 256, 512)]}
#: The MX ops, and weight-only MX (weight_only_mm through pg.mm(x, prepared_weight): bf16
#: activations as they come, nothing quantized per call) with an MXFP8 or MXFP4 weight.
OPS = ("mxfp8_mm", "fp8_fp4_mm", "mxfp8_weight_only", "mxfp4_weight_only")
#: --suite weight_only: issue 24's rows (decode targets, the M range where weight bytes dominate, prefill)
WEIGHT_ONLY_SUITE = {"decode": [(1, 8192, 8192), (16, 8192, 8192), (1, 28672, 8192)],
                     "mid": [(m, 8192, 8192) for m in (64, 128, 256, 512)],
                     "square": [(2048, 2048, 2048), (8192, 8192, 8192)], "prefill": [(8192, 28672, 8192)]}
WEIGHT_ONLY = ("mxfp8_weight_only", "mxfp4_weight_only")
EXPLAIN_DTYPE = {"mxfp8_mm": "mxfp8", "fp8_fp4_mm": "e4m3xe2m1", "mxfp8_weight_only": "bf16xe4m3",
                 "mxfp4_weight_only": "bf16xe2m1"}
PREPARE_FMT = {"mxfp8_mm": "mxfp8", "fp8_fp4_mm": "fp4", "mxfp8_weight_only": "mxfp8", "mxfp4_weight_only": "fp4"}
DECODE_MAX_M = 128
GRAPH_CALLS = 20
MISMATCH_TOL = 5e-2
PEERS = ("torch.mm", "dequant+mm", "emulation", "scaled_mm_rowwise", "humming")
#: The promoting prefill config of each op (forced for the ours_promote contender).
PROMOTE_CONFIG = {"mxfp8_mm": "sm90a_mxfp8_128x128x128_c2x1_sw8_row_coop",
                  "fp8_fp4_mm": "sm90a_e4m3xe2m1_128x128x128_c1x2_sw8_row_coop_swapab"}
#: The FP8 x FP4 fold route's config (forced for the ours_fold contender, on the prepared weight).
FOLD_CONFIG = {"fp8_fp4_mm": "sm90a_e4m3xe2m1_128x128x128_c1x2_sw8_row_coop_swapab_fold"}
FIELDS = ["op", "group", "m", "n", "k", "contender", "config", "ms", "tflops", "weight_gbps",
          "ratio_vs_torch_mm", "ratio_vs_emulation", "host_us_per_call", "timing", "rel_err", "gpu"]
NAN = float("nan")


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def ratio(other_ms: float, ms: float) -> float:
    return other_ms / ms if ms > 0 and math.isfinite(ms) and math.isfinite(other_ms) else NAN


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


# ---- one shape ----

def explained(op: str, m: int, n: int, k: int) -> str:
    try:
        return pg.explain(m, n, k, dtype=EXPLAIN_DTYPE[op], out_dtype="bf16").config
    except Exception as e:  # MX dtypes not known to explain yet
        print(f"  explain: {first_line(e)}")
        return "?"


def operands(op: str, m: int, n: int, k: int) -> dict:
    """One copy of every contender's operands, all holding the same values; checks the
    emulation's dequantization against pg.dequantize_* bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(1234 + m + n + k)
    if op in WEIGHT_ONLY:
        return weight_only_operands(op, m, n, k, g)
    xq, xs = pg.quantize_mxfp8(torch.randn(m, k, device="cuda", generator=g))
    w = torch.randn(n, k, device="cuda", generator=g)
    fp4 = op == "fp8_fp4_mm"
    wq, ws = (pg.quantize_mxfp4 if fp4 else pg.quantize_mxfp8)(w)
    del w
    xd = pg.dequantize_mxfp8(xq, xs)
    wd = (pg.dequantize_mxfp4 if fp4 else pg.dequantize_mxfp8)(wq, ws)
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device="cuda")
    xb, wb = xd.bfloat16(), wd.bfloat16()
    emu_w = dequant_mxfp4_bf16(wq, ws, lut) if fp4 else dequant_mxfp8_bf16(wq, ws)
    if not (torch.equal(dequant_mxfp8_bf16(xq, xs), xb) and torch.equal(emu_w, wb)):
        print("  MISMATCH: the emulation's dequantization differs from pg.dequantize_*", flush=True)
    del emu_w
    a8, sa = rowwise_e4m3(xd, xs)
    b8, sb = rowwise_e4m3(wd, ws)
    del xd, wd
    return dict(xq=xq, xs=xs, wq=wq, ws=ws, xb=xb, wb=wb, a8=a8, sa=sa, b8=b8, sb=sb.view(1, n), lut=lut)


def weight_only_operands(op: str, m: int, n: int, k: int, g) -> dict:
    """bf16 activations ("xq", with an empty "xs": no activation scales) and the MX weight."""
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    fp4 = op == "mxfp4_weight_only"
    wq, ws = (pg.quantize_mxfp4 if fp4 else pg.quantize_mxfp8)(torch.randn(n, k, device="cuda", generator=g))
    wb = (pg.dequantize_mxfp4 if fp4 else pg.dequantize_mxfp8)(wq, ws).bfloat16()
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device="cuda")
    emu_w = dequant_mxfp4_bf16(wq, ws, lut) if fp4 else dequant_mxfp8_bf16(wq, ws)
    if not torch.equal(emu_w, wb):
        print("  MISMATCH: the emulation's dequantization differs from pg.dequantize_*", flush=True)
    return dict(xq=x, xs=torch.empty(0, device="cuda"), wq=wq, ws=ws, wb=wb, lut=lut)


def weight_only_contenders(op: str, humming) -> dict:
    """Weight-only: ours (the prepared weight), torch.mm on the bf16 weight, our dequantize kernel
    then torch.mm, torchao's way (dequantize in torch, then torch.mm), humming's bf16-activation
    kernel."""
    mx_w = lambda c: nbytes(c["wq"], c["ws"])
    fp4 = op == "mxfp4_weight_only"

    def ours(c):
        pw = pg.prepare_weight(c["wq"], c["ws"], fmt=PREPARE_FMT[op])
        return lambda: pg.mm(c["xq"], pw)

    def emulation(c):
        if fp4:
            return lambda: torch.mm(c["xq"], dequant_mxfp4_bf16(c["wq"], c["ws"], c["lut"]).t())
        return lambda: torch.mm(c["xq"], dequant_mxfp8_bf16(c["wq"], c["ws"]).t())

    dq = torch.ops.persistent_gemm.dequantize_mx
    out = {"ours": (ours, mx_w),
           "dequant+mm": (lambda c: (lambda: torch.mm(c["xq"], dq(c["wq"], c["ws"]).t())), mx_w),
           "emulation": (emulation, mx_w),
           "torch.mm": (lambda c: (lambda: torch.mm(c["xq"], c["wb"].t())), lambda c: nbytes(c["wb"]))}
    if humming is not None and hasattr(humming, "make_weight_only"):
        out["humming"] = (lambda c: humming.make_weight_only(fp4, c["xq"], c["wq"], c["ws"]), mx_w)
    return out


def forced_contenders(op: str, configs) -> dict:
    """``ours@<config>``: the op on the prepared weight with ``config=`` forced, for each of
    ``configs`` (built or JIT-compiled specs) of the op's family; the schedules a user writes."""
    family = EXPLAIN_DTYPE[op]
    out = {}
    for name in configs:
        if pg.KernelConfig.from_name(name).dtype != family:
            continue

        def make(c, name=name):
            pw = pg.prepare_weight(c["wq"], c["ws"], fmt=PREPARE_FMT[op])
            if op in WEIGHT_ONLY:
                return lambda: pg.mm(c["xq"], pw, config=name)
            return lambda: getattr(pg, op)(c["xq"], pw, c["xs"], out_dtype=torch.bfloat16, config=name)
        out[f"ours@{name}"] = (make, lambda c: nbytes(c["wq"], c["ws"]))
    return out


def contenders(op: str, humming, configs=()) -> dict:
    """label -> (make(copy) -> zero-arg callable, weight bytes of a copy)."""
    if op in WEIGHT_ONLY:
        return {**weight_only_contenders(op, humming), **forced_contenders(op, configs)}
    fn = getattr(pg, op)
    bf16 = torch.bfloat16
    mx_w = lambda c: nbytes(c["wq"], c["ws"])
    prepare = getattr(pg, "prepare_weight", None)
    built = {e["config"] for e in pg._C.built_kernels()}

    def emulation(c):
        if op == "fp8_fp4_mm":
            return lambda: torch.mm(dequant_mxfp8_bf16(c["xq"], c["xs"]), dequant_mxfp4_bf16(c["wq"], c["ws"], c["lut"]).t())
        return lambda: torch.mm(dequant_mxfp8_bf16(c["xq"], c["xs"]), dequant_mxfp8_bf16(c["wq"], c["ws"]).t())

    def ours(c):
        pw = prepare(c["wq"], c["ws"], fmt=PREPARE_FMT[op])
        return lambda: fn(c["xq"], pw, c["xs"], out_dtype=bf16)

    plain = lambda c: (lambda: fn(c["xq"], c["wq"].t(), c["xs"], c["ws"], out_dtype=bf16))
    out = {"ours": (ours, mx_w)} if prepare is not None else {"ours": (plain, mx_w)}
    if prepare is not None:
        out["ours_plain"] = (plain, mx_w)
    if PROMOTE_CONFIG[op] in built:
        out["ours_promote"] = (lambda c: (lambda: fn(c["xq"], c["wq"].t(), c["xs"], c["ws"], out_dtype=bf16,
                                                     config=PROMOTE_CONFIG[op])), mx_w)
    if FOLD_CONFIG.get(op) in built and prepare is not None:
        def fold(c):
            pw = prepare(c["wq"], c["ws"], fmt=PREPARE_FMT[op])
            return lambda: fn(c["xq"], pw, c["xs"], out_dtype=bf16, config=FOLD_CONFIG[op])
        out["ours_fold"] = (fold, mx_w)
    dq = getattr(torch.ops.persistent_gemm, "dequantize_mx", None)
    if dq is not None:
        out["dequant+mm"] = (lambda c: (lambda: torch.mm(dq(c["xq"], c["xs"]), dq(c["wq"], c["ws"]).t())), mx_w)
    out["emulation"] = (emulation, mx_w)
    out["torch.mm"] = (lambda c: (lambda: torch.mm(c["xb"], c["wb"].t())), lambda c: nbytes(c["wb"]))
    out["scaled_mm_rowwise"] = (
        lambda c: (lambda: torch._scaled_mm(c["a8"], c["b8"].t(), c["sa"], c["sb"], out_dtype=bf16,
                                            use_fast_accum=False)),
        lambda c: nbytes(c["b8"], c["sb"]))
    if humming is not None:
        out["humming"] = (lambda c: humming.make(op, c["xq"], c["xs"], c["wq"], c["ws"]), mx_w)
    out.update(forced_contenders(op, configs))
    return out


def run_shape(op: str, group: str, m: int, n: int, k: int, args, humming, gpu: str) -> list[dict]:
    base = operands(op, m, n, k)
    ncopies = copies_for(nbytes(base["xq"], base["xs"], base["wq"], base["ws"]))
    copies = [base] + [{key: t.clone() for key, t in base.items()} for _ in range(ncopies - 1)]
    decode = m <= DECODE_MAX_M
    picked = explained(op, m, n, k)
    calls, wbytes, errors, errs = {}, {}, {}, {}
    for label, (make, wb) in contenders(op, humming, args.configs).items():
        try:
            fns = [make(c) for c in copies]
            if any(f is None for f in fns):
                continue
            calls[label], wbytes[label] = fns, wb(base)
        except Exception as e:
            errors[label] = first_line(e)
    # Verify once (copy 0) against the emulation; a contender that raises is dropped.
    ref = None
    for label in sorted(calls, key=lambda lb: lb != "emulation"):
        try:
            out = calls[label][0]()
            torch.cuda.synchronize()
            if tuple(out.shape) != (m, n) or out.dtype != torch.bfloat16:
                raise RuntimeError(f"returned {tuple(out.shape)} {out.dtype}, expected ({m}, {n}) bfloat16")
            ref = out if label == "emulation" else ref
            errs[label] = rel_err(out, ref) if ref is not None else NAN
        except Exception as e:
            errors[label] = first_line(e)
            del calls[label]
    del ref
    for label, msg in errors.items():
        print(f"  {label}: {msg}", flush=True)
    timing = {label: "events" for label in calls}
    host = {}
    if decode:
        graphs = {}
        for label, fns in calls.items():
            try:
                graphs[label] = capture(fns, GRAPH_CALLS)
                timing[label] = "graph"
            except Exception as e:
                print(f"  {label}: graph capture failed ({first_line(e)}); timed eagerly with events")
                torch.cuda.synchronize()
        ms = time_graphs(graphs, GRAPH_CALLS, args.iters)
        eager = {label: fns for label, fns in calls.items() if label not in graphs}
        ms.update(time_events(eager, args.warmup, args.iters) if eager else {})
        del graphs
        host = {label: host_us_per_call(fns) for label, fns in calls.items()}
    else:
        ms = time_events(calls, args.warmup, args.iters)
    for label in errors:
        ms[label] = NAN
    flops, rows = 2.0 * m * n * k, []
    t_mm, t_emu = ms.get("torch.mm", NAN), ms.get("emulation", NAN)
    for label, t in ms.items():
        err = errs.get(label, NAN)
        rows.append(dict(op=op, group=group, m=m, n=n, k=k, contender=label,
                         config=label[5:] if label.startswith("ours@") else picked if label.startswith("ours") else "", ms=t, tflops=flops / t / 1e9,
                         weight_gbps=wbytes.get(label, 0) / t / 1e6 if decode else NAN,
                         ratio_vs_torch_mm=ratio(t_mm, t), ratio_vs_emulation=ratio(t_emu, t),
                         host_us_per_call=host.get(label, NAN), timing=timing.get(label, "error"), rel_err=err, gpu=gpu))
        flag = "  MISMATCH" if err > MISMATCH_TOL else ""
        print(f"{op:<10} {m:>5}x{n:>5}x{k:>5} {label:<17} {t * 1e3:9.1f} us {rows[-1]['tflops']:7.1f} TFLOP/s"
              + (f" {rows[-1]['weight_gbps']:7.0f} GB/s host {rows[-1]['host_us_per_call']:6.1f} us" if decode else "")
              + f"  x{rows[-1]['ratio_vs_torch_mm']:.2f} vs torch.mm  err {err:.1e}{flag}", flush=True)
    del calls, copies, base
    torch.cuda.empty_cache()
    return rows


def summary(rows: list[dict], bw: dict, gpu: str, args) -> str:
    lines = [f"GPU: {gpu}. Non-decode rows: medians of {args.iters} CUDA-event timings per call after "
             f"{args.warmup} warm-up calls, contenders interleaved call by call; decode rows (M <= {DECODE_MAX_M}): "
             f"interleaved replays of CUDA graphs of {GRAPH_CALLS} calls each. Inputs rotated past 2x L2; bf16 output.",
             "",
             f"Device bandwidth this run: copy {bw['copy_rw_gbps']:.0f} GB/s counting bytes read + written "
             f"({bw['copy_read_gbps']:.0f} GB/s read side alone); read-only sum {bw['sum_read_gbps']:.0f} GB/s. "
             "Weight GB/s = the contender's weight bytes incl. scales / time (read only); in brackets as a "
             "share of the copy's read + written figure.",
             "",
             "Ratios are speedups of ours: peer ms / our ms (> 1: ours faster). ours = prepared weight; "
             "ours_plain = the same op on the plain operands.",
             "",
             "| op | group | M×N×K | our kernel | ours µs | TFLOP/s | weight GB/s | host µs/call | ours/torch.mm "
             "| ours/dequant+mm | ours/emulation | ours/scaled_mm_rowwise | ours/humming | ours_plain µs | max rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f, unit="": "n/a" if not math.isfinite(v) else format(v, f) + unit
    pct = lambda v: f" ({100 * v / bw['copy_rw_gbps']:.0f}%)" if math.isfinite(v) else ""
    bad, speedups = [], {}
    for key in dict.fromkeys((r["op"], r["group"], r["m"], r["n"], r["k"]) for r in rows):
        by = {r["contender"]: r for r in rows if (r["op"], r["group"], r["m"], r["n"], r["k"]) == key}
        ours, shape = by.get("ours"), "×".join(map(str, key[2:]))
        if ours is None:
            continue
        sp = {p: ratio(by[p]["ms"], ours["ms"]) if p in by else NAN for p in PEERS}
        for p, v in sp.items():
            if math.isfinite(v):
                speedups.setdefault((key[0], p), []).append(v)
        errs = {c: r["rel_err"] for c, r in by.items() if math.isfinite(r["rel_err"])}
        bad += [f"{key[0]} {shape} {c}: rel err {e:.2e}" for c, e in errs.items() if e > MISMATCH_TOL]
        worst = max(errs.values(), default=NAN)
        plain = by["ours_plain"]["ms"] * 1e3 if "ours_plain" in by else NAN
        lines.append(f"| {key[0]} | {key[1]} | {shape} | `{ours['config']}` | {fmt(ours['ms'] * 1e3, '.1f')} | "
                     f"{fmt(ours['tflops'], '.1f')} | {fmt(ours['weight_gbps'], '.0f')}{pct(ours['weight_gbps'])} | "
                     f"{fmt(ours['host_us_per_call'], '.1f')} | " + " | ".join(fmt(sp[p], ".2f", "×") for p in PEERS)
                     + f" | {fmt(plain, '.1f')} | {fmt(worst, '.1e')}{' MISMATCH' if worst > MISMATCH_TOL else ''} |")
    for (op, peer), sp in speedups.items():
        gm = math.exp(sum(map(math.log, sp)) / len(sp))
        lines.append(f"\n**{op}** vs {peer}: geometric mean speedup {gm:.3f}× over {len(sp)} shapes "
                     f"(min {min(sp):.2f}×, max {max(sp):.2f}×)")
    if bad:
        lines += ["", "**MISMATCH** (relative Frobenius error against the emulation above "
                  f"{MISMATCH_TOL:g}):", ""] + [f"- {b}" for b in bad]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/h200_mx.csv", help="CSV path (<out>.md is written beside it)")
    ap.add_argument("--suite", choices=["quick", "decode", "decode_min", "prefill", "weight_only", "full"], default="full")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {list(OPS)}")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-humming", action="store_true", help="skip the humming peer even when it imports")
    ap.add_argument("--configs", default="", help="comma-separated config names timed as ours@<name> beside the "
                    "dispatcher's choice, each on the ops of its family (compiled up front by the JIT if not built)")
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        ap.error(f"--ops: unknown {unknown}; choose from {list(OPS)}")
    if args.warmup < 1 or args.iters < 1:
        ap.error("--warmup and --iters must be at least 1")
    if pg is None or not pg.extension_available():
        raise SystemExit("bench_mx.py needs persistent_gemm built with its CUDA kernels (scripts/setup_and_demo.sh)")
    if args.configs:  # compile the forced schedules in parallel before any timing; drop failures
        from persistent_gemm.jit import ensure_many

        done = ensure_many(args.configs, jobs=len(args.configs))
        for name, r in zip(list(args.configs), done):
            if isinstance(r, Exception):
                print(f"--configs {name}: not timed: {first_line(r)}", flush=True)
                args.configs.remove(name)
    humming = None
    if not args.no_humming:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
        import humming_peer

        humming = humming_peer if humming_peer.available() else None
        print(f"humming peer: {'on' if humming else 'not importable, skipped'}")
    out = Path(args.out)
    csv_path = out if out.suffix == ".csv" else out.with_name(out.name + ".csv")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    bw = bandwidth()
    print(f"bandwidth: copy {bw['copy_rw_gbps']:.0f} GB/s read+written ({bw['copy_read_gbps']:.0f} read side), "
          f"read-only sum {bw['sum_read_gbps']:.0f} GB/s", flush=True)
    suite = {"full": SUITE, "decode": DECODE, "decode_min": DECODE_MIN, "prefill": PREFILL,
             "weight_only": WEIGHT_ONLY_SUITE}.get(args.suite, QUICK)
    rows = []
    for op in ops:
        for group, shapes in suite.items():
            for m, n, k in shapes:
                try:
                    rows += run_shape(op, group, m, n, k, args, humming, gpu)
                except Exception as e:  # e.g. out of memory building the operands: keep the other rows
                    print(f"{op} {m}x{n}x{k}: shape skipped: {first_line(e)}", flush=True)
                    torch.cuda.empty_cache()
    if not rows:
        print("no rows")
        return 1
    write_csv(csv_path, rows, FIELDS)
    md = summary(rows, bw, gpu, args)
    csv_path.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
