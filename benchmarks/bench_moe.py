"""MoE expert GEMMs (issue 45): ours against torch._grouped_mm and OpenAI's triton_kernels
matmul_ogs (vLLM's gpt-oss MoE kernel on Hopper), in one process.

Shapes, one projection of an expert layer (up/gate K = hidden -> N = 2 x intermediate, down back):
gpt-oss-20b (E 32, top-4, hidden = intermediate = 2880), gpt-oss-120b (E 128, top-4), deepseek-like
(E 256, top-8, hidden 7168, intermediate 2048). Routing: per token, logits a random permutation of
E distinct values (exact in bf16), softmax, top-k, fixed seed; the tokens x k rows sorted by
expert, stable by token; offs = int32 cumulative row ends (GPU). Up rows: the tokens' activations
gathered (x[order // k]); down rows: random. Same values everywhere (MX quantizes the bf16 weight):
  torch  torch._grouped_mm(a, w, offs=offs), bf16, w (E, K, N) = the (E, N, K) weight transposed;
         every row's torch_us (no MX grouped GEMM on Hopper).
  ours   pg.grouped_mm(a, b, offs): bf16 (b as torch's); mxfp4/mxfp8_weight_only (b =
         pg.prepare_weight of the stacked weight); fp8_fp4, mxfp8 (a = pg.quantize_mxfp8, untimed).
  tk     vLLM 0.33.0's vendored triton_kernels (.whl/), MXFP4 x bf16 (mxfp4_weight_only), set up as
         vLLM's SM90 gpt-oss path (mxfp4_utils.py _swizzle_mxfp4, fused_moe/oracle/mxfp4.py,
         gpt_oss_triton_kernels_moe.py; tk_weight here) with routing from
         triton_kernels.routing.routing(logits, k, sm_first=False) (checked: our rows, our order);
         up: matmul_ogs(x, w, bias, routing_data, gather_indx=gather_indx, precision_config=pc),
         down: matmul_ogs(a, w, bias, routing_data, precision_config=pc). vLLM also fuses SwiGLU /
         the top-k scatter-sum into these calls; not here: all do the same GEMM.
--bias: an (E, N) bias; ours bf16, tk float32 (as vLLM), torch adds bias[row_expert].

Timing, contenders interleaved: graphs=yes (tokens <= --graph-max-tokens): event median of --iters
replays of a CUDA graph of GRAPH_CALLS calls, per call (kernel time); graphs=no: of EAGER_CALLS
back-to-back calls after --warmup (host launch work or kernels, the longer). L2: a call
reads only the experts it touches (1 token of gpt-oss-20b up in MXFP4: 35 MB < 50 MB), so inputs
rotate over copies whose routing renames experts (same row counts, untouched experts while they
last), enough (bench_mm.copies_for) that touched bytes in the smallest format pass 2x L2.

Correctness: outputs must be finite bf16 (R, N). --check: first, copy 0 against float64 of the
contender's own (dequantized) operands; a row relative error > CHECK_TOL refuses it (not timed).
CSV (--out): gpu, shape, tokens, format, graphs, ours_us, torch_us, tk_us, speedup = torch_us /
ours_us, vs_tk = tk_us / ours_us (empty where triton_kernels lacks the format).
Shapes *-layer: a whole gpt-oss MoE layer, transformers' against ours (bench_moe_layer.py).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

import bench_moe_layer  # the whole-layer rows (ROW_HOOKS)
from bench_moe_layer import first_line, row_error

try:
    import persistent_gemm as pg

    from bench_mm import copies_for  # the L2 rotation rule
    from gpu_timing import capture, event_ms, time_graphs
except ImportError:  # --help and the pure helpers work without the package
    pg = None

TK_ROOT = Path(__file__).resolve().parent.parent / ".whl"  # holds triton_kernels (git-ignored)
#: model -> (experts, top-k, hidden, intermediate); --shapes takes a model or one projection (gpt-oss-20b-up)
MODELS = {"gpt-oss-20b": (32, 4, 2880, 2880), "gpt-oss-120b": (128, 4, 2880, 2880),
          "deepseek-like": (256, 8, 7168, 2048)}
TOKENS = (1, 16, 128, 1024, 4096)
FORMATS = ("bf16", "mxfp4_weight_only", "mxfp8_weight_only", "fp8_fp4", "mxfp8")
PREPARE = {"mxfp4_weight_only": "fp4", "fp8_fp4": "fp4", "mxfp8_weight_only": "mxfp8", "mxfp8": "mxfp8"}
FP8_ACTIVATIONS = ("fp8_fp4", "mxfp8")
TK_FORMATS = ("mxfp4_weight_only",)
FIELDS = ["gpu", "shape", "tokens", "format", "graphs", "ours_us", "torch_us", "tk_us", "speedup", "vs_tk"]
GRAPH_CALLS, EAGER_CALLS, GRAPH_MAX_TOKENS = 20, 10, 128
CHECK_TOL = 1e-2
SEED = 45
LOGIT_STEP = 1.0 / 16  # (rank - E/2) / 16 is exact in bf16 for E <= 256
CHUNK_ELEMS = 1 << 27  # weight elements made and quantized at once (bounds the temporaries)
#: Extra shapes: name -> shape whose cases(tokens, args, refused) yields as shape_cases (bench_moe_layer's)
ROW_HOOKS = bench_moe_layer.shapes()
NAN = float("nan")


#: name e.g. gpt-oss-20b-up; gather: up/gate, whose rows are gathered from the tokens' activations
Shape = namedtuple("Shape", "name experts topk n k gather")


def shapes() -> dict[str, Shape]:
    out = {}
    for model, (e, top, hidden, inter) in MODELS.items():
        out[f"{model}-up"] = Shape(f"{model}-up", e, top, 2 * inter, hidden, True)
        out[f"{model}-down"] = Shape(f"{model}-down", e, top, hidden, inter, False)
    return out


def select_shapes(spec: str) -> list:
    """Comma-separated shape names or model names (a model stands for its up, down and layer)."""
    picked, known = [], {**shapes(), **ROW_HOOKS}
    for name in [s for s in spec.split(",") if s]:
        hits = [s for key, s in known.items() if name in (key, key.rsplit("-", 1)[0])]
        if not hits:
            raise ValueError(f"unknown shape {name!r}: not in {list(known)}")
        picked += [s for s in hits if s not in picked]
    return picked


# ---- routing (pure torch, CPU) ----

def route(tokens: int, experts: int, topk: int, seed: int):
    """logits (tokens, E) float32, expert ids (tokens, k) int64, gate weights (tokens, k): each token's
    logits a random permutation of E distinct values; softmax, top-k, renormalized."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.rand(tokens, experts, generator=g).argsort(dim=1).float() - experts // 2) * LOGIT_STEP
    w, ids = logits.softmax(-1).topk(topk, dim=1)
    return logits, ids, w / w.sum(1, keepdim=True)


