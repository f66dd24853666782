"""A small real transformer for the demo: GPT-2 as MGM (the Microbial General Model) trained it.

The weights ship inside a PyPI package, so nothing is downloaded at run time::

    pip install --no-deps microformer-mgm==0.5.8   # MIT, HUST-NingKang-Lab; --no-deps: its pins are ancient

(or pass the wheel, ``microformer_mgm-0.5.8-py3-none-any.whl``, or its ``pytorch_model.bin``).
The package holds a Hugging Face ``GPT2LMHeadModel`` state dict: 8 layers, d_model 256, 8 heads,
MLP 1024 (gelu, tanh approximation), 512 positions, a vocabulary of 9669 tokens (4 special ones,
then microbial genera such as ``g__Bacteroides``), lm_head tied to the token embedding. A
sequence is ``<bos>`` then the genera of one microbiome sample, most abundant first.

:class:`GPT2` here is our own plain-torch module (``nn.Linear`` everywhere, so
``persistent_gemm.nn.quantize_`` can swap them), :func:`load_mgm` fills it without importing
``mgm`` (which imports transformers) or unpickling anything but tensors and the vocabulary's
strings. :class:`DequantizedLinear` is the reference for a swapped layer: the same quantized
weight and the same quantization of the activations, dequantized and multiplied by torch in
float64, so comparing against it isolates the kernel's own error from the format's.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import math
import os
import pickle
import zipfile
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..quant import MX_BLOCK, dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp8
from ..scale_layout import from_blocked

__all__ = ["MGM_PIP", "ENV_VAR", "BOS", "GPT2Config", "GPT2", "load_mgm", "find_weights", "quantizable",
           "swap", "DequantizedLinear", "dequantized_reference", "sample_sequences", "rel_err", "top1_agreement",
           "Drift", "measure_drift"]

MGM_PIP = "pip install --no-deps microformer-mgm==0.5.8"
MGM_WHEEL = "microformer_mgm-0.5.8-py3-none-any.whl"
#: Where load_mgm looks when no path is given (before the installed package).
ENV_VAR = "PGEMM_DEMO_WEIGHTS"
PAD, MASK, BOS, EOS = 0, 1, 2, 3
#: Ids below this are special tokens; the rest are genera.
FIRST_GENUS = 4
# Members, relative to the mgm package folder (in the wheel: under "mgm/").
_BIN = "resources/general_model/pytorch_model.bin"
_CONFIG = "resources/general_model/config.json"
_VOCAB = "resources/MicroTokenizer.pkl"
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# -- the model ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPT2Config:
    vocab: int = 9669
    positions: int = 512
    d_model: int = 256
    layers: int = 8
    heads: int = 8
    mlp: int = 1024
    eps: float = 1e-5


class Attention(torch.nn.Module):
    """Causal multi-head self-attention: q, k, v from one fused Linear (``c_attn``)."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = torch.nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = torch.nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(d_head), as GPT-2
        return self.c_proj(a.transpose(1, 2).reshape(b, t, d))


