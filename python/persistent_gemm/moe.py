"""Mixture-of-experts layers over grouped GEMMs: a layer's experts run as two grouped GEMM calls
(gate/up, then down) whatever the routing, sorted by expert on the device: no host sync, so a
forward captures in a CUDA graph and ``torch.compile(fullgraph=True)`` traces it.

    pg.nn.quantize_(model, "mxfp4_weight_only")   # the MoE experts are swapped with the Linears
    pg.nn.GroupedExperts.from_mxfp4_blocks(...)   # gpt-oss's MXFP4 checkpoint tensors as they are

What :func:`persistent_gemm.nn.quantize_` swaps (:func:`swap_moe_`; ``filter_fn(module, fqn)`` is
asked about these modules as about each Linear):

* transformers >= 5 experts modules (``@use_experts_implementation``: ``GptOssExperts``,
  ``MixtralExperts``, ...) computing gpt-oss's clamped SwiGLU or SiLU(gate) * up: each becomes a
  :class:`GroupedExperts`, called as they are, ``(hidden_states, router_indices,
  routing_weights)``; the router and the MLP around it stay. Other gates are left, with a warning.
* transformers-4-style sparse MoE blocks of a ``gate`` router Linear and an ``experts`` ModuleList
  of SiLU-gated MLPs (``w1``/``w3``/``w2`` as Mixtral's, or ``gate_proj``/``up_proj``/``down_proj``)
  and nothing else: the block's forward loops over the list, so the block becomes a
  :class:`SparseMoeBlock`. A block with more (a shared expert) is left; its Linears swap one by one.

The formats are pg.nn's but ``fp8_rowwise`` (:data:`FORMATS`; under fp8_rowwise MoE modules are
left): weights quantized once at the swap, activations MXFP8 per call (``mxfp8``, ``fp8_fp4``) or
kept 16-bit. A GroupedExperts of E experts, hidden size D and intermediate size I keeps each
weight as nn.Linear does, (out, in) per expert, rows 0:I of ``gate_up`` the gate projection and
I:2I the up projection (gpt-oss's interleaved columns are reordered at the swap). State dict:
``gate_up_weight`` (E, 2I, D) and ``down_weight`` (E, D, I), bf16 (fp16 kept), in format bf16; in
the MX formats the stacks :func:`~persistent_gemm.prepare_weight` makes, held once: ``*_weight_q``
(E, 2I, D) and (E, D, I) e4m3, or e2m1 pairs (E, 2I, D/2), (E, D, I/2), and ``*_weight_scale``
(E, S) e8m0, one row per expert of its scales in the blocked layout (``pg.to_blocked``, as
pg.nn.Linear's ``weight_scale``); ``gate_up_bias`` (E, 2I) and ``down_bias`` (E, D) bf16 where the
source has biases (then both). Each token's top-k outputs are weighted and summed in float32 in a
fixed order (no atomics: a deterministic output), rounded once to the input's dtype. Inference
only, as the quantized Linears (run it under ``torch.no_grad()``).
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch

from ._moe_sources import ACTIVATIONS, block_mlp_names, block_weights, deinterleaved, fused_experts
from .prepare import PreparedWeight, from_mxfp4_blocks, prepare_weight
from .quant import MX_BLOCK, RULES, quantize_mxfp4, quantize_mxfp8

__all__ = ["FORMATS", "ACTIVATIONS", "GroupedExperts", "SparseMoeBlock", "swap_moe_"]

#: The formats a :class:`GroupedExperts` computes in: pg.nn.FORMATS but fp8_rowwise.
FORMATS = ("bf16", "mxfp8", "fp8_fp4", "mxfp8_weight_only", "mxfp4_weight_only")
#: format -> prepare_weight's fmt of its stored weights
_PREPARED = {"mxfp8": "mxfp8", "mxfp8_weight_only": "mxfp8", "fp8_fp4": "fp4", "mxfp4_weight_only": "fp4"}
_PROJS = ("gate_up", "down")
_16BIT = (torch.bfloat16, torch.float16)
#: the formats whose activations are MXFP8 (quantized per call)
_MX_ACTIVATIONS = ("mxfp8", "fp8_fp4")


def _grouped_mm(a, b, offs, *, scale_a, bias, out_dtype):
    """pg.grouped_mm, imported at the call: its wrapper needs the compiled extension, and this
    module is imported without it (as pg.nn is)."""
    from .grouped import grouped_mm

    return grouped_mm(a, b, offs, scale_a=scale_a, bias=bias, out_dtype=out_dtype)


def _routing():
    """persistent_gemm.moe_routing, imported at the call as grouped_mm is (its fakes need the ops)."""
    from . import moe_routing

    return moe_routing


def _dtype16(t: torch.Tensor) -> torch.dtype:
    """Where a float weight or bias is kept: its own dtype if 16-bit, else bf16 (as pg.nn.Linear)."""
    return t.dtype if t.dtype in _16BIT else torch.bfloat16


class GroupedExperts(torch.nn.Module):
    """E gated-MLP experts as two grouped GEMMs: ``forward(hidden_states (T, D), router_indices
    (T, top_k) in [0, E), routing_weights (T, top_k)) -> (T, D)``, as transformers' experts modules
    are called. Build it with :meth:`from_weights`, :meth:`from_module` (as ``quantize_`` does) or
    :meth:`from_mxfp4_blocks`; the constructor makes zero weights (to ``load_state_dict`` into)."""

    _QUANTIZED = ("gate_up_weight_q", "gate_up_weight_scale", "down_weight_q", "down_weight_scale")

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, fmt: str = "bf16", *,
                 bias: bool = False, activation: str = "silu", alpha: float = 1.702, limit: float = 7.0,
                 rule: str = "floor", device=None) -> None:
        super().__init__()
        for what, value, allowed in (("fmt", fmt, FORMATS), ("activation", activation, ACTIVATIONS),
                                     ("rule", rule, RULES)):
            if value not in allowed:
                hint = ": fp8_rowwise has no grouped GEMM" if value == "fp8_rowwise" else ""
                raise ValueError(f"{what} must be one of {allowed}, got {value!r}{hint}")
        e, d, i = int(num_experts), int(hidden_size), int(intermediate_size)
        fp4 = _PREPARED.get(fmt) == "fp4"
        if min(e, d, i) < 1 or (fp4 and (d % MX_BLOCK or i % MX_BLOCK)):
            raise ValueError(f"experts, hidden and intermediate sizes must be >= 1 (and multiples of {MX_BLOCK} for "
                             f"fmt={fmt!r}: e2m1 weights' K rule), got {e}, {d}, {i}")
        self.num_experts, self.hidden_size, self.intermediate_size = e, d, i
        self.fmt, self.activation, self.alpha, self.limit, self.rule = fmt, activation, float(alpha), float(limit), rule
        #: The module's name in the model quantize_ swapped it into (None: built alone); errors say it.
        self.fqn: Optional[str] = None
        self._prepared: dict = {}
        for proj, (n, k) in zip(_PROJS, ((2 * i, d), (d, i))):
            if fmt == "bf16":
                w = torch.zeros(e, n, k, dtype=torch.bfloat16, device=device)
                self.register_parameter(f"{proj}_weight", torch.nn.Parameter(w, requires_grad=False))
            else:  # device "meta": placeholders for the from_* constructors, which set the weights
                wq = torch.zeros(e, n, k // 2 if fp4 else k, dtype=torch.uint8, device=device)
                ws = torch.zeros(e, n, -(-k // MX_BLOCK), dtype=torch.uint8, device=device)
                self._keep(proj, wq.view(torch.float4_e2m1fn_x2 if fp4 else torch.float8_e4m3fn),
                           ws.view(torch.float8_e8m0fnu))
            b = torch.nn.Parameter(torch.zeros(e, n, dtype=torch.bfloat16, device=device), requires_grad=False)
            self.register_parameter(f"{proj}_bias", b if bias else None)

    @classmethod
    def from_weights(cls, gate_up: torch.Tensor, down: torch.Tensor, fmt: str = "bf16", *,
                     gate_up_bias: Optional[torch.Tensor] = None, down_bias: Optional[torch.Tensor] = None,
                     activation: str = "silu", alpha: float = 1.702, limit: float = 7.0,
                     rule: str = "floor") -> "GroupedExperts":
        """Experts from float weights, converted once to ``fmt``: ``gate_up`` (E, 2I, D), gate rows
        then up rows, ``down`` (E, D, I), biases (E, 2I) and (E, D) (one alone: the other is zero)."""
        shapes = tuple(getattr(w, "shape", None) for w in (gate_up, down))
        if (not all(isinstance(w, torch.Tensor) and w.dim() == 3 and w.is_floating_point() for w in (gate_up, down))
                or gate_up.shape[1] % 2 or tuple(down.shape) != (gate_up.shape[0], gate_up.shape[2],
                                                                 gate_up.shape[1] // 2)):
            raise ValueError(f"gate_up must be a float (E, 2I, D) tensor and down (E, D, I), got shapes {shapes}")
        if gate_up.device.type == "meta" and fmt != "bf16":
            raise ValueError(f"cannot quantize weights on the meta device to format={fmt!r}: they have no values "
                             "yet. Materialise the model first, then quantize")
        e, two_i, d = gate_up.shape
        has_bias = gate_up_bias is not None or down_bias is not None
        m = cls(e, d, two_i // 2, fmt, bias=has_bias, activation=activation, alpha=alpha, limit=limit, rule=rule,
                device="meta")
        for proj, w, b in (("gate_up", gate_up, gate_up_bias), ("down", down, down_bias)):
            w = w.detach()
            if fmt == "bf16":
                m._parameters[f"{proj}_weight"] = torch.nn.Parameter(w.to(_dtype16(w)).contiguous(),
                                                                    requires_grad=False)
            else:
                m._keep(proj, *(quantize_mxfp8 if _PREPARED[fmt] == "mxfp8" else quantize_mxfp4)(w, rule=rule))
            if has_bias:
                m._set_bias(proj, b, w)
        return m

    @classmethod
    def from_module(cls, module: torch.nn.Module, fmt: str = "bf16", rule: str = "floor") -> "GroupedExperts":
        """The experts of a transformers >= 5 experts module (the module docstring says which),
        converted once to ``fmt``."""
        source = fused_experts(module)
        if source is None:
            raise ValueError(f"{type(module).__name__} is not a transformers experts module (3-D gate_up_proj and "
                             "down_proj with its layout flags); SparseMoeBlock.from_block takes ModuleList blocks")
        return cls.from_weights(fmt=fmt, rule=rule, **source)

    @classmethod
    def from_mxfp4_blocks(cls, gate_up_blocks: torch.Tensor, gate_up_scales: torch.Tensor, down_blocks: torch.Tensor,
                          down_scales: torch.Tensor, gate_up_bias: Optional[torch.Tensor] = None,
                          down_bias: Optional[torch.Tensor] = None, *, fmt: str = "mxfp4_weight_only",
                          alpha: float = 1.702, limit: float = 7.0, rule: str = "floor") -> "GroupedExperts":
        """gpt-oss's experts from its checkpoint tensors (``mlp.experts.gate_up_proj_blocks``, ...),
        the MXFP4 bytes kept: ``*_blocks`` (E, N, K/32, 16) uint8, 32 e2m1 codes per block, low
        nibble first; ``*_scales`` (E, N, K/32) uint8 e8m0 codes; gate_up (N = 2I, K = D) with
        gate and up rows interleaved (2j, 2j + 1), down (N = D, K = I); biases (E, 2I), (E, D).
        ``fmt``: ``"mxfp4_weight_only"`` (16-bit activations) or ``"fp8_fp4"`` (MXFP8 activations)."""
        if fmt not in ("mxfp4_weight_only", "fp8_fp4"):
            raise ValueError(f"fmt must be 'mxfp4_weight_only' or 'fp8_fp4' (MXFP4 weights), got {fmt!r}")
        if not all(isinstance(t, torch.Tensor) for t in (gate_up_blocks, gate_up_scales, down_blocks, down_scales)) \
                or gate_up_blocks.dim() != 4 or gate_up_scales.dim() != 3 or gate_up_blocks.shape[1] % 2:
            raise ValueError("gate_up_blocks must be (E, 2I, D/32, 16) and gate_up_scales (E, 2I, D/32) tensors, got "
                             f"{getattr(gate_up_blocks, 'shape', None)} and {getattr(gate_up_scales, 'shape', None)}")
        rows = deinterleaved(gate_up_blocks.shape[1], gate_up_blocks.device)
        gu = from_mxfp4_blocks(gate_up_blocks[:, rows], gate_up_scales.view(torch.uint8)[:, rows])
        dn = from_mxfp4_blocks(down_blocks, down_scales)
        if (dn.experts, dn.n, 2 * dn.k) != (gu.experts, gu.k, gu.n):
            raise ValueError(f"down_blocks must be (E, D, I/32, 16) = ({gu.experts}, {gu.k}, {gu.n // 64}, 16) for "
                             f"gate_up_blocks {tuple(gate_up_blocks.shape)}, got {tuple(down_blocks.shape)}")
        has_bias = gate_up_bias is not None or down_bias is not None
        m = cls(gu.experts, gu.k, dn.k, fmt, bias=has_bias, activation="gpt_oss", alpha=alpha, limit=limit,
                rule=rule, device="meta")
        m._keep("gate_up", gu)
        m._keep("down", dn)
        if has_bias:
            m._set_bias("gate_up", None if gate_up_bias is None else gate_up_bias[:, rows], gu.b)
            m._set_bias("down", down_bias, dn.b)
        return m

    def _keep(self, proj: str, wq, ws: Optional[torch.Tensor] = None) -> None:
        """Weight ``proj`` in an MX format: ``wq`` (E, N, K or K/2) and plain scales ``ws``,
        prepared here, or a stacked PreparedWeight. The buffers are the prepared weight's own
        tensors (its rows and blocked scales), so the weight is held once."""
        pw = wq if ws is None else (prepare_weight(wq, ws, fmt=_PREPARED[self.fmt]) if not wq.is_meta else None)
        self._buffers[f"{proj}_weight_q"] = wq if pw is None else pw.b.transpose(1, 2)
        self._buffers[f"{proj}_weight_scale"] = ws if pw is None else pw.scale_b
        if pw is not None:
            self._prepared[proj] = pw

    def _set_bias(self, proj: str, b: Optional[torch.Tensor], like: torch.Tensor) -> None:
        """Bias ``proj`` from ``b`` (E, N), kept 16-bit; None: zeros on ``like``'s device."""
        e, n = self.num_experts, (2 * self.intermediate_size if proj == "gate_up" else self.hidden_size)
        if b is None:
            b = torch.zeros(e, n, dtype=torch.bfloat16, device=like.device)
        elif tuple(b.shape) != (e, n):
            raise ValueError(f"{proj}_bias must be (E, N) = ({e}, {n}), got {tuple(b.shape)}")
        self._parameters[f"{proj}_bias"] = torch.nn.Parameter(b.detach().to(_dtype16(b)), requires_grad=False)

    def _reprepare(self) -> None:
        """The prepared weights again around the buffers, after a device move or a load."""
        if self.fmt != "bf16":
            for proj, k in zip(_PROJS, (self.hidden_size, self.intermediate_size)):
                q, s = self._buffers[f"{proj}_weight_q"], self._buffers[f"{proj}_weight_scale"]
                self._prepared[proj] = PreparedWeight(b=q.transpose(1, 2), scale_b=s, fmt=_PREPARED[self.fmt],
                                                      n=q.shape[1], k=k, experts=q.shape[0])

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up (E, 2I, D), down (E, D, I)) float32: the values the GEMMs multiply by, in this
        module's layout (gate rows first)."""
        if self.fmt == "bf16":
            return self.gate_up_weight.detach().float(), self.down_weight.detach().float()
        return self._prepared["gate_up"].dequantize(), self._prepared["down"].dequantize()

    def forward(self, hidden_states: torch.Tensor, router_indices: torch.Tensor,
                routing_weights: torch.Tensor) -> torch.Tensor:
        # No value is read on the host: the rows are sorted by expert and counted on the device
        # (moe_dispatch), so the work queued is the same for every routing. Five launches in the
        # 16-bit formats: dispatch, grouped GEMM, activation, grouped GEMM, combine.
        x = hidden_states
        if x.dim() != 2 or x.shape[1] != self.hidden_size or not x.is_floating_point():
            raise ValueError(f"{self._who()}: hidden_states must be a float (tokens, {self.hidden_size}) tensor, got "
                             f"{x.dtype} {tuple(x.shape)}")
        if router_indices.dim() != 2 or router_indices.shape[0] != x.shape[0] or \
                routing_weights.shape != router_indices.shape:
            raise ValueError(f"{self._who()}: router_indices and routing_weights must both be (tokens, top_k) for "
                             f"{x.shape[0]} tokens, got {tuple(router_indices.shape)} and "
                             f"{tuple(routing_weights.shape)}")
        compute = self._compute_dtype(x.dtype)
        # The tokens cast or quantized once, then gathered by expert with their scales.
        x, scale_a = self._activations(x, compute)
        offs, slot_rows, rows = _routing().moe_dispatch(router_indices, self.num_experts, x,
                                                         *(() if scale_a is None else (scale_a,)))
        h = self._gemm(rows[0], rows[1] if scale_a is not None else None, "gate_up", offs, compute)
        # fp32 where the down projection's activations are quantized (one rounding, to e4m3)
        act = _routing().moe_activation(h, self.activation, alpha=self.alpha, limit=self.limit,
                                        out_dtype=torch.float32 if self.fmt in _MX_ACTIVATIONS else compute)
        y = self._gemm(*self._activations(act, compute), "down", offs, compute)
        return _routing().moe_combine(y, slot_rows, routing_weights, out_dtype=hidden_states.dtype)

    def _compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The GEMMs' 16-bit activation and output dtype, chosen as pg.nn.Linear's formats do."""
        if self.fmt == "bf16":
            return self._parameters["down_weight"].dtype
        if self.fmt.endswith("_weight_only") and dtype in _16BIT:
            return dtype
        return torch.bfloat16

    def _activations(self, x: torch.Tensor, compute: torch.dtype) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """A GEMM's activations and their scales: MXFP8 per 1x32 block (mxfp8, fp8_fp4), else ``compute``."""
        if self.fmt in _MX_ACTIVATIONS:
            return quantize_mxfp8(x, rule=self.rule)
        return (x if x.dtype == compute else x.to(compute)), None

    def _gemm(self, x: torch.Tensor, scale_a: Optional[torch.Tensor], proj: str, offs: torch.Tensor,
              compute: torch.dtype) -> torch.Tensor:
        """One grouped GEMM of rows ``x`` (sorted by expert) with projection ``proj`` and its bias."""
        bias = self._parameters[f"{proj}_bias"]
        if bias is not None and bias.dtype != compute:
            bias = bias.to(compute)  # the op takes the output's dtype
        if self.fmt == "bf16":
            b = self._parameters[f"{proj}_weight"].transpose(1, 2)  # (E, K, N) K-major, torch._grouped_mm's b
        else:
            b = self._prepared[proj]
        return _grouped_mm(x, b, offs, scale_a=scale_a, bias=bias, out_dtype=compute)

    def _apply(self, fn, recurse=True):
        # As pg.nn.Linear: a model-wide cast (.half(), .float()) must not convert the quantized
        # bytes, which follow device moves only; a bf16-format weight follows 16-bit casts only.
        keep = {name: self._buffers.pop(name) for name in self._QUANTIZED if self._buffers.get(name) is not None}
        dtypes = {proj: self._parameters[f"{proj}_weight"].dtype for proj in _PROJS if self.fmt == "bf16"}
        try:
            out = super()._apply(fn, recurse)
        finally:
            if keep:
                device = fn(torch.empty(0, device=next(iter(keep.values())).device)).device
                for name, t in keep.items():  # strides kept: the kernels' aligned rows
                    if t.device != device:
                        moved = torch.empty_strided(t.shape, t.stride(), dtype=torch.uint8, device=device)
                        t = moved.copy_(t.view(torch.uint8)).view(t.dtype)
                    self._buffers[name] = t
        for proj, dtype in dtypes.items():
            w = self._parameters[f"{proj}_weight"]
            if w.dtype not in _16BIT:
                w.data = w.data.to(dtype)  # back from a widening cast: exact
        self._reprepare()
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        self._reprepare()  # loaded in place, or assigned (assign=True): new tensors

    def _who(self) -> str:
        return f"persistent_gemm GroupedExperts{f' {self.fqn!r}' if self.fqn else ''} (format {self.fmt!r})"

    def extra_repr(self) -> str:
        act = self.activation + (f"(alpha={self.alpha}, limit={self.limit})" if self.activation == "gpt_oss" else "")
        return (f"experts={self.num_experts}, hidden_size={self.hidden_size}, intermediate_size="
                f"{self.intermediate_size}, bias={self.gate_up_bias is not None}, activation={act}, "
                f"format={self.fmt!r}" + (f", rule={self.rule!r}" if self.fmt != "bf16" else ""))


