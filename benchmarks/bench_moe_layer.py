"""The whole-layer rows of bench_moe.py (issue 45, its ROW_HOOKS): a gpt-oss MoE layer from router to
output. Shapes gpt-oss-20b-layer (in bench_moe's default --shapes) and gpt-oss-120b-layer (when named;
a model name, --shapes gpt-oss-120b, selects its layer with its up and down), at bench_moe's --tokens in
its modes (graphs=yes up to --graph-max-tokens, eager at --eager-tokens), a row per --formats format.

Layer: transformers' GptOssMLP (GptOssTopKRouter + GptOssExperts) built from GptOssConfig with the
model's dims (20b: hidden = intermediate = 2880, 32 experts, top-4; 120b: 128 experts), every parameter
N(0, 0.02) from a fixed seed (the experts' biases too: transformers' _init_weights zeroes them, a
checkpoint's are not zero), bf16, on the GPU.
  torch  that layer in bf16 as a transformers >= 5 model runs it on CUDA: experts_implementation
         "grouped_mm", what PreTrainedModel picks by default (a bare module has none, and its fallback
         loops over the experts in Python with a host sync per call, so it is set here):
         transformers.integrations.moe.grouped_mm_experts_forward sorts the rows by expert (torch.sort,
         histc), runs gate_up and down as torch.nn.functional.grouped_mm (torch._grouped_mm on a torch
         without it) in bf16, each bias added after, the clamped SwiGLU in bf16 between, and sums the
         top-k in float32. Its time is every row's torch_us.
  ours   the same layer (a copy sharing its tensors), its experts module swapped by
         pg.nn.quantize_(layer, fmt, filter_fn=the experts only) for a pg.nn.GroupedExperts (two
         pg.grouped_mm calls between pg.moe_dispatch, pg.moe_activation and pg.moe_combine: five
         launches of ours, nothing read on the host); the router stays
         torch bf16, as in gpt-oss's MXFP4 checkpoint.
  tk     empty: vLLM's whole triton_kernels MoE layer is not built here (bench_moe times its GEMMs).
Inputs: (1, tokens, hidden) bf16 N(0, 1), COPIES of them rotated call by call, each routed by the router
to its own experts. L2: only at 1 token could what a call reads fit (4 experts of 20b: 53 MB in MXFP4,
the H100's L2 is 50 MB); the copies spread those calls over ~21 of 32 experts (280 MB). From 16 tokens
a call reads most of the layer (20b: 425 MB in MXFP4, 1.6 GB in bf16), past L2 anyway.
Correctness: outputs must be finite bf16 (1, tokens, hidden). --check: copy 0's output against the bf16
layer's (torch's); the largest token row's relative error over LAYER_TOL[format] refuses it (not timed).
--bias does not apply (gpt-oss's experts have biases).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import torch

try:
    import persistent_gemm as pg
except ImportError:  # the pure parts work without the package
    pg = None

#: model -> (experts, top-k, hidden, intermediate): bench_moe.MODELS' gpt-oss rows
LAYER_MODELS = {"gpt-oss-20b": (32, 4, 2880, 2880), "gpt-oss-120b": (128, 4, 2880, 2880)}
#: the layer shapes in bench_moe's default --shapes
DEFAULT = ("gpt-oss-20b-layer",)
#: --check: the largest token row's relative error allowed against the bf16 layer. Measured with this
#: file's layer on the CPU references, hidden = intermediate = 2880, 8 experts, top-4, 128 tokens: bf16
#: 0.007, mxfp8_weight_only 0.051, mxfp8 0.077, mxfp4_weight_only 0.20, fp8_fp4 0.20 (two quantized GEMMs
#: of a random init; a wrong expert, scale or row is off by ~1).
LAYER_TOL = {"bf16": 0.03, "mxfp8_weight_only": 0.12, "mxfp8": 0.15, "mxfp4_weight_only": 0.3, "fp8_fp4": 0.3}
TORCH = "torch:bf16"  # the bf16 layer's label: bench_moe.make_rows' torch time of every format
COPIES, SEED, STD = 8, 45, 0.02
EXPERTS_IMPL = "grouped_mm"


@dataclass(frozen=True)
class LayerShape:
    """A gpt-oss MoE layer; cases() is what bench_moe.run_shape times."""
    name: str
    model: str
    experts: int
    topk: int
    hidden: int
    intermediate: int

    def cases(self, tokens: list, args, refused: list):
        yield from layer_cases(self, tokens, args.formats, args.check, refused)


def shapes() -> dict[str, LayerShape]:
    return {f"{m}-layer": LayerShape(f"{m}-layer", m, *dims) for m, dims in LAYER_MODELS.items()}


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def load_transformers():
    """transformers' GptOssConfig and GptOssMLP (and its version), or why not (a str)."""
    try:
        import transformers
        from transformers import GptOssConfig
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
    except ImportError as e:  # transformers is optional (the 'models' extra)
        return ("transformers is not installed" if getattr(e, "name", None) == "transformers" else
                f"this transformers has no gpt-oss ({first_line(e)})")
    return SimpleNamespace(GptOssConfig=GptOssConfig, GptOssMLP=GptOssMLP, version=transformers.__version__)


