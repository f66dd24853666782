"""The main job: run every op once and check it against a float64 reference, then a real model.

``python -m persistent_gemm demo`` runs on the GPU when there is one with kernels built for it,
and otherwise says so and runs the CPU references, which define the ops' semantics. Its second
half swaps the Linears of a small real transformer (GPT-2 from MGM, :mod:`persistent_gemm.tools.demo_model`;
weights from ``pip install --no-deps microformer-mgm==0.5.8``) to each format and prints the
drift from the original model and, on a GPU, the speed; without the weights it says how to get
them and skips. Its third half is a MoE model: a small gpt-oss built at random from transformers'
own config class (``pip install '.[models]'``; without transformers it says so and skips), its
experts swapped to :class:`persistent_gemm.nn.GroupedExperts` in each format.
"""

from __future__ import annotations

import copy
import os
import pickle
import statistics
import time
from typing import Optional

import torch

import persistent_gemm as pg
from persistent_gemm.archs import by_capability


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _device() -> tuple[str, str]:
    if not torch.cuda.is_available():
        return "cpu", "no CUDA GPU visible: running the CPU reference implementations"
    major, minor = torch.cuda.get_device_capability()
    spec = by_capability(major, minor)
    arch = spec.name if spec else None
    name = torch.cuda.get_device_name()
    if arch is None or arch not in pg.built_archs():
        return "cpu", f"{name} (sm_{major}{minor}) has no kernels in this build: running the CPU references"
    return "cuda", f"{name} ({arch})"


def _time(fn, device: str) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main(model_weights: Optional[str] = None, model: bool = True, moe: Optional[bool] = None) -> int:
    """Run the ops, then (``model``) the real model, its weights from ``model_weights`` or found
    (see :func:`persistent_gemm.tools.demo_model.find_weights`), then (``moe``, by default as
    ``model``) the MoE model. 1 when a check fails."""
    pg.require_extension()
    device, note = _device()
    print(f"persistent_gemm {pg.__version__}: {note}")
    m, n, k = (4096, 4096, 4096) if device == "cuda" else (256, 384, 512)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    a16, b16 = x.to(torch.bfloat16).to(device), w.to(torch.bfloat16).to(device).t()
    a8, b8 = x.to(torch.float8_e4m3fn).to(device), w.to(torch.float8_e4m3fn).to(device).t()
    one = torch.ones((), device=device)
    xq, xs = pg.quantize_mxfp8(x.to(device))
    wq8, ws8 = pg.quantize_mxfp8(w.to(device))
    wq4, ws4 = pg.quantize_mxfp4(w.to(device))
    deq_x = pg.dequantize_mxfp8(xq, xs).double()
    deq_w8, deq_w4 = pg.dequantize_mxfp8(wq8, ws8).double().t(), pg.dequantize_mxfp4(wq4, ws4).double().t()
    # Weight-only: bf16 activations times a prepared MX weight (torch.ops.persistent_gemm.weight_only_mm).
    pw8, pw4 = pg.prepare_weight(wq8, ws8, fmt="mxfp8"), pg.prepare_weight(wq4, ws4, fmt="fp4")
    runs = [
        ("mm bf16", lambda: pg.mm(a16, b16), a16.double() @ b16.double()),
        ("scaled_mm e4m3", lambda: pg.scaled_mm(a8, b8, one, one), a8.double() @ b8.double()),
        ("mxfp8_mm", lambda: pg.mxfp8_mm(xq, wq8.t(), xs, ws8), deq_x @ deq_w8),
        ("fp8_fp4_mm", lambda: pg.fp8_fp4_mm(xq, wq4.t(), xs, ws4), deq_x @ deq_w4),
        ("mm(x, pw) mxfp8", lambda: pg.mm(a16, pw8), a16.double() @ deq_w8),
        ("mm(x, pw) mxfp4", lambda: pg.mm(a16, pw4), a16.double() @ deq_w4),
    ]
    failed = 0
    # The references multiply each op's own (already quantized) operands in float64: this is the
    # kernel's error alone; the model table below adds the quantization's.
    print("  each op against float64 of its own quantized operands (the kernel's error, not the quantization's):")
    for name, fn, ref in runs:
        try:
            ms = _time(fn, device)
            err = _rel(fn(), ref)
        except RuntimeError as e:  # an op with no kernel for this GPU says so; report it
            print(f"  {name:<16} {m}x{n}x{k}: not available here: {str(e).splitlines()[0]}")
            continue
        ok = err < 1e-2
        failed += not ok
        print(f"  {name:<16} {m}x{n}x{k} on {device}: rel. error {err:.2e} "
              f"[{'ok' if ok else 'FAIL'}], {ms:.2f} ms")
    if model:
        failed += real_model(device, model_weights)
    if model if moe is None else moe:
        failed += moe_model(device)
    return 1 if failed else 0