def sort_rows(ids: torch.Tensor, experts: int):
    """Rows sorted by expert, stable by token: order (R,) into ids.flatten(), counts (E,), offs (E,) int32
    cumulative row ends."""
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=experts)
    return torch.sort(flat, stable=True).indices, counts, counts.cumsum(0).to(torch.int32)


def expert_perms(touched: list[int], experts: int, copies: int, seed: int) -> list[torch.Tensor]:
    """One expert permutation per input copy, the first the identity; copy i >= 1 sends the touched experts
    to the i-th run of a shuffled cycle over the untouched ones (disjoint runs while they last)."""
    g = torch.Generator().manual_seed(seed)
    others = [e for e in range(experts) if e not in set(touched)]
    cycle, t, perms = [others[i] for i in torch.randperm(len(others), generator=g)], len(touched), [torch.arange(experts)]
    for i in range(1, copies):
        pick = [cycle[(j + (i - 1) * t) % len(cycle)] for j in range(t)] if len(cycle) >= t else list(touched)
        perm = torch.empty(experts, dtype=torch.long)
        perm[touched] = torch.tensor(pick, dtype=torch.long)
        perm[others] = torch.tensor([e for e in range(experts) if e not in set(pick)], dtype=torch.long)
        perms.append(perm)
    return perms


