"""The MoE routing ops around :func:`~persistent_gemm.grouped_mm`: typed wrappers and fake kernels of
``torch.ops.persistent_gemm.moe_dispatch`` / ``moe_activation`` / ``moe_combine`` (schema, checks,
CPU definitions and CUDA entries in ``csrc/moe_routing.cpp``; kernels in
``include/persistent_gemm/host/moe_routing.cuh``). A MoE layer's experts in five launches:

    offs, slot_rows, (xs,) = pg.moe_dispatch(router_indices, E, x)        # sort by expert, gather
    h = pg.grouped_mm(xs, w_gate_up, offs)
    y = pg.grouped_mm(pg.moe_activation(h, "gpt_oss"), w_down, offs)
    out = pg.moe_combine(y, slot_rows, routing_weights)                   # weighted top-k sum

Nothing is read on the host, so a decode step captures in a CUDA graph and replays with new
routing. Device values are checked on the device: an expert index outside ``[0, E)`` or a
``slot_rows`` entry outside ``y`` makes the kernel print the entry and fail the launch (a sticky
CUDA error, as a failed assert); on the CPU the same checks raise eagerly.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["moe_dispatch", "moe_activation", "moe_combine"]

_LIB = "persistent_gemm"
_FLOAT = (torch.bfloat16, torch.float16, torch.float32)


@torch.library.register_fake(f"{_LIB}::moe_dispatch")
def _moe_dispatch_fake(router_indices, num_experts, rows):
    torch._check(router_indices.dim() == 2, lambda: f"router_indices must be 2-D, got {router_indices.dim()}-D")
    slots = router_indices.shape[0] * router_indices.shape[1]
    offs = router_indices.new_empty((num_experts,), dtype=torch.int32)
    slot_rows = router_indices.new_empty((slots,), dtype=torch.int32)
    return offs, slot_rows, [r.new_empty((slots, r.shape[1])) for r in rows]


@torch.library.register_fake(f"{_LIB}::moe_activation")
def _moe_activation_fake(h, kind, alpha=1.702, limit=7.0, out_dtype=None):
    torch._check(h.dim() == 2, lambda: f"h must be 2-D, got {h.dim()}-D")
    return h.new_empty((h.shape[0], h.shape[1] // 2), dtype=h.dtype if out_dtype is None else out_dtype)


@torch.library.register_fake(f"{_LIB}::moe_combine")
def _moe_combine_fake(y, slot_rows, routing_weights, out_dtype=None):
    torch._check(routing_weights.dim() == 2, lambda: f"routing_weights must be 2-D, got {routing_weights.dim()}-D")
    return y.new_empty((routing_weights.shape[0], y.shape[1]), dtype=y.dtype if out_dtype is None else out_dtype)


def _tensor(op: str, **named) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"persistent_gemm.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def moe_dispatch(router_indices: torch.Tensor, num_experts: int,
                 *rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Sort a layer's (token, k) slots by expert and gather the tokens' rows into that order.

    ``router_indices`` (tokens, top_k) int32/int64: token t's experts; slot ``s = t * top_k + j``.
    Returns ``offs`` (num_experts,) int32, the cumulative row ends :func:`grouped_mm` takes;
    ``slot_rows`` (tokens * top_k,) int32, the sorted row of each slot (the slots of one expert
    keep their order, so the result does not depend on the run); and each of ``rows`` -- tensors
    (tokens, C) of any dtype, such as the activations and their MX scales -- gathered:
    ``sorted[i][slot_rows[s]] = rows[i][s // top_k]``. An index outside ``[0, num_experts)`` is an
    error: raised on the CPU, on a GPU printed by the kernel with the launch failed (module
    docstring)."""
    _tensor("moe_dispatch", router_indices=router_indices, **{f"rows[{i}]": r for i, r in enumerate(rows)})
    if isinstance(num_experts, bool) or not isinstance(num_experts, int):
        raise TypeError(f"persistent_gemm.moe_dispatch: num_experts must be an int, got {type(num_experts).__name__}")
    offs, slot_rows, out = torch.ops.persistent_gemm.moe_dispatch.default(router_indices, num_experts, list(rows))
    return offs, slot_rows, list(out)


def moe_activation(h: torch.Tensor, kind: str = "silu", *, alpha: float = 1.702, limit: float = 7.0,
                   out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The gated activation between a MoE layer's two GEMMs: ``h`` (rows, 2I) bf16/fp16/fp32, its
    gate columns ``[0, I)`` and up columns ``[I, 2I)`` -> (rows, I), computed in fp32 and rounded
    once to ``out_dtype`` (default ``h``'s): ``kind="silu"`` SiLU(gate) * up (Mixtral, Qwen, DeepSeek);
    ``kind="gpt_oss"`` gpt-oss's clamped SwiGLU, gate clamped above at ``limit``, up to
    ``[-limit, limit]``, ``(up + 1) * gate * sigmoid(alpha * gate)``. NaN propagates."""
    _tensor("moe_activation", h=h)
    return torch.ops.persistent_gemm.moe_activation.default(h, kind, float(alpha), float(limit), out_dtype)


def moe_combine(y: torch.Tensor, slot_rows: torch.Tensor, routing_weights: torch.Tensor, *,
                out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Each token's top-k expert outputs, weighted and summed: ``y`` (tokens * top_k, D) the second
    GEMM's rows in sorted order, ``slot_rows`` from :func:`moe_dispatch`, ``routing_weights``
    (tokens, top_k). ``out[t] = sum_j w[t, j] * y[slot_rows[t * top_k + j]]`` over j in order, in
    fp32 (products rounded, then added: no fused multiply-add, so the CPU and the GPU agree bit for
    bit), rounded once to ``out_dtype`` (default ``y``'s). Deterministic: no atomics."""
    _tensor("moe_combine", y=y, slot_rows=slot_rows, routing_weights=routing_weights)
    return torch.ops.persistent_gemm.moe_combine.default(y, slot_rows, routing_weights, out_dtype)