class MLP(torch.nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = torch.nn.Linear(cfg.d_model, cfg.mlp)
        self.c_proj = torch.nn.Linear(cfg.mlp, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # HF's "gelu_new"


class Block(torch.nn.Module):
    """Pre-LayerNorm residual block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.attn = Attention(cfg)
        self.ln_2 = torch.nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(torch.nn.Module):
    """GPT-2 language model: token ids ``(batch, T)`` -> next-token logits ``(batch, T, vocab)``.
    Module names follow Hugging Face's (``h.0.attn.c_attn`` ...); ``lm_head`` shares its weight
    with ``wte``. ``vocab`` (token names, or None) is set by :func:`load_mgm`."""

    def __init__(self, cfg: GPT2Config = GPT2Config()) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = torch.nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = torch.nn.Embedding(cfg.positions, cfg.d_model)
        self.h = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = torch.nn.LayerNorm(cfg.d_model, eps=cfg.eps)
        self.lm_head = torch.nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.vocab: Optional[list] = None
        self.source: Optional[str] = None

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final hidden states ``(batch, T, d_model)``, after ``ln_f``."""
        if idx.dim() != 2 or idx.shape[1] > self.cfg.positions:
            raise ValueError(f"idx must be (batch, T) with T <= {self.cfg.positions}, got {tuple(idx.shape)}")
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.hidden(idx))

    def token(self, i: int) -> str:
        return self.vocab[i] if self.vocab is not None else f"<{i}>"


# -- loading --------------------------------------------------------------------------------------
def _how_to() -> str:
    return (f"`{MGM_PIP}` (MIT license; --no-deps because its pinned dependencies are ancient), or pass "
            f"the wheel {MGM_WHEEL} or its pytorch_model.bin (--model-weights PATH, or ${ENV_VAR})")


def _installed_mgm() -> Optional[str]:
    """The folder of the installed ``mgm`` package holding the weights, or None. find_spec of a
    top-level package locates it without importing it (mgm's __init__ imports transformers)."""
    try:
        spec = importlib.util.find_spec("mgm")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if os.path.isfile(os.path.join(loc, _BIN)):
            return loc
    return None


def _checkout_wheel() -> Optional[str]:
    """The wheel in a source checkout's git-ignored ``.whl/`` folder, or None."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".whl", MGM_WHEEL)
    return os.path.normpath(path) if os.path.isfile(path) else None


def find_weights(path: Optional[str] = None) -> str:
    """What :func:`load_mgm` reads: ``path`` (a .whl, a .bin or the mgm package folder), else
    ``$PGEMM_DEMO_WEIGHTS``, else the installed ``mgm`` package, else the wheel in this
    checkout's ``.whl/``. FileNotFoundError saying how to get it when there is none."""
    how = "given"
    if path is None and os.environ.get(ENV_VAR):
        path, how = os.environ[ENV_VAR], f"${ENV_VAR}"
    if path is not None:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"MGM weights: {path!r} ({how}) does not exist; get them with {_how_to()}")
        return path
    found = _installed_mgm() or _checkout_wheel()
    if found is None:
        raise FileNotFoundError(f"MGM weights not found (no path, no ${ENV_VAR}, no installed mgm package); "
                                f"get them with {_how_to()}")
    return found


def _reader(path: str):
    """``read(member) -> bytes or None`` for members named relative to the mgm package."""
    # A wheel is a zip, and so is a torch .bin (torch.save's format): tell them apart by the name.
    if not os.path.isdir(path) and not path.endswith(".bin") and zipfile.is_zipfile(path):
        zf = zipfile.ZipFile(path)
        names = set(zf.namelist())

        def read(member):
            return zf.read("mgm/" + member) if "mgm/" + member in names else None
        if read(_BIN) is None:
            raise FileNotFoundError(f"{path} holds no mgm/{_BIN}: not the microformer-mgm wheel; {_how_to()}")
        return read
    if os.path.isdir(path):
        root = path if os.path.isfile(os.path.join(path, _BIN)) else os.path.join(path, "mgm")
        files = {m: os.path.join(root, m) for m in (_BIN, _CONFIG, _VOCAB)}
    else:  # the .bin itself; config.json beside it, the vocabulary one folder up (the package's layout)
        here = os.path.dirname(os.path.abspath(path))
        files = {_BIN: path, _CONFIG: os.path.join(here, "config.json"),
                 _VOCAB: os.path.join(os.path.dirname(here), "MicroTokenizer.pkl")}
    if not os.path.isfile(files[_BIN]):
        raise FileNotFoundError(f"{path} holds no {_BIN}; {_how_to()}")

    def read(member):
        f = files.get(member)
        if f is None or not os.path.isfile(f):
            return None
        with open(f, "rb") as fh:
            return fh.read()
    return read


class _VocabUnpickler(pickle.Unpickler):
    """Reads MicroTokenizer.pkl (a pickled transformers tokenizer) without transformers: every
    class it names becomes an empty stand-in that keeps its state as a dict, and no real global
    (so no callable) is ever resolved."""

    def find_class(self, module, name):
        return type(name, (), {"__setstate__": lambda self, state: self.__dict__.update(state)})


def _vocab(data: Optional[bytes]) -> Optional[list]:
    if data is None:
        return None
    toks = getattr(_VocabUnpickler(io.BytesIO(data)).load(), "__dict__", {}).get("toks")
    return list(toks) if isinstance(toks, (list, tuple)) and all(isinstance(t, str) for t in toks) else None


def convert_state_dict(sd: dict) -> dict:
    """A Hugging Face GPT2LMHeadModel state dict -> :class:`GPT2`'s: ``transformer.`` dropped,
    Conv1D weights (stored ``(in, out)``) transposed to nn.Linear's ``(out, in)``, the causal-mask
    buffers of old checkpoints dropped."""
    out = {}
    for k, v in sd.items():
        k = k.removeprefix("transformer.")
        if k.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        out[k] = v.t().contiguous() if k.endswith(_CONV1D) else v
    out.setdefault("lm_head.weight", out["wte.weight"])
    return out