# -- the second half: a real model ------------------------------------------------------------------
MODEL_TITLE = "real model: GPT-2 (MGM, 8 layers, d=256) from microformer-mgm"
#: A swapped GEMM's worst relative error against its own dequantized operands in float64 above
#: this is a FAIL: fp32 accumulation over K <= 1024 and an fp32 output are off by ~1e-6.
GEMM_TOL = 1e-2


def _cuda_ms(fn, warmup: int = 5, iters: int = 20) -> float:
    """Median CUDA-event time of ``fn()`` in ms, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@torch.no_grad()
def real_model(device: str, weights: Optional[str] = None) -> int:
    """The demo's second half: MGM's GPT-2 with its block Linears swapped by
    ``persistent_gemm.nn.quantize_`` to each format. Returns the number of failed checks (0
    when the weights are not there: it says how to get them and skips)."""
    from . import demo_model as dm

    print(f"\n{MODEL_TITLE}")
    given = weights is not None or bool(os.environ.get(dm.ENV_VAR))
    try:
        model = dm.load_mgm(weights)
    except FileNotFoundError as e:  # a path the user gave is an error; no weights at all, a skip
        print(f"  {'error' if given else 'skipped'}: {e}")
        return int(given)
    except Exception as e:  # noqa: BLE001 -- a corrupt or foreign file: say which, not torch.load's advice
        # (torch's UnpicklingError text advises weights_only=False, i.e. running the file's code)
        why = ("not a torch checkpoint, or a damaged one" if isinstance(e, pickle.UnpicklingError)
               else str(e).splitlines()[0] if str(e) else "")
        print(f"  error: MGM weights {weights or os.environ.get(dm.ENV_VAR)!r} could not be read "
              f"({type(e).__name__}: {why})")
        return 1  # main() returns 1 and the command exits 1, as for a missing path
    model = model.to(device)
    cuda = device == "cuda"
    batch, length = (64, 128) if cuda else (4, 64)
    tokens = dm.sample_sequences(model, batch, length, seed=0)
    ref = model(tokens)
    example = ", ".join(model.token(int(i)) for i in tokens[0, :4])
    print(f"  weights: {model.source}")
    print(f"  inputs: {batch} sequences x {length} tokens sampled from the model (top-50, seed 0) after <bos>, "
          f"e.g. {example}, ...")
    print("  swapped: the 32 block Linears (c_attn, attn c_proj, c_fc, mlp c_proj; K = 256 or 1024); lm_head "
          "(tied to wte, N = 9669, not a multiple of 32) stays torch in every format")
    print(f"  {'format':<17} | logits vs original    | {'worst GEMM: rel. err vs':<29}")
    print(f"  {'':<17} | rel. err  top-1 agree | original op.  dequantized op.")
    yard = copy.deepcopy(model).bfloat16()(tokens)
    print(f"  {'torch bf16':<17} | {dm.rel_err(yard, ref):.2e}  {dm.top1_agreement(yard, ref):>10.2f}% | "
          f"{'-':>12}  {'-':>15}")
    failed = 0
    for fmt in pg.nn.FORMATS:
        try:
            d = dm.measure_drift(model, tokens, fmt, reference=ref)
        except (RuntimeError, ValueError) as e:  # a format with no kernel here (or not built) says so
            print(f"  {fmt:<17} | not available here: {str(e).splitlines()[0]}")
            continue
        ok = d.worst_dequantized < GEMM_TOL
        failed += not ok
        print(f"  {fmt:<17} | {d.err_logits:.2e}  {d.top1:>10.2f}% | {d.worst_original:>12.2e}  "
              f"{d.worst_dequantized:>10.1e} {'ok' if ok else 'FAIL':>4}")
    print("  rel. err: relative Frobenius error. logits: the swapped model (activations fp32 between the GEMMs) "
          "against the original fp32 model, i.e. quantization + kernel error; top-1 agree: % of positions whose "
          "most likely next genus is the original's.")
    print("  worst GEMM: the largest over the 32 swapped GEMMs, each on the activations it got in the swapped "
          "forward, against the float64 product of the original operands (quantization + kernel) and of its own "
          f"dequantized operands (same quantized weight and activations: the kernel's error alone; ok < {GEMM_TOL:g}).")
    return failed + _half_models(model, tokens, ref, cuda)


def _half_models(model, tokens: torch.Tensor, ref: torch.Tensor, cuda: bool) -> int:
    """The model as it is served: cast whole to bf16 or fp16, then swapped. Each swapped model must
    answer in its own dtype with finite logits; on a GPU, its prefill and decode time beside the
    torch model in the same dtype. Returns the number of failed checks."""
    from . import demo_model as dm

    print("\n  the model cast to bf16 / fp16, then swapped (activations in that dtype between the GEMMs):")
    head = f"  {'dtype format':<23} | out dtype | logits rel. err  top-1"
    if cuda:
        g = torch.Generator().manual_seed(1)
        prefill = torch.randint(dm.FIRST_GENUS, model.cfg.vocab, (128, 256), generator=g).to(tokens.device)
        decode = torch.randint(dm.FIRST_GENUS, model.cfg.vocab, (64, 1), generator=g).to(tokens.device)
        head += " | prefill 128x256 ms: swapped / torch | decode 64x1 ms: swapped / torch"
    print(head)
    failed = 0
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        base = copy.deepcopy(model).to(dtype)
        if cuda:
            torch_ms = (_cuda_ms(lambda: base(prefill)), _cuda_ms(lambda: base(decode)))
        for fmt in ("torch",) + pg.nn.FORMATS:
            try:
                net = base if fmt == "torch" else dm.swap(base, fmt)
                out = net(tokens)
            except (RuntimeError, ValueError) as e:
                print(f"  {tag + ' ' + fmt:<23} | not available here: {str(e).splitlines()[0]}")
                continue
            ok = out.dtype == dtype and bool(torch.isfinite(out).all())
            failed += not ok
            line = (f"  {tag + ' ' + fmt:<23} | {str(out.dtype).replace('torch.', ''):<9} | "
                    f"{dm.rel_err(out, ref):.2e}  {dm.top1_agreement(out, ref):>10.2f}%")
            if cuda:
                ms = (_cuda_ms(lambda: net(prefill)), _cuda_ms(lambda: net(decode)))
                line += (f" | {ms[0]:>8.3f} / {torch_ms[0]:.3f} ({ms[0] / torch_ms[0]:.2f}x)"
                         f"      | {ms[1]:>8.3f} / {torch_ms[1]:.3f} ({ms[1] / torch_ms[1]:.2f}x)")
            print(f"{line} {'ok' if ok else 'FAIL'}")
    print("  ok: the output is in the model's dtype and finite. logits against the original fp32 model.")
    if cuda:
        print("  speed: CUDA-event median of 20 forwards after 5 warm-ups (eager, no graphs); at d=256 the GEMMs "
              "are tiny, so the forward is launch-bound, and lm_head (torch in both) is a large share of it.")
    else:
        print("  speed: measured on a GPU only.")
    return failed


# -- the third half: a MoE model --------------------------------------------------------------------
#: The MoE model: gpt-oss's architecture (attention sinks, clamped SwiGLU experts with biases), small.
MOE_CONFIG = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=256, num_local_experts=8,
                  num_experts_per_tok=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024)
MOE_TITLE = (f"MoE model: gpt-oss (transformers' GptOssForCausalLM, random init, seed 0): "
             f"{MOE_CONFIG['num_hidden_layers']} layers, d={MOE_CONFIG['hidden_size']}, "
             f"{MOE_CONFIG['num_local_experts']} experts of I={MOE_CONFIG['intermediate_size']}, "
             f"top-{MOE_CONFIG['num_experts_per_tok']}, vocab {MOE_CONFIG['vocab_size']}")


def _experts_f64(ge, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """GroupedExperts ``ge``'s output in float64 from its own operands: its dequantized weights and
    biases, each GEMM's activations rounded as it rounds them (MXFP8 in mxfp8 / fp8_fp4, else bf16:
    the model is bf16, so every format computes in bf16), the gate/up output rounded to bf16."""
    def operand(t: torch.Tensor) -> torch.Tensor:
        if ge.fmt in ("mxfp8", "fp8_fp4"):
            return pg.dequantize_mxfp8(*pg.quantize_mxfp8(t.float(), rule=ge.rule)).double()
        return t.to(torch.bfloat16).double()

    gate_up, down = (w.double() for w in ge.dequantize())
    e, d = ge.num_experts, ge.hidden_size
    gu_bias, dn_bias = ((b.double() if b is not None else torch.zeros(e, n, dtype=torch.float64, device=x.device))
                        for b, n in ((ge.gate_up_bias, 2 * ge.intermediate_size), (ge.down_bias, d)))
    xs, out = operand(x), torch.zeros(x.shape[0], d, dtype=torch.float64, device=x.device)
    for i in range(e):
        tok, slot = (indices == i).nonzero(as_tuple=True)
        h = (xs[tok] @ gate_up[i].t() + gu_bias[i]).to(torch.bfloat16).double()
        gate, up = h.chunk(2, dim=-1)
        if ge.activation == "gpt_oss":
            gate, up = gate.clamp(max=ge.limit), up.clamp(min=-ge.limit, max=ge.limit)
            act = (up + 1) * gate * torch.sigmoid(gate * ge.alpha)
        else:
            act = torch.nn.functional.silu(gate) * up
        y = operand(act) @ down[i].t() + dn_bias[i]
        out.index_add_(0, tok, weights[tok, slot].double().unsqueeze(1) * y)
    return out


@torch.no_grad()
def moe_model(device: str) -> int:
    """The demo's third half: a small gpt-oss from transformers' own config class, random weights,
    cast to bf16 (the reference), then its experts swapped by ``persistent_gemm.nn.quantize_`` to
    each format of :class:`persistent_gemm.nn.GroupedExperts`. Returns the number of failed checks
    (0 without transformers: it says so and skips)."""
    from ..moe import FORMATS as MOE_FORMATS
    from . import demo_model as dm

    print(f"\n{MOE_TITLE}")
    try:
        import transformers
        from transformers import GptOssConfig, GptOssForCausalLM
    except ImportError as e:  # transformers is optional (the 'models' extra)
        why = ("transformers is not installed" if getattr(e, "name", None) == "transformers" else
               f"this transformers has no gpt-oss ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        print(f"  skipped: {why}; pip install '.[models]' (transformers >= 5) for this part")
        return 0
    with torch.random.fork_rng(devices=[]):  # the model's random init, seeded without touching the caller's RNG
        torch.manual_seed(0)
        model = GptOssForCausalLM(GptOssConfig(**MOE_CONFIG)).eval()
    cuda = device == "cuda"
    bf16 = model.to(device=device, dtype=torch.bfloat16)
    f64 = copy.deepcopy(bf16).double()  # the bf16 model's own weights, computed in float64
    f64.config._experts_implementation = "eager"  # transformers' grouped_mm takes 16/32-bit floats only
    batch, length = (64, 128) if cuda else (4, 64)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, MOE_CONFIG["vocab_size"], (batch, length), generator=g).to(device)
    ref, exact = bf16(tokens).logits, f64(tokens).logits
    layers = MOE_CONFIG["num_hidden_layers"]
    print(f"  inputs: {batch} sequences x {length} random token ids (seed 0). reference: the model in bf16, as "
          f"transformers {transformers.__version__} runs it (experts: {bf16.config._experts_implementation})")
    print(f"  swapped: pg.nn.quantize_(model, format, filter_fn=MoE modules only): each layer's GptOssExperts -> "
          f"one GroupedExperts (2 grouped GEMMs); attention, router and lm_head stay torch bf16, as in gpt-oss's "
          f"MXFP4 checkpoint")
    print(f"  {'format':<17} | logits rel. err vs  | top-1 agree | experts vs float64"
          + (" | ms / forward (torch / it)" if cuda else ""))
    print(f"  {'':<17} | bf16 model  float64 | vs bf16     | of own operands")
    line = f"  {'torch bf16':<17} | {'-':>10}  {dm.rel_err(ref, exact):.2e} | {'-':>11} | {'-':>10}     "
    if cuda:
        torch_ms = _cuda_ms(lambda: bf16(tokens))
        line += f" | {torch_ms:>8.3f}"
    print(line.rstrip())
    failed = 0
    for fmt in MOE_FORMATS:
        net = copy.deepcopy(bf16)
        seen = []  # each GroupedExperts' (inputs, output) in the swapped forward
        try:
            pg.nn.quantize_(net, fmt, filter_fn=lambda mod, fqn: not isinstance(mod, torch.nn.Linear))
            experts = [m for m in net.modules() if isinstance(m, pg.nn.GroupedExperts)]
            if len(experts) != layers:  # transformers 4.x's experts hold another form
                print(f"  {fmt:<17} | not swapped: {len(experts)} of {layers} experts modules are in the form "
                      f"persistent_gemm.moe takes (transformers >= 5)")
                failed += 1
                continue
            hooks = [m.register_forward_hook(lambda m, args, out: seen.append((m, args, out))) for m in experts]
            out = net(tokens).logits
            for h in hooks:
                h.remove()
        except (RuntimeError, ValueError) as e:  # a format with no kernel here (or not built) says so
            print(f"  {fmt:<17} | not available here: {str(e).splitlines()[0]}")
            continue
        worst = max(dm.rel_err(o, _experts_f64(m, *args)) for m, args, o in seen)
        ok = worst < GEMM_TOL and out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
        failed += not ok
        line = (f"  {fmt:<17} | {dm.rel_err(out, ref):>10.2e}  {dm.rel_err(out, exact):.2e} | "
                f"{dm.top1_agreement(out, ref):>10.2f}% | {worst:>10.1e} {'ok' if ok else 'FAIL':>4}")
        if cuda:
            ms = _cuda_ms(lambda: net(tokens))
            line += f" | {ms:>8.3f} ({torch_ms / ms:.2f}x)"
        print(line)
    print("  logits: the swapped model against the bf16 model (quantization + kernels) and against the bf16 "
          "model's weights in float64; top-1 agree: % of positions whose most likely next token is the bf16 "
          "model's.")
    print(f"  experts: the worst of the {layers} GroupedExperts, each on the activations it got in the swapped "
          "forward, against float64 of its own dequantized weights and rounded activations (the kernels' error "
          f"alone; ok < {GEMM_TOL:g}, bf16 outputs and finite logits).")
    if cuda:
        print("  speed: CUDA-event median of 20 forwards after 5 warm-ups (eager, no graphs); (x): the torch bf16 "
              "model's time over the swapped model's (above 1: faster).")
    else:
        print("  time per forward: CPU reference: timing not meaningful (measured on a GPU only).")
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