def build_layer(s: LayerShape, tf, device="cuda") -> torch.nn.Module:
    """The bf16 GptOssMLP of ``s``'s dims, made on ``device`` without a float32 copy, every parameter
    N(0, STD) from SEED, no autograd (inference: nothing records a graph), experts_implementation set."""
    cfg = tf.GptOssConfig(hidden_size=s.hidden, intermediate_size=s.intermediate, num_local_experts=s.experts,
                          num_experts_per_tok=s.topk)
    cfg._experts_implementation = EXPERTS_IMPL
    with torch.device("meta"):
        mlp = tf.GptOssMLP(cfg)
    mlp = mlp.to(torch.bfloat16).to_empty(device=device).requires_grad_(False).eval()
    g = torch.Generator(device=device).manual_seed(SEED)
    for p in mlp.parameters():
        p.normal_(0.0, STD, generator=g)
    return mlp


def swapped(mlp: torch.nn.Module, fmt: str) -> torch.nn.Module:
    """A copy of ``mlp`` sharing its tensors (no second bf16 copy), its experts swapped by pg.nn.quantize_."""
    if pg is None:
        raise RuntimeError("persistent_gemm is not importable")
    net = copy.deepcopy(mlp, memo={id(t): t for t in [*mlp.parameters(), *mlp.buffers()]})
    pg.nn.quantize_(net, fmt, filter_fn=lambda mod, fqn: fqn == "experts")
    if not isinstance(net.experts, pg.nn.GroupedExperts):
        raise RuntimeError(f"experts not swapped: {type(net.experts).__name__} is not in the form persistent_gemm.moe "
                           "takes (transformers >= 5)")
    return net


def make_inputs(tokens: int, hidden: int, device="cuda", copies: int = COPIES) -> list[torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(SEED + tokens)
    return [torch.randn(1, tokens, hidden, dtype=torch.bfloat16, device=device, generator=g) for _ in range(copies)]


def contenders(layers: dict, xs: list) -> dict:
    """label "role:format" -> [zero-arg call per input copy], each the layer's output (its first result)."""
    return {label: [(lambda m=m, x=x: m(x)[0]) for x in xs] for label, m in layers.items()}


def row_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest relative error of a row (a token's here): a wrong row cannot hide."""
    out, ref = (t.reshape(-1, t.shape[-1]).double() for t in (out, ref))
    return ((out - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-300)).max().item()


def verify(calls: dict, s: LayerShape, tokens: int, check: bool, refused: list) -> None:
    """Refuse (drop, note in ``refused``) a contender whose copy-0 output is no finite bf16 (1, tokens,
    hidden) tensor or, with ``check``, whose largest token row is off the bf16 layer's by over LAYER_TOL."""
    ref = None
    for label in sorted(calls, key=lambda lb: lb != TORCH):  # the reference first
        fmt = label.split(":")[1]
        try:
            out = calls[label][0]()
            if out.is_cuda:
                torch.cuda.synchronize()
            if out.dtype != torch.bfloat16 or tuple(out.shape) != (1, tokens, s.hidden):
                raise RuntimeError(f"returned {tuple(out.shape)} {out.dtype}, expected {(1, tokens, s.hidden)} bf16")
            if not torch.isfinite(out).all():
                raise RuntimeError("non-finite output")
            if label == TORCH:
                ref = out
            elif check:
                if ref is None:
                    raise RuntimeError("no bf16 layer output to check against")
                err, tol = row_error(out, ref), LAYER_TOL[fmt]
                if not err <= tol:
                    raise RuntimeError(f"largest token row error {err:.2e} > {tol:g} against the bf16 layer")
                print(f"  check {label}: largest token row error {err:.1e} against the bf16 layer (<= {tol:g})",
                      flush=True)
        except Exception as e:  # refused; the others go on
            refused.append(f"{s.name} tokens={tokens} {label}: {first_line(e)}")
            print(f"  REFUSED {refused[-1]}", flush=True)
            del calls[label]


def layer_cases(s: LayerShape, tokens: list, formats, check: bool, refused: list, device="cuda"):
    """(tokens, {"role:format": [zero-arg call per input copy]}) per token count, verified; nothing (one
    printed line) without transformers."""
    tf = load_transformers()
    if isinstance(tf, str):
        print(f"{s.name}: skipped: {tf}; pip install '.[models]' (transformers >= 5) for the layer rows", flush=True)
        return
    mm = "torch.nn.functional.grouped_mm" if hasattr(torch.nn.functional, "grouped_mm") else "torch._grouped_mm"
    print(f"{s.name}: transformers {tf.version} GptOssMLP, E={s.experts} top-{s.topk} hidden={s.hidden} "
          f"intermediate={s.intermediate}; torch: experts_implementation={EXPERTS_IMPL!r} ({mm}); ours: its "
          "experts swapped by pg.nn.quantize_", flush=True)
    mlp = build_layer(s, tf, device)
    layers = {TORCH: mlp}
    for fmt in formats:
        try:
            layers[f"ours:{fmt}"] = swapped(mlp, fmt)
        except Exception as e:  # that format's rows have no ours
            refused.append(f"{s.name} ours:{fmt}: quantize_: {first_line(e)}")
            print(f"  REFUSED {refused[-1]}", flush=True)
    for t in tokens:
        calls = contenders(layers, make_inputs(t, s.hidden, device))
        verify(calls, s, t, check, refused)
        yield t, calls
        del calls
        if device == "cuda":
            torch.cuda.empty_cache()