def load_mgm(path: Optional[str] = None) -> GPT2:
    """MGM's GPT-2 in float32 on the CPU, in eval mode, ``vocab`` set. ``path``: see
    :func:`find_weights`. A wheel is read with zipfile; tensors with ``weights_only=True``."""
    src = find_weights(path)
    read = _reader(src)
    sd = convert_state_dict(torch.load(io.BytesIO(read(_BIN)), map_location="cpu", weights_only=True))
    hf = json.loads(read(_CONFIG) or b"{}")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"{src}: activation {hf['activation_function']!r}; this GPT2 uses gelu (tanh)")
    vocab, d = sd["wte.weight"].shape
    cfg = GPT2Config(vocab=vocab, positions=sd["wpe.weight"].shape[0], d_model=d,
                     layers=1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h.")),
                     heads=int(hf.get("n_head", 8)), mlp=sd["h.0.mlp.c_fc.weight"].shape[0],
                     eps=float(hf.get("layer_norm_epsilon", 1e-5)))
    model = GPT2(cfg)
    model.load_state_dict(sd, strict=True)
    model.vocab, model.source = _vocab(read(_VOCAB)), src
    return model.eval()


# -- inputs ---------------------------------------------------------------------------------------
@torch.no_grad()
def sample_sequences(model: GPT2, batch: int, length: int, seed: int = 0, top_k: int = 50,
                     temperature: float = 1.0) -> torch.Tensor:
    """``(batch, length)`` token ids on the model's device: ``<bos>`` then genera sampled from the
    model (top-k, a CPU generator seeded with ``seed``), special tokens and repeats excluded, as
    in a real profile. No KV cache: each step reruns the prefix, fine at these sizes."""
    dev = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    idx = torch.full((batch, 1), BOS, dtype=torch.long, device=dev)
    for _ in range(length - 1):
        logits = model.lm_head(model.hidden(idx)[:, -1]).float()
        logits[:, :FIRST_GENUS] = -math.inf
        logits.scatter_(1, idx, -math.inf)
        top, ids = (logits / temperature).topk(top_k, dim=-1)
        pick = torch.multinomial(top.softmax(-1).cpu(), 1, generator=g).to(dev)
        idx = torch.cat([idx, ids.gather(1, pick)], dim=1)
    return idx


# -- swapping and the dequantized-operand reference -----------------------------------------------
def quantizable(module: torch.nn.Module, fqn: str) -> bool:
    """``filter_fn`` of the demo's ``quantize_``: the 32 block Linears (K = 256 or 1024, both
    multiples of 32), not ``lm_head``. The head stays torch in every format: it is the tied
    embedding, conventionally kept in high precision, and its N = 9669 is odd (9669 % 32 != 0)."""
    return fqn != "lm_head"


def swap(model: torch.nn.Module, fmt) -> torch.nn.Module:
    """A copy of ``model`` with its Linears (but lm_head) swapped for persistent_gemm's in ``fmt``."""
    from .. import nn as pgnn

    return pgnn.quantize_(copy.deepcopy(model), fmt, filter_fn=quantizable)


