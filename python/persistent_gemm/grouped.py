"""Grouped GEMMs for MoE experts in ``torch._grouped_mm``'s convention: the typed wrappers and the
fake kernel of ``torch.ops.persistent_gemm.grouped_mm`` (schema, checks and kernels in
``csrc/grouped.cpp``).

    offs = torch.cumsum(counts, 0, dtype=torch.int32)         # on the GPU, never read on the host
    w = pg.prepare_weight(wq, ws, fmt="fp4")                  # wq (E, N, K/2), ws (E, N, K/32)
    y = pg.grouped_mm(x_sorted, w, offs)                      # x (rows, K) bf16, rows sorted by expert

Rows must be sorted by expert: expert ``e`` owns rows ``offs[e-1]:offs[e]`` (``offs[-1]`` = 0); that
is the caller's contract (a routing kernel's permutation), not checked. What is checked, and where:
shapes, dtypes and devices on the host; ``offs`` itself (non-decreasing, ``offs[-1]`` equal to the
rows) on the device -- by the kernel, which prints the offending entry and fails the launch, by an
async assert in the GPU reference, eagerly on the CPU. Nothing reads ``offs`` on the host, so a
decode step with the routing on the GPU captures in a CUDA graph and replays with new routing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import torch

from ._ops import _check_devices, _check_types, _config

if TYPE_CHECKING:
    from .prepare import PreparedWeight

__all__ = ["grouped_mm", "masked_grouped_mm"]

_LIB = "persistent_gemm"
_MX_BLOCK = 32


@torch.library.register_fake(f"{_LIB}::grouped_mm")
def _grouped_mm_fake(a, b, offs, scale_a=None, scale_b=None, bias=None, out_dtype=None, config=None):
    _check_devices("grouped_mm", a=a, b=b, offs=offs, scale_a=scale_a, scale_b=scale_b, bias=bias)
    torch._check(a.dim() in (2, 3), lambda: f"a must be 2-D (rows, K) or 3-D (E, rows, K), got {a.dim()}-D")
    torch._check(b.dim() == 3, lambda: f"b must be 3-D (E, K, N), got {b.dim()}-D")
    torch._check(offs.dtype == torch.int32 and offs.dim() == 1 and offs.shape[0] == b.shape[0],
                 lambda: f"offs must be int32 (E,) = ({b.shape[0]},), got {offs.dtype} {tuple(offs.shape)}")
    e2m1 = b.dtype == torch.float4_e2m1fn_x2
    torch._check(a.shape[-1] == (2 * b.shape[1] if e2m1 else b.shape[1]),
                 lambda: f"a's K = {a.shape[-1]} does not match b {tuple(b.shape)}")
    default = a.dtype if a.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    out = default if out_dtype is None else out_dtype
    shape = (*a.shape[:-1], b.shape[2])
    return a.new_empty(shape, dtype=out)


def _weight(b):
    """(b, scale_b) for the op: a stacked PreparedWeight's own, or a 16-bit (E, K, N) tensor's."""
    from .prepare import PreparedWeight

    if isinstance(b, PreparedWeight):
        if b.experts is None:
            raise ValueError("persistent_gemm.grouped_mm: b is a 2-D PreparedWeight (one expert); pass a stack: "
                             "prepare_weight of a 3-D wq (E, N, K) or from_mxfp4_blocks of (E, N, K/32, 16) blocks")
        return b.b, b.scale_b
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"persistent_gemm.grouped_mm: b must be a torch.Tensor (E, K, N) or a stacked PreparedWeight, "
                        f"got {type(b).__name__}")
    if b.dtype in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2):
        raise TypeError("persistent_gemm.grouped_mm: an MX b goes through prepare_weight (its scales in the kernels' "
                        "layout): pass the PreparedWeight")
    return b, None


def _family(a: torch.Tensor, b) -> str:
    from .prepare import PreparedWeight

    if not isinstance(b, PreparedWeight):
        return "fp16" if a.dtype == torch.float16 else "bf16"
    e2m1 = b.fmt == "fp4"
    if a.dtype == torch.float8_e4m3fn:
        return "e4m3xe2m1" if e2m1 else "mxfp8"
    return "bf16xe2m1" if e2m1 else "bf16xe4m3"


def _call(op: str, a, b, rows, scale_a, bias, out_dtype, config) -> torch.Tensor:
    _check_types(op, out_dtype, bias, a=a, **{"offs" if op == "grouped_mm" else "counts": rows})
    if scale_a is not None and not isinstance(scale_a, torch.Tensor):
        raise TypeError(f"persistent_gemm.{op}: scale_a must be a torch.Tensor or None, got {type(scale_a).__name__}")
    w, scale_b = _weight(b)
    return torch.ops.persistent_gemm.grouped_mm.default(a, w, rows, scale_a, scale_b, bias, out_dtype,
                                                        _config(config, "grouped_mm", _family(a, b), a.device))


def grouped_mm(a: torch.Tensor, b: Union[torch.Tensor, "PreparedWeight"], offs: torch.Tensor, *,
               scale_a: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               out_dtype: Optional[torch.dtype] = None, config=None) -> torch.Tensor:
    """The experts' GEMMs of a MoE layer in one call, ``torch._grouped_mm``'s 2-D x 3-D form.

    ``a`` (rows, K): the tokens' rows sorted by expert; ``offs`` (E,) int32 on ``a``'s device: the
    cumulative row ends (``offs[-1] == rows``; empty experts repeat the previous end). ``b``:

    * a bf16/fp16 (E, K, N) tensor of ``a``'s dtype (torch's layout): 16-bit experts. No grouped
      16-bit kernel of ours yet: bf16 runs ``torch._grouped_mm`` (the bias added after it), fp16 the
      exact reference;
    * a stacked :class:`PreparedWeight` (``prepare_weight`` of a 3-D ``wq``, or ``from_mxfp4_blocks``
      of gpt-oss's (E, N, K/32, 16) blocks): weight-only MXFP8 / MXFP4 for bf16/fp16 ``a``, or,
      with ``a`` e4m3 and ``scale_a`` (rows, K/32) its plain e8m0 scales (``quantize_mxfp8``),
      MXFP8 (``fmt="mxfp8"``) or FP8 x FP4 (``fmt="fp4"``). K must be a multiple of 32.

    On Hopper the MX formats run the grouped decode GEMV for a few rows per expert: only the
    experts that have rows are streamed, each expert's rows in items of up to its token tile
    (8-64, chosen from rows / E), the work dealt stream-K over all SMs. With tens of rows per
    expert and more, the grouped prefill tiles (the MX bf16 route's 128 x 128 and 128 x 256 tiles, walking
    (expert, tile) ids decided on the device; ``config=`` names any other grouped bf16-route tile,
    compiled at first use). fp16 activations, more than 512 experts, and other GPUs run the exact
    reference (dequantized weight, fp32 sums, one rounding).

    ``bias`` (E, N) of the output dtype: expert e's row added to its rows, in fp32, rounded once.
    ``out_dtype``: bf16, fp16 or fp32; default ``a``'s dtype (bf16 for e4m3 ``a``). Returns (rows, N).
    Inference only (no backward). ``offs`` is checked on the device (module docstring).
    """
    return _call("grouped_mm", a, b, offs, scale_a, bias, out_dtype, config)


def masked_grouped_mm(a: torch.Tensor, b: Union[torch.Tensor, "PreparedWeight"], counts: torch.Tensor, *,
                      scale_a: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                      out_dtype: Optional[torch.dtype] = None, config=None) -> torch.Tensor:
    """The masked form expert-parallel decode produces (DeepEP-style dispatch; DeepGEMM's
    ``m_grouped_*_masked``): ``a`` (E, rows, K) with ``counts`` (E,) int32 on ``a``'s device, expert
    e's live rows ``a[e, :counts[e]]``. Returns (E, rows, N) with rows past each count zero. Same
    formats, kernels and checks as :func:`grouped_mm` (``counts`` in [0, rows], on the device);
    ``scale_a`` (E, rows, K/32) for e4m3 ``a``."""
    return _call("masked_grouped_mm", a, b, counts, scale_a, bias, out_dtype, config)