def permute_routing(logits: torch.Tensor, ids: torch.Tensor, perm: torch.Tensor):
    """Expert e renamed perm[e]: the logits' columns moved with it, so their top-k is perm[ids]."""
    moved = torch.empty_like(logits)
    moved[:, perm] = logits
    return moved, perm[ids]


# ---- rows and CSV (pure) ----

def make_rows(gpu: str, shape: str, tokens: int, graphs: bool, us: dict, formats, tk_formats=TK_FORMATS) -> list[dict]:
    """Rows of one timing; ``us``: "role:format" ("ours:bf16", "tk:...") -> µs (absent: not timed). A
    format's torch time is its own, else the bf16 one."""
    val = lambda key: us[key] if us.get(key) is not None else NAN
    ratio = lambda a, b: a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else NAN
    rows = []
    for fmt in formats:
        ours, tk = val(f"ours:{fmt}"), val(f"tk:{fmt}")
        torch_us = val(f"torch:{fmt}") if f"torch:{fmt}" in us else val("torch:bf16")
        rows.append(dict(gpu=gpu, shape=shape, tokens=tokens, format=fmt, graphs="yes" if graphs else "no",
                         ours_us=ours, torch_us=torch_us, tk_us=tk, speedup=ratio(torch_us, ours),
                         vs_tk=ratio(tk, ours) if fmt in tk_formats or f"tk:{fmt}" in us else None))
    return rows