def _rowwise_e4m3(x: torch.Tensor):
    """persistent_gemm.nn's activation quantizer for fp8_rowwise (its own when it has one)."""
    from .. import nn as pgnn

    own = getattr(pgnn, "_rowwise_e4m3", None)
    if own is not None:
        return own(x)
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448.0
    return (x32 / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def _plain(scale: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    blocks = -(-k // MX_BLOCK)
    if scale.dim() == 2 and tuple(scale.shape) == (rows, blocks):
        return scale
    return from_blocked(scale.contiguous().reshape(-1), rows, blocks)


class DequantizedLinear(torch.nn.Module):
    """What a ``persistent_gemm.nn.Linear`` computes, by torch alone: its stored quantized weight
    and the same quantization of the activations it applies (the same functions), both
    dequantized and multiplied in float64, plus the bias (stored bf16, converted to the output
    dtype as the layer converts it), rounded once to the layer's output dtype. Against this, a
    swapped layer shows only the kernel's own error (summation order, output rounding), not the
    format's quantization error."""

    def __init__(self, lin: torch.nn.Module) -> None:
        super().__init__()
        self.lin, self.format = lin, lin.qconfig.format
        n, k = lin.out_features, lin.in_features
        if self.format == "bf16":
            w = lin.weight.detach().double()
        elif self.format == "fp8_rowwise":
            w = lin.weight_q.double() * lin.weight_scale.reshape(n, 1).double()
        else:
            deq = dequantize_mxfp8 if self.format in ("mxfp8", "mxfp8_weight_only") else dequantize_mxfp4
            w = deq(lin.weight_q, _plain(lin.weight_scale, n, k)).double()
        self.register_buffer("weight", w, persistent=False)  # (N, K) float64, dequantized once

    def activations(self, x2: torch.Tensor) -> torch.Tensor:
        """``(M, K)`` activations as the layer quantizes them, dequantized to float64."""
        if self.format == "bf16":
            return x2.to(self.lin.weight.dtype).double()
        if self.format == "fp8_rowwise":
            xq, xs = _rowwise_e4m3(x2)
            return xq.double() * xs.double()
        if self.format.endswith("_weight_only"):  # 16-bit activations as the layer computes them
            return x2.to(x2.dtype if x2.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16).double()
        return dequantize_mxfp8(*quantize_mxfp8(x2, rule=self.lin.qconfig.rule)).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin = self.lin
        compute = lin.weight.dtype if self.format == "bf16" else torch.bfloat16
        if self.format.endswith("_weight_only") and x.dtype == torch.float16:
            compute = torch.float16
        out_dtype = torch.float32 if x.dtype == torch.float32 else compute
        y = self.activations(x.reshape(-1, lin.in_features)) @ self.weight.t()
        if lin.bias is not None:  # the layer hands its bias to the op in the output dtype
            y = y + lin.bias.to(out_dtype).double()
        return y.to(out_dtype).reshape(*x.shape[:-1], lin.out_features)


def dequantized_reference(swapped: torch.nn.Module) -> torch.nn.Module:
    """A copy of a swapped model with each persistent_gemm Linear wrapped in DequantizedLinear."""
    from .. import nn as pgnn

    ref = copy.deepcopy(swapped)
    for _, parent in list(ref.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, pgnn.Linear):
                setattr(parent, name, DequantizedLinear(child))
    return ref


# -- measures -------------------------------------------------------------------------------------
def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ``||out - ref|| / ||ref||``, in float64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def top1_agreement(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Percent of positions whose most likely next token is the same in ``out`` and ``ref``."""
    return 100.0 * (out.argmax(-1) == ref.argmax(-1)).double().mean().item()


@dataclass(frozen=True)
class Drift:
    """One format's drift. Logits: the swapped model against the original. GEMMs: each swapped
    layer's output, on the activations it got in the swapped forward, against the float64 product
    of (a) the original operands (the unquantized weight and activations: quantization + kernel
    error) and (b) its own dequantized operands (the kernel's error alone); per layer, by name."""

    format: str
    err_logits: float   # relative Frobenius error of the logits against the original model
    top1: float         # % of positions whose most likely next token is the original model's
    gemm_err_original: dict     # layer name -> rel. error against the original operands
    gemm_err_dequantized: dict  # layer name -> rel. error against the dequantized operands

    @property
    def worst_original(self) -> float:
        return max(self.gemm_err_original.values())

    @property
    def worst_dequantized(self) -> float:
        return max(self.gemm_err_dequantized.values())


@torch.no_grad()
def measure_drift(model: GPT2, tokens: torch.Tensor, fmt, reference: Optional[torch.Tensor] = None) -> Drift:
    """Swap ``model``'s Linears to ``fmt`` (in a copy) and compare, on ``tokens``, its logits with
    the original model's (``reference``, if already computed) and each swapped GEMM with its two
    float64 references (see :class:`Drift`). Activations stay float32 between the GEMMs (so the
    layers output float32): the numbers are the format's, not bf16 activations'.

    Why the kernel's own error is measured per GEMM and not on the logits: a whole model run on
    dequantized operands drifts from any real kernel by ~1e-2 in the logits, since a 1-ulp
    difference in one output flips a later activation's rounding (or an MX block's shared scale).
    Measured on the CPU: noise of 1e-9 relative on every GEMM output moves MXFP8 logits by 4e-3."""
    from .. import nn as pgnn

    ref = model(tokens) if reference is None else reference
    sw = swap(model, fmt)
    originals = dict(model.named_modules())
    err_o, err_q, hooks = {}, {}, []

    def hook(name, lin):
        orig, deq = originals[name], DequantizedLinear(lin)

        def fn(module, args, out):
            x = args[0]
            exact = F.linear(x.double(), orig.weight.double(), None if orig.bias is None else orig.bias.double())
            err_o[name] = rel_err(out, exact)
            err_q[name] = rel_err(out, deq(x))
        return fn

    for name, mod in sw.named_modules():
        if isinstance(mod, pgnn.Linear):
            hooks.append(mod.register_forward_hook(hook(name, mod)))
    out = sw(tokens)
    for h in hooks:
        h.remove()
    name = fmt if isinstance(fmt, str) else fmt.format
    return Drift(name, rel_err(out, ref), top1_agreement(out, ref), err_o, err_q)
