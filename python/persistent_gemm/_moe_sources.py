"""What the MoE modules of model libraries hold, read for :mod:`persistent_gemm.moe`: which modules
are experts it can swap, and their weights in its layout ((out, in) per expert, gate rows then up
rows). The layouts are transformers' (read from its 5.x source): the fused experts modules of
``@use_experts_implementation`` and the ModuleList blocks of its 4.x Mixtral / OLMoE. Nothing here
imports transformers: a module is recognised by what it holds."""

from __future__ import annotations

from typing import Optional

import torch

#: The gates GroupedExperts computes: "silu", silu(gate) * up (Mixtral's); "gpt_oss",
#: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) with g = min(gate, limit)
#: (transformers' GptOssExperts._apply_gate).
ACTIVATIONS = ("silu", "gpt_oss")


def is_silu(act) -> bool:
    return (isinstance(act, torch.nn.SiLU) or act is torch.nn.functional.silu
            or type(act).__name__ == "SiLUActivation")  # transformers' ACT2FN["silu"]


def fused_experts(m: torch.nn.Module) -> Optional[dict]:
    """``GroupedExperts.from_weights``'s arguments for a transformers >= 5 experts module, None for
    any other module; ValueError for an experts module that computes something else."""
    gu, dn = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    if not (isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.dim() == dn.dim() == 3
            and hasattr(m, "is_transposed")):
        return None
    gate = getattr(getattr(type(m), "_apply_gate", None), "__qualname__", "none")
    if gate == "GptOssExperts._apply_gate":
        act = {"activation": "gpt_oss", "alpha": float(m.alpha), "limit": float(m.limit)}
    elif gate == "_default_apply_gate" and is_silu(getattr(m, "act_fn", None)):  # act_fn(gate) * up, halves
        act = {"activation": "silu"}
    else:
        raise ValueError(f"its gate ({gate}, act_fn {type(getattr(m, 'act_fn', None)).__name__}) is not one of "
                         f"{ACTIVATIONS}")
    if not getattr(m, "has_gate", True) or getattr(m, "has_post_expert_norm", False) or \
            getattr(m, "_is_expert_parallel", False) or not gu.is_floating_point():
        raise ValueError(f"it is ungated, has a post-expert norm, is expert-parallel or holds {gu.dtype} weights")
    gu, dn = gu.detach(), dn.detach()
    if m.is_transposed:  # (E, in, out) -> (E, out, in)
        gu, dn = gu.transpose(1, 2), dn.transpose(1, 2)
    has_bias = getattr(m, "has_bias", False)
    gub, dnb = (getattr(m, f"{p}_proj_bias") if has_bias else None for p in ("gate_up", "down"))
    if act["activation"] == "gpt_oss":  # gate_up[..., ::2] is its gate, [..., 1::2] its up projection
        rows = deinterleaved(gu.shape[1], gu.device)
        gu, gub = gu[:, rows], (None if gub is None else gub.detach()[:, rows])
    return {"gate_up": gu, "down": dn, "gate_up_bias": gub, "down_bias": dnb, **act}


def block_mlp_names(block: torch.nn.Module) -> Optional[tuple[str, str, str]]:
    """(gate, up, down) attribute names of the MLPs of a ModuleList MoE block (its children
    ``gate`` and ``experts`` alone, an int ``top_k``), or None where ``block`` is not one."""
    experts, gate = getattr(block, "experts", None), getattr(block, "gate", None)
    if (not isinstance(experts, torch.nn.ModuleList) or not len(experts) or type(gate) is not torch.nn.Linear
            or {n for n, _ in block.named_children()} != {"gate", "experts"} or gate.out_features != len(experts)
            or not isinstance(getattr(block, "top_k", None), int)):
        return None
    for names in (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj")):
        shapes = set()
        for mlp in experts:
            lins = [getattr(mlp, n, None) for n in names]
            if (not all(type(lin) is torch.nn.Linear for lin in lins) or not is_silu(getattr(mlp, "act_fn", None))
                    or {n for n, _ in mlp.named_children()} - {*names, "act_fn"}):
                break
            shapes.add(tuple(tuple(lin.weight.shape) for lin in lins))
        else:
            if len(shapes) == 1:  # every expert (I, D), (I, D), (D, I)
                g, u, d = shapes.pop()
                if g == u == d[::-1] and g[1] == gate.in_features:
                    return names
    return None


def block_weights(block: torch.nn.Module, names: tuple[str, str, str]) -> dict:
    """``GroupedExperts.from_weights``'s arguments for a ModuleList MoE block whose MLPs hold
    Linears ``names`` (:func:`block_mlp_names`): their weights stacked, missing biases zero."""
    g, u, d = ([getattr(mlp, n) for mlp in block.experts] for n in names)
    out = {"gate_up": torch.stack([torch.cat((a.weight, b.weight)) for a, b in zip(g, u)]).detach(),
           "down": torch.stack([lin.weight for lin in d]).detach()}
    if any(lin.bias is not None for lin in g + u + d):
        def bias(lin):
            return (lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features)).detach()
        out["gate_up_bias"] = torch.stack([torch.cat((bias(a), bias(b))) for a, b in zip(g, u)])
        out["down_bias"] = torch.stack([bias(lin) for lin in d])
    return out


def deinterleaved(two_i: int, device) -> torch.Tensor:
    """The row order taking interleaved (gate, up) pairs to gate rows, then up rows."""
    return torch.cat((torch.arange(0, two_i, 2, device=device), torch.arange(1, two_i, 2, device=device)))
