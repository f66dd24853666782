"""Linear layers over the persistent_gemm ops, and :func:`quantize_` to swap them into a model.

    import persistent_gemm as pg
    pg.nn.quantize_(model, "mxfp8")                     # every nn.Linear, in place
    pg.nn.quantize_(model, pg.nn.QuantConfig("fp8_fp4", rule="rceil"),
                    filter_fn=lambda mod, fqn: not fqn.endswith("lm_head"))
    model = torch.compile(model, fullgraph=True)        # traces: no graph break

Formats (:data:`FORMATS`):

========== ==================================== ============================================
format     weight, quantized once at swap time  activations, per call
========== ==================================== ============================================
bf16       bf16 (fp16 kept), ``mm``             cast to the weight's dtype; trainable
fp8_rowwise e4m3, one fp32 scale per output row  e4m3, one fp32 scale per token (``scaled_mm``)
mxfp8      e4m3 + e8m0 per 1x32, blocked scales ``quantize_mxfp8`` (``mxfp8_mm``)
fp8_fp4    e2m1 + e8m0 per 1x32, blocked scales ``quantize_mxfp8`` (``fp8_fp4_mm``)
mxfp8_weight_only  as mxfp8                     kept 16-bit (``weight_only_mm``, ``pg.mm(x, w)``)
mxfp4_weight_only  as fp8_fp4                   kept 16-bit (``weight_only_mm``)
========== ==================================== ============================================

The weight-only formats (torchao's ``...WeightOnlyConfig`` idea; how MXFP4 checkpoints such as
gpt-oss are served on Hopper) run fused kernels for bf16 activations on sm90a: the decode GEMV
(up to 64 tokens) and the bf16 route (prefill); nothing is quantized at run time. fp16
activations run the op's exact reference (bf16 cannot hold them).

MoE experts are swapped too, each layer's experts into one :class:`GroupedExperts` (grouped GEMMs
in the formats above but fp8_rowwise): transformers' gpt-oss and Mixtral-style experts, as
:mod:`persistent_gemm.moe` says.

Inputs may have any leading dims (``(..., in_features)``). The output has the input's dtype
(bf16, fp16 or fp32: an fp16 model stays fp16 after the swap), computed in the layer's compute
dtype (bf16 for the quantized formats) and rounded once. ``model.half()``, ``.float()``,
``.to(dtype)`` and ``.to(device)`` after the swap move the quantized buffers to the new device but
never cast them (they are the weight's MX / fp8 bytes); only the bias and a ``bf16``-format
weight follow a cast between 16-bit dtypes. A model on the meta device (``init_empty_weights``-
style loading) cannot be quantized: its weights have no values yet -- materialise it first. The bias goes to the op, which adds it in
the kernel's epilogue (SM90; one rounding). The quantized formats are for inference: an input that
requires grad is refused by the op with a message saying so; ``backward()`` from an output that
nothing requiring grad fed ends in torch's own "does not require grad" (a frozen quantized body
under a head that trains is a normal use: its output must stay a plain tensor). Train with
``"bf16"``, whose backward runs through ``mm`` too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from .kernel_config import KernelConfig
from .moe import GroupedExperts, SparseMoeBlock, swap_moe_
from .quant import _NATIVE_DTYPES, MX_BLOCK, RULES, _rowwise_e4m3_reference, quantize_mxfp4, quantize_mxfp8
from .scale_layout import to_blocked

__all__ = ["FORMATS", "QuantConfig", "Linear", "GroupedExperts", "SparseMoeBlock", "quantize_"]

#: The formats a :class:`Linear` computes in.
FORMATS = ("bf16", "fp8_rowwise", "mxfp8", "fp8_fp4", "mxfp8_weight_only", "mxfp4_weight_only")
#: Weight-only formats: the weight as mxfp8 / fp8_fp4 store it, the activations kept 16-bit.
_WEIGHT_ONLY = {"mxfp8_weight_only": "mxfp8", "mxfp4_weight_only": "fp8_fp4"}
#: format -> (the op it calls, its kernels' dtype family) for a forced config
_FORMAT_OP = {"bf16": ("mm", "bf16"), "fp8_rowwise": ("scaled_mm", "e4m3"), "mxfp8": ("mxfp8_mm", "mxfp8"),
              "fp8_fp4": ("fp8_fp4_mm", "e4m3xe2m1"), "mxfp8_weight_only": ("weight_only_mm", "bf16xe4m3"),
              "mxfp4_weight_only": ("weight_only_mm", "bf16xe2m1")}


@dataclass(frozen=True)
class QuantConfig:
    """How :func:`quantize_` converts each Linear.

    ``format``: one of :data:`FORMATS`. ``rule``: the MX shared-exponent rule of weights and
    activations (``"floor"``, OCP's and this library's default, or ``"rceil"``, the default of
    torchao's MX inference configs). ``use_fast_accum``:
    fp8_rowwise only, ``torch._scaled_mm``'s meaning. ``config``: a kernel forced on every call,
    a canonical name or a :class:`~persistent_gemm.KernelConfig` (kept as its name, as the ops
    resolve either: one that is not built is compiled at its first eager use); ``None``: the
    dispatcher chooses per shape. docs/api.md has examples."""

    format: str = "bf16"
    rule: str = "floor"
    use_fast_accum: bool = False
    config: Union[str, KernelConfig, None] = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            hint = {"nvfp4": ": NVFP4 (e4m3 scales per 16 elements) is not supported; 'fp8_fp4' is MX FP4 weights "
                             "(e8m0 per 32) with MXFP8 activations",
                    "mxfp4": ": MXFP4 weights are 'fp8_fp4' (with MXFP8 activations)",
                    "fp8": ": FP8 with per-row scales is 'fp8_rowwise'"}.get(str(self.format).lower(), "")
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}{hint}")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
        if not isinstance(self.use_fast_accum, bool):
            raise TypeError(f"use_fast_accum must be a bool, got {self.use_fast_accum!r}")
        if self.use_fast_accum and self.format != "fp8_rowwise":
            raise ValueError(f"use_fast_accum applies to format='fp8_rowwise' only, not {self.format!r}")
        if isinstance(self.config, KernelConfig):
            object.__setattr__(self, "config", self.config.name)  # frozen: one spelling, the name
        if self.config is not None and not isinstance(self.config, str):
            raise TypeError(f"config must be a config name (str), a KernelConfig or None, got "
                            f"{type(self.config).__name__}")


def _rowwise_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, K) -> e4m3 data and a (rows, 1) float32 scale: amax per row to 448. This is the
    definition; on CUDA one kernel computes it bit for bit (the quantize_rowwise_e4m3 op)."""
    if _ROWWISE_OP and x.is_cuda and x.dim() == 2 and x.shape[1] > 0 and x.dtype in _NATIVE_DTYPES:
        return torch.ops.persistent_gemm.quantize_rowwise_e4m3(x)
    return _rowwise_e4m3_reference(x)


# nn is imported after the extension registered its ops (persistent_gemm/__init__.py).
_ROWWISE_OP = hasattr(torch.ops.persistent_gemm, "quantize_rowwise_e4m3")


def _quantized_weight(w: torch.Tensor, qconfig: QuantConfig) -> dict:
    """A float (N, K) weight as a quantized format stores it: {"weight_q": ..., "weight_scale": ...}."""
    if qconfig.format == "fp8_rowwise":
        wq, ws = _rowwise_e4m3(w)
        return {"weight_q": wq, "weight_scale": ws.t().contiguous()}  # (N, K) e4m3, (1, N) float32
    mx = _WEIGHT_ONLY.get(qconfig.format, qconfig.format)
    wq, ws = (quantize_mxfp8 if mx == "mxfp8" else quantize_mxfp4)(w, rule=qconfig.rule)
    # (N, K) e4m3 or (N, K/2) packed e2m1; scales blocked once here, so the kernels never relay
    # out the weight's scales per call.
    return {"weight_q": wq, "weight_scale": to_blocked(ws)}


class Linear(torch.nn.Module):
    """``y = x W^T + b`` through one persistent_gemm op. Build it with :meth:`from_linear` (or
    :func:`quantize_`); the weight is converted once, there."""

    def __init__(self, in_features: int, out_features: int, qconfig: QuantConfig, bias: bool = True) -> None:
        super().__init__()
        if not isinstance(qconfig, QuantConfig):
            raise TypeError(f"qconfig must be a QuantConfig, got {type(qconfig).__name__}")
        self.in_features, self.out_features, self.qconfig = int(in_features), int(out_features), qconfig
        #: The layer's name in the model :func:`quantize_` swapped it into (None: built alone); errors say it.
        self.fqn: Optional[str] = None
        if qconfig.format in ("fp8_fp4", "mxfp4_weight_only") and self.in_features % MX_BLOCK:
            raise ValueError(f"format={qconfig.format!r} needs in_features % {MX_BLOCK} == 0 (an e2m1 weight's K rule), "
                             f"got in_features={self.in_features}")
        self.bias = None
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=torch.bfloat16), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, qconfig: Union[QuantConfig, str] = "bf16") -> "Linear":
        """A persistent_gemm Linear computing what ``linear`` computes, in ``qconfig``'s format."""
        if isinstance(qconfig, str):
            qconfig = QuantConfig(qconfig)
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        fmt = qconfig.format
        if w.device.type == "meta" and fmt != "bf16":
            raise ValueError(f"cannot quantize a weight on the meta device to format={fmt!r}: it has no values "
                             "yet. Materialise the model first (load its checkpoint, or model.to_empty(device=...) "
                             "then load_state_dict), then quantize")
        m = cls(linear.in_features, linear.out_features, qconfig, bias=linear.bias is not None)
        if fmt == "bf16":
            dtype = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
            m.weight = torch.nn.Parameter(w.to(dtype), requires_grad=linear.weight.requires_grad)
        else:
            for name, t in _quantized_weight(w, qconfig).items():
                m.register_buffer(name, t)
        if linear.bias is not None:
            b = linear.bias.detach()
            m.bias = torch.nn.Parameter(b.to(torch.bfloat16 if b.dtype == torch.float32 else b.dtype),
                                        requires_grad=fmt == "bf16" and linear.bias.requires_grad)
        return m

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # A float checkpoint (key "weight", what nn.Linear saves) loads into a swapped layer: the
        # weight is quantized here as from_linear does. A swapped checkpoint (weight_q,
        # weight_scale) loads as it is.
        key = prefix + "weight"
        if self.qconfig.format != "bf16" and key in state_dict and prefix + "weight_q" not in state_dict:
            w = state_dict.pop(key)
            if tuple(w.shape) != (self.out_features, self.in_features):
                error_msgs.append(f"size mismatch for {key}: the checkpoint's weight is {tuple(w.shape)}, the layer is "
                                  f"({self.out_features}, {self.in_features})")
                return
            device = self.weight_q.device if getattr(self, "weight_q", None) is not None else w.device
            for name, t in _quantized_weight(w.detach().to(device), self.qconfig).items():
                state_dict[prefix + name] = t
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _out_dtype(self, x: torch.Tensor, compute: torch.dtype) -> torch.dtype:
        return x.dtype if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else compute

    # The quantized bytes (and a bf16-format weight's 16-bit dtype) are what the op reads: a
    # model-wide cast (.half(), .float(), .to(dtype)) must not convert them -- it would turn e4m3
    # codes into fp16 numbers and the next forward would blame `b`. Device moves still apply.
    _QUANTIZED = ("weight_q", "weight_scale")

    def _apply(self, fn, recurse=True):
        # The quantized buffers leave the table while fn runs (a cast such as .float() is not even
        # defined for float4 bytes); they follow the device a probe tensor is sent to.
        keep = {name: self._buffers.pop(name) for name in self._QUANTIZED if self._buffers.get(name) is not None}
        weight = self._parameters.get("weight")
        old = weight.data if weight is not None else None
        try:
            out = super()._apply(fn, recurse)
        finally:
            if keep:
                device = fn(torch.empty(0, device=next(iter(keep.values())).device)).device
                for name, t in keep.items():
                    self._buffers[name] = t.to(device)
        if old is not None and self.weight.dtype not in (torch.bfloat16, torch.float16):
            self.weight.data = old.to(self.weight.device)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The host cost of a swapped Linear is part of what it is for (issue 23): no call here that
        # returns its input (a same-dtype .to, a 2-D reshape), buffers read from their dict.
        k = self.in_features
        if x.shape[-1] != k:
            raise ValueError(f"{self._who()}: input's last dim is {x.shape[-1]}, in_features is {k}")
        if not x.is_floating_point():  # else int64 token ids would be cast silently (bf16) or fail deep in an op
            raise TypeError(f"{self._who()}: the input must be a floating-point tensor (bf16, fp16 or fp32), got "
                            f"{x.dtype}; token ids go through an embedding first")
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, k)
        q, ops, buffers = self.qconfig, torch.ops.persistent_gemm, self._buffers
        fmt, xdtype = q.format, x.dtype
        if fmt in _WEIGHT_ONLY:  # 16-bit activations as they come (fp32 ones computed in bf16)
            compute = xdtype if xdtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        else:
            compute = self._parameters["weight"].dtype if fmt == "bf16" else torch.bfloat16
        out_dtype = self._out_dtype(x, compute)
        bias = self._parameters.get("bias")  # a bias-less layer keeps `bias = None` as a plain attribute
        if bias is not None and bias.dtype != out_dtype:
            bias = bias.to(out_dtype)  # the op takes D's dtype
        # A forced config goes through the ops' own resolution, which JIT-compiles a valid spec at
        # its first eager use (a bare name passed to torch.ops would only be looked up).
        config = None
        if q.config is not None:
            from ._ops import _config

            op_name, family = _FORMAT_OP[fmt]
            if fmt == "bf16" and compute == torch.float16:
                family = "fp16"
            config = _config(q.config, op_name, family, x.device)
        if fmt == "bf16":
            xc = x2 if xdtype == compute else x2.to(compute)
            y = ops.mm.default(xc, self._parameters["weight"].t(), out_dtype, config, bias)
        elif fmt in _WEIGHT_ONLY:
            xc = x2 if xdtype == compute else x2.to(compute)
            y = ops.weight_only_mm.default(xc, buffers["weight_q"].t(), buffers["weight_scale"], out_dtype, "blocked",
                                           config, bias)
        else:
            # fp8_rowwise, mxfp8, fp8_fp4: the activations' quantizer and the GEMM in one op call
            # (issue 23: the host cost per Linear); activations the quantizers do not take (say
            # float64) through the same definition in torch ops.
            if xdtype in _NATIVE_DTYPES:
                run = ops.quantized_linear.default
            else:
                from ._linear_op import composed as run
            y = run(x2, buffers["weight_q"], buffers["weight_scale"], fmt, out_dtype, bias, q.rule, q.use_fast_accum,
                    config)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def _who(self) -> str:
        return (f"persistent_gemm.nn.Linear {self.fqn!r} (format {self.qconfig.format!r})" if self.fqn
                else f"persistent_gemm.nn.Linear (format {self.qconfig.format!r})")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, format={self.qconfig.format!r}"
                + (f", rule={self.qconfig.rule!r}" if self.qconfig.format not in ("bf16", "fp8_rowwise") else ""))