def cell(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def write_rows(path, rows: list[dict]) -> None:
    """The CSV, columns exactly FIELDS; µs to 0.01, ratios to 0.001, missing values empty."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows({k: cell(r.get(k), 3 if k in ("speedup", "vs_tk") else 2) for k in FIELDS} for r in rows)


def table(rows: list[dict]) -> str:
    widths = dict(shape=-20, tokens=6, format=-18, graphs=-6, ours_us=9, torch_us=9, tk_us=9, speedup=8, vs_tk=7)
    line = lambda get: " ".join(f"{get(k):{'<' if w < 0 else '>'}{abs(w)}}" for k, w in widths.items())
    return "\n".join([line(str)] + [line(lambda k, r=r: cell(r.get(k), 3 if k in ("speedup", "vs_tk") else 2) or "-")
                                    for r in rows])


# ---- triton_kernels: vLLM's gpt-oss MoE path on SM90 ----

def load_tk():
    """triton_kernels' modules (from .whl/), or why not."""
    if str(TK_ROOT) not in sys.path:
        sys.path.insert(0, str(TK_ROOT))
    try:
        import triton_kernels.matmul_ogs as mo
        import triton_kernels.matmul_ogs_details.opt_flags as opt_flags
        import triton_kernels.numerics as numerics
        import triton_kernels.routing as routing
        import triton_kernels.tensor as tt
        from triton_kernels.tensor_details import layout
    except Exception as e:  # any import failure: no peer
        return f"triton_kernels not importable from {TK_ROOT}: {first_line(e)}"
    return SimpleNamespace(mo=mo, opt_flags=opt_flags, numerics=numerics, routing=routing, tt=tt, layout=layout)


def tk_weight(tk, wq: torch.Tensor, ws: torch.Tensor):
    """vLLM's _swizzle_mxfp4 on SM90 and its PrecisionConfig, for wq (E, N, K/2) e2m1 pairs (low nibble the
    even element: gpt-oss checkpoints' and pg.quantize_mxfp4's order) and ws (E, N, K/32) e8m0."""
    if torch.cuda.get_device_capability() == (9, 0):
        tk.opt_flags.update_opt_flags_constraints({"split_k": 1})
    q, s = wq.view(torch.uint8), ws.view(torch.uint8)
    s = torch.nn.functional.pad(s, (0, -s.shape[-1] % 4))  # vLLM's SM90 patch: scale blocks to a multiple of 4
    q, s = q.transpose(-2, -1), s.transpose(-2, -1)  # K on dim 1
    value_layout, value_opts = tk.layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_opts = tk.layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    w = tk.tt.convert_layout(tk.tt.wrap_torch_tensor(q, dtype=tk.tt.FP4), value_layout, **value_opts)
    scale = tk.tt.convert_layout(tk.tt.wrap_torch_tensor(s), scale_layout, **scale_opts)
    return w, tk.mo.PrecisionConfig(weight_scale=scale, flex_ctx=tk.mo.FlexCtx(rhs_data=tk.numerics.InFlexData()))


# ---- GPU: weights, inputs, contenders ----

@dataclass
class Weights:
    """wb (E, N, K) bf16; q / prepared: "fp4"/"mxfp8" -> (wq, ws) / stacked PreparedWeight; tk: (weight,
    PrecisionConfig); bias (E, N) bf16."""
    shape: Shape
    wb: torch.Tensor
    q: dict = field(default_factory=dict)
    prepared: dict = field(default_factory=dict)
    tk: tuple | None = None
    bias: torch.Tensor | None = None


def build_weights(s: Shape, formats, tk, bias: bool) -> Weights:
    e, n, k = s.experts, s.n, s.k
    w = Weights(s, torch.empty(e, n, k, dtype=torch.bfloat16, device="cuda"))
    u8 = {f: (torch.empty(e, n, k // (2 if f == "fp4" else 1), dtype=torch.uint8, device="cuda"),
              torch.empty(e, n, k // 32, dtype=torch.uint8, device="cuda")) for f in {PREPARE[f] for f in formats if f in PREPARE}}
    g = torch.Generator(device="cuda").manual_seed(SEED + e + n + k)
    step = max(1, CHUNK_ELEMS // (n * k))
    for e0 in range(0, e, step):
        chunk = w.wb[e0:e0 + step]
        chunk.copy_(torch.randn(chunk.shape, device="cuda", generator=g))
        for f, (wq, ws) in u8.items():
            dq, ds = (pg.quantize_mxfp4 if f == "fp4" else pg.quantize_mxfp8)(chunk.reshape(-1, k))
            for dst, src in ((wq, dq), (ws, ds)):
                dst[e0:e0 + step] = src.view(torch.uint8).view(len(chunk), n, -1)
    for f, (wq, ws) in u8.items():
        w.q[f] = wq.view(torch.float4_e2m1fn_x2 if f == "fp4" else torch.float8_e4m3fn), ws.view(torch.float8_e8m0fnu)
        try:
            w.prepared[f] = pg.prepare_weight(*w.q[f], fmt=f)
        except Exception as ex:  # ours is then missing for the formats on it
            print(f"  ours: prepare_weight(fmt={f!r}) of the stacked weight: {first_line(ex)}", flush=True)
    w.tk = tk_weight(tk, *w.q["fp4"]) if tk is not None else None
    w.bias = torch.randn(e, n, device="cuda", generator=g).bfloat16() if bias else None
    return w


def build_case(w: Weights, tokens: int, formats, tk) -> SimpleNamespace:
    """One (shape, tokens): its rows and input copies (dicts of GPU tensors)."""
    s, rows = w.shape, tokens * w.shape.topk
    logits, ids, _ = route(tokens, s.experts, s.topk, SEED * 1000 + tokens)
    touched = torch.nonzero(sort_rows(ids, s.experts)[1]).flatten().tolist()
    small = "fp4" if "fp4" in w.q else "mxfp8" if "mxfp8" in w.q else None
    per_expert = s.n * s.k * {"fp4": 0.5, "mxfp8": 1, None: 2}[small] + (s.n * s.k // 32 if small else 0)
    g = torch.Generator(device="cuda").manual_seed(SEED + tokens)
    copies = []
    for perm in expert_perms(touched, s.experts, copies_for(int(len(touched) * per_expert)), SEED + tokens):
        lg, pid = permute_routing(logits, ids, perm)
        order, counts, offs = sort_rows(pid, s.experts)
        x = torch.randn(tokens if s.gather else rows, s.k, device="cuda", generator=g).bfloat16()
        order = order.cuda()
        c = dict(x=x, a=x[order // s.topk] if s.gather else x, offs=offs.cuda(), order=order,
                 counts=counts.cuda(), row_expert=pid.reshape(-1).cuda()[order])
        if any(f in FP8_ACTIVATIONS for f in formats):
            c["aq"], c["as"] = pg.quantize_mxfp8(c["a"])
        if tk is not None:  # vLLM's call for gpt-oss (renormalize: sm_first=False), bf16 logits
            c["tk"] = tk.routing.routing(lg.cuda().bfloat16(), s.topk, sm_first=False)
        copies.append(c)
    return SimpleNamespace(shape=s, tokens=tokens, copies=copies, rows=rows)


def tk_disagrees(case) -> str | None:
    """Why triton_kernels' routing differs from ours, if it does."""
    for i, c in enumerate(case.copies):
        rd, gi, _ = c["tk"]
        if not torch.equal(rd.expt_hist.long(), c["counts"]):
            return f"copy {i}: triton_kernels.routing's rows per expert differ from ours"
        if not torch.equal(gi.src_indx.long() // case.shape.topk, c["order"] // case.shape.topk):
            return f"copy {i}: triton_kernels.routing orders the rows differently"


def contenders(case, w: Weights, formats, tk) -> dict:
    """label "role:format" -> [zero-arg call per input copy]."""
    wkn = w.wb.transpose(1, 2)  # (E, K, N) column-major: pg.mm's w.t() convention
    per = lambda f: [(lambda c=c: f(c)) for c in case.copies]
    out = {"torch:bf16": per(lambda c: torch._grouped_mm(c["a"], wkn, offs=c["offs"])) if w.bias is None else
           per(lambda c: torch._grouped_mm(c["a"], wkn, offs=c["offs"]).add_(w.bias[c["row_expert"]]))}
    if pg is not None and hasattr(pg, "grouped_mm"):
        kw = dict(out_dtype=torch.bfloat16, **({} if w.bias is None else dict(bias=w.bias)))
        for fmt in formats:
            b = wkn if fmt == "bf16" else w.prepared.get(PREPARE[fmt])
            if b is not None and fmt in FP8_ACTIVATIONS:
                out[f"ours:{fmt}"] = per(lambda c, b=b: pg.grouped_mm(c["aq"], b, c["offs"], scale_a=c["as"], **kw))
            elif b is not None:
                out[f"ours:{fmt}"] = per(lambda c, b=b: pg.grouped_mm(c["a"], b, c["offs"], **kw))
    if w.tk is not None:
        (wt, pc), bias = w.tk, None if w.bias is None else w.bias.float()
        if case.shape.gather:  # vLLM's up/gate call: the kernel gathers the tokens' rows
            out["tk:mxfp4_weight_only"] = per(lambda c: tk.mo.matmul_ogs(
                c["x"], wt, bias, c["tk"][0], gather_indx=c["tk"][1], precision_config=pc))
        else:
            out["tk:mxfp4_weight_only"] = per(lambda c: tk.mo.matmul_ogs(c["a"], wt, bias, c["tk"][0], precision_config=pc))
    return out


def reference(case, w: Weights, fmt: str) -> torch.Tensor:
    """float64 (R, N) of copy 0's operands as ``fmt`` holds them (MX dequantized), per expert."""
    c = case.copies[0]
    a = (pg.dequantize_mxfp8(c["aq"], c["as"]) if fmt in FP8_ACTIVATIONS else c["a"]).double()
    out = torch.zeros(case.rows, case.shape.n, dtype=torch.float64, device="cuda")
    ends = c["offs"].tolist()
    for e, (lo, hi) in enumerate(zip([0] + ends[:-1], ends)):
        if hi > lo:
            if fmt == "bf16":
                we = w.wb[e]
            else:
                wq, ws = w.q[PREPARE[fmt]]
                we = (pg.dequantize_mxfp4 if PREPARE[fmt] == "fp4" else pg.dequantize_mxfp8)(wq[e], ws[e])
            out[lo:hi] = a[lo:hi] @ we.double().t() + (0 if w.bias is None else w.bias[e].double())
    return out


def verify(calls: dict, case, w: Weights, check: bool, refused: list) -> None:
    """Refuse (drop, note in ``refused``) a contender whose copy-0 output is no finite bf16 tensor ((R, N) in
    FORMATS) or, with ``check``, is off its format's float64 reference by more than CHECK_TOL."""
    refs = {}
    for label in list(calls):
        fmt = label.split(":")[1]
        try:
            out = calls[label][0]()
            torch.cuda.synchronize()
            want = (case.rows, case.shape.n) if fmt in FORMATS else None
            if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or want not in (None, tuple(out.shape)):
                raise RuntimeError(f"returned {getattr(out, 'shape', out)} {getattr(out, 'dtype', '')}, expected {want} bf16")
            if not torch.isfinite(out).all():
                raise RuntimeError("non-finite output")
            if check and fmt in FORMATS:
                refs[fmt] = refs[fmt] if fmt in refs else reference(case, w, fmt)
                err = row_error(out, refs[fmt])
                if err > CHECK_TOL:
                    raise RuntimeError(f"largest row error {err:.2e} > {CHECK_TOL:g} against float64")
                print(f"  check {label}: largest row error {err:.1e}", flush=True)
        except Exception as e:  # refused; the others go on
            refused.append(f"{case.shape.name} tokens={case.tokens} {label}: {first_line(e)}")
            print(f"  REFUSED {refused[-1]}", flush=True)
            del calls[label]


def time_bursts(calls: dict, warmup: int, iters: int, burst: int = EAGER_CALLS) -> dict:
    """Median ms per eager call, ``burst`` calls (rotating copies) between two events."""
    for fns in calls.values():
        for j in range(warmup):
            fns[j % len(fns)]()
    torch.cuda.synchronize()
    times = {label: [] for label in calls}
    for _ in range(iters):
        for label, fns in calls.items():
            times[label].append(event_ms(lambda fns=fns: [fns[j % len(fns)]() for j in range(burst)]) / burst)
    return {label: statistics.median(t) for label, t in times.items()}


def time_graph_mode(calls: dict, iters: int) -> dict:
    graphs = {}
    for label, fns in calls.items():
        try:
            graphs[label] = capture(fns, GRAPH_CALLS)
        except Exception as e:  # e.g. a host sync inside the call
            print(f"  {label}: graph capture failed: {first_line(e)}", flush=True)
            torch.cuda.synchronize()
    return time_graphs(graphs, GRAPH_CALLS, iters) if graphs else {}


def modes_for(tokens: int, args) -> list[str]:
    return [m for m in args.modes if (m == "graphs" and tokens <= args.graph_max_tokens)
            or (m == "eager" and tokens in args.eager_tokens)]


def shape_cases(s: Shape, tokens: list, args, tk, refused: list):
    """(tokens, {"role:format": [zero-arg call per copy]}) of one projection, checked."""
    print(f"{s.name}: E={s.experts} top-{s.topk} N={s.n} K={s.k}", flush=True)
    w = build_weights(s, args.formats, tk, args.bias)
    for t in tokens:
        case = build_case(w, t, args.formats, tk)
        calls = contenders(case, w, args.formats, tk)
        if "tk:mxfp4_weight_only" in calls and (why := tk_disagrees(case)):
            refused.append(f"{s.name} tokens={t} tk: {why}")
            print(f"  REFUSED {refused[-1]}", flush=True)
            del calls["tk:mxfp4_weight_only"]
        verify(calls, case, w, args.check, refused)
        yield t, calls
        del case, calls
        torch.cuda.empty_cache()


def run_shape(s, args, tk, gpu: str, refused: list) -> list[dict]:
    """A shape's rows (a ROW_HOOKS shape: of its own cases), each case timed in its modes."""
    rows, tokens = [], [t for t in args.tokens if modes_for(t, args)]
    cases = shape_cases(s, tokens, args, tk, refused) if isinstance(s, Shape) else s.cases(tokens, args, refused)
    for t, calls in cases:
        for mode in modes_for(t, args):
            ms = time_graph_mode(calls, args.iters) if mode == "graphs" else time_bursts(calls, args.warmup, args.iters)
            rows += make_rows(gpu, s.name, t, mode == "graphs", {k: v * 1e3 for k, v in ms.items()}, args.formats)
            print("\n".join(table(rows[-len(args.formats):]).splitlines()[1:]), flush=True)
    return rows


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default, kind in (("out", "benchmarks/results/moe.csv", str),
                                ("shapes", ",".join([*shapes(), *bench_moe_layer.DEFAULT]), str),
                                ("tokens", ",".join(map(str, TOKENS)), str), ("formats", ",".join(FORMATS), str),
                                ("modes", "graphs,eager", str), ("graph-max-tokens", GRAPH_MAX_TOKENS, int),
                                ("eager-tokens", "", str), ("warmup", 5, int), ("iters", 20, int)):
        ap.add_argument(f"--{flag}", default=default, type=kind)
    for flag in ("check", "bias", "no-tk"):
        ap.add_argument(f"--{flag}", action="store_true")
    args = ap.parse_args(argv)
    split = lambda spec: [t for t in spec.split(",") if t]
    try:
        args.shapes, args.tokens = select_shapes(args.shapes), [int(t) for t in split(args.tokens)]
        args.eager_tokens = [int(t) for t in split(args.eager_tokens)] or args.tokens  # default: all
    except ValueError as e:
        ap.error(str(e))
    args.formats, args.modes = split(args.formats), split(args.modes)
    bad = [f for f in args.formats if f not in FORMATS] + [m for m in args.modes if m not in ("graphs", "eager")]
    if bad or args.warmup < 1 or args.iters < 1:
        ap.error(f"unknown {bad} (formats {list(FORMATS)}, modes graphs/eager), or --warmup/--iters < 1")
    return args


def main() -> int:
    args = parse_args()
    if pg is None or not torch.cuda.is_available():
        raise SystemExit("bench_moe.py needs a CUDA GPU and persistent_gemm importable")
    if not (pg.extension_available() and hasattr(pg, "grouped_mm")):
        print("ours: no pg.grouped_mm or no built extension: the peers alone are timed", flush=True)
    tk = load_tk() if not args.no_tk and "mxfp4_weight_only" in args.formats else None  # its one format
    if tk is not None:
        print(f"tk: {tk}; skipped" if isinstance(tk, str) else f"tk: triton_kernels from {tk.mo.__file__}", flush=True)
        tk = None if isinstance(tk, str) else tk
    gpu, refused, rows = torch.cuda.get_device_name(), [], []
    print(table([]), flush=True)
    for s in args.shapes:
        try:
            rows += run_shape(s, args, tk, gpu, refused)
        except torch.cuda.OutOfMemoryError as e:
            print(f"{s.name}: skipped: {first_line(e)}", flush=True)
        torch.cuda.empty_cache()
    if rows:
        write_rows(args.out, rows)
    print(f"\nGPU: {gpu}; {args.out}\n" + table(rows) + "".join(f"\nREFUSED (not timed): {r}" for r in refused))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