class SparseMoeBlock(torch.nn.Module):
    """A transformers-4-style sparse MoE block over :class:`GroupedExperts`: ``forward(hidden_states
    (..., D)) -> (hidden_states, router_logits (tokens, E))``. The router ``gate`` is kept; the
    routing is Mixtral's: softmax in float32, the top ``top_k``, renormalised to sum 1 unless
    ``norm_topk_prob`` is false (OLMoE's and Qwen-MoE's flag), cast to the input's dtype. Router
    jitter (training only) is not applied."""

    def __init__(self, gate: torch.nn.Module, experts: GroupedExperts, top_k: int, norm_topk_prob: bool = True) -> None:
        super().__init__()
        if not isinstance(experts, GroupedExperts) or not 1 <= int(top_k) <= experts.num_experts:
            raise ValueError(f"experts must be a GroupedExperts and 1 <= top_k <= its experts, got "
                             f"{type(experts).__name__}, top_k={top_k}")
        self.gate, self.experts, self.top_k, self.norm_topk_prob = gate, experts, int(top_k), bool(norm_topk_prob)

    @classmethod
    def from_block(cls, block: torch.nn.Module, fmt: str = "bf16", rule: str = "floor") -> "SparseMoeBlock":
        """The block ``block`` with its ``experts`` ModuleList converted once to ``fmt``."""
        names = block_mlp_names(block)
        if names is None:
            raise ValueError(f"{type(block).__name__} is not a sparse MoE block of a gate Linear and an experts "
                             "ModuleList of SiLU-gated MLPs (w1/w3/w2 or gate_proj/up_proj/down_proj), with top_k")
        experts = GroupedExperts.from_weights(fmt=fmt, rule=rule, **block_weights(block, names))
        return cls(block.gate, experts, block.top_k, getattr(block, "norm_topk_prob", True))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        router_logits = self.gate(x)
        weights, indices = torch.topk(torch.softmax(router_logits, dim=1, dtype=torch.float32), self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(x, indices, weights.to(x.dtype)).reshape(hidden_states.shape), router_logits

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, norm_topk_prob={self.norm_topk_prob}"


def _moe_kind(module: torch.nn.Module) -> tuple[Optional[str], Optional[str]]:
    """("experts" or "block": what ``module`` is, or None; why an experts module is not one of ours, or None)."""
    try:
        if fused_experts(module) is not None:
            return "experts", None
    except ValueError as e:
        return None, str(e)
    return ("block" if block_mlp_names(module) is not None else None), None


def swap_moe_(model: torch.nn.Module, fmt: str, rule: str = "floor",
              filter_fn: Optional[Callable[[torch.nn.Module, str], bool]] = None) -> int:
    """Replace, in place, each MoE module of ``model`` named in the module docstring for which
    ``filter_fn(module, fqn)`` is true by its grouped form in ``fmt``, and return how many were.
    Experts modules left (another gate; ``fmt="fp8_rowwise"``) are named in one warning; a
    ModuleList block left under fp8_rowwise is not (its Linears are swapped one by one)."""
    swapped, left = 0, []
    for fqn, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{fqn}.{name}" if fqn else name
            kind, why = _moe_kind(child)
            if (kind is None and why is None) or (filter_fn is not None and not filter_fn(child, full)):
                continue
            if kind is None or fmt not in FORMATS:
                if kind != "block":
                    left.append(f"{full} ({why or f'format {fmt!r} has no grouped GEMM'})")
                continue
            try:
                new = (GroupedExperts.from_module if kind == "experts" else SparseMoeBlock.from_block)(child, fmt, rule)
            except ValueError as e:
                raise ValueError(f"{full}: {e}") from None
            (new.experts if kind == "block" else new).fqn = full
            setattr(parent, name, new)
            swapped += 1
    if left:
        warnings.warn("persistent_gemm: MoE experts left as they are (filter_fn may exclude them): "
                      + "; ".join(left), stacklevel=3)
    return swapped