FilterFn = Callable[[torch.nn.Module, str], bool]


def quantize_(model: torch.nn.Module, config: Union[QuantConfig, str] = "bf16",
              filter_fn: Optional[FilterFn] = None) -> torch.nn.Module:
    """Replace, in place, every ``torch.nn.Linear`` of ``model`` for which
    ``filter_fn(module, fully_qualified_name)`` is true (all, by default) with a :class:`Linear`
    in ``config``'s format, and return ``model``. A layer the format cannot take (fp8_fp4 with
    ``in_features % 32``) raises ValueError naming it; exclude it with ``filter_fn``.

    MoE experts go first, each in one module (:class:`GroupedExperts`, two grouped GEMMs per
    call; a ModuleList block becomes a :class:`SparseMoeBlock`): transformers' gpt-oss and
    Mixtral-style experts, asked about with ``filter_fn`` too (persistent_gemm.moe says which
    modules and their state dict). ``config.config`` and ``use_fast_accum`` apply to Linears only."""
    if isinstance(config, str):
        config = QuantConfig(config)
    if not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a QuantConfig or a format name, got {type(config).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.nn.Linear):
        raise TypeError("quantize_ replaces the Linear children of a model in place; for one layer use "
                        "persistent_gemm.nn.Linear.from_linear(linear, config)")
    swapped = swap_moe_(model, config.format, config.rule, filter_fn)
    for fqn, parent in list(model.named_modules()):  # after the MoE swap: a swapped block's Linears are gone
        for name, child in list(parent.named_children()):
            full = f"{fqn}.{name}" if fqn else name
            if type(child) is not torch.nn.Linear or (filter_fn is not None and not filter_fn(child, full)):
                continue
            try:
                swap = Linear.from_linear(child, config)
            except ValueError as e:
                raise ValueError(f"{full}: {e}") from None
            swap.fqn = full
            setattr(parent, name, swap)
            swapped += 1
    if not swapped:
        ours = [m.qconfig.format for m in model.modules() if isinstance(m, Linear)]
        already = (f"; the model already has {len(ours)} persistent_gemm Linear(s) ({', '.join(sorted(set(ours)))}): "
                   "quantize_ swaps torch.nn.Linear only, so swap a fresh copy of the float model" if ours else "")
        warnings.warn(f"persistent_gemm.nn.quantize_: no torch.nn.Linear matched"
                      f"{' the filter_fn' if filter_fn is not None else ''}, nothing was swapped{already}",
                      stacklevel=2)
    return model
