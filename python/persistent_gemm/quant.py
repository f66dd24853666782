"""OCP Microscaling (MX v1.0) quantization: MXFP8 (e4m3) and MXFP4 (e2m1) with e8m0 scales.

Pure-torch reference helpers (CPU or CUDA, vectorized) that produce the operands the
block-scaled GEMM consumes and check its results.

The rule (OCP MX v1.0, section 6.3), per block of ``block`` (32) consecutive elements along
the last dim K of a ``(rows, K)`` tensor; the last block may be partial:

* ``amax = max |x|`` over the block.
* Shared exponent, by ``rule``:

  - ``"floor"`` (OCP, the default): ``E = floor(log2(amax)) - emax_elem`` with
    ``emax_elem = 8`` for e4m3 (largest normal 448 = 1.75 * 2^8) and ``2`` for e2m1
    (6 = 1.5 * 2^2). ``floor(log2)`` is read exactly from :func:`torch.frexp`. The largest
    elements of a block may saturate.
  - ``"rceil"`` (the default of torchao's MX inference configs -- its ``MXTensor.to_mx`` defaults
    to floor --, NVIDIA's ``cvt.rp`` to e8m0): ``E = ceil(log2(amax /
    max_elem))``, the float32 quotient rounded up to a power of two, so nothing saturates.

  Either is clamped to the e8m0 range ``[-127, 127]``.
* The scale is ``2^E``, stored as the e8m0 code ``E + 127``; code 255 is NaN.
* Each element is ``x / 2^E`` rounded to nearest, ties to even, in the element format and
  saturated to its largest normal (448 or 6). The scaled block amax lies in
  ``[2^emax, 2^(emax+1))``, so only values above the largest normal saturate.
* A block with ``amax == 0`` gets code 0 (2^-127) and zero elements.
* Inputs are computed in float32. A block holding NaN or +-inf gets the NaN scale (code 255),
  so it dequantizes to NaN and poisons its GEMM row or column: visible, never a wrong finite
  number. There is no check with a host synchronisation, so the quantizers trace under
  ``torch.compile(fullgraph=True)`` and run as fused GPU kernels there.
* ``block`` must be 32: every MX op of this package (and MX v1.0) uses 1x32 blocks, so a
  quantizer never produces scales no op accepts.

Dequantization is ``element * 2^(code - 127)`` in float32, exact wherever the product is
representable (every element times every code >= 0 is, down to 2^-136; only huge codes
can overflow to inf); a NaN scale code makes its whole block NaN.

MXFP4 elements are packed two per byte, element ``2i`` in the low nibble and ``2i + 1`` in
the high nibble of byte ``i``, viewed as ``torch.float4_e2m1fn_x2``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "MX_BLOCK",
    "E4M3_MAX",
    "E2M1_MAX",
    "E4M3_EMAX",
    "E2M1_EMAX",
    "E8M0_BIAS",
    "E2M1_VALUES",
    "RULES",
    "quantize_mxfp8",
    "quantize_mxfp8_reference",
    "quantize_mxfp4",
    "dequantize_mxfp8",
    "dequantize_mxfp4",
    "e8m0_to_float",
    "e2m1_to_float",
]

#: Elements per shared scale in every MX v1.0 format.
MX_BLOCK = 32
E4M3_MAX = 448.0
E2M1_MAX = 6.0
#: Exponent of the largest normal of the element format (``emax_elem`` in the spec).
E4M3_EMAX = 8
E2M1_EMAX = 2
E8M0_BIAS = 127
E8M0_NAN = 255

#: Values of the 16 e2m1 codes (bits ``s e1 e0 m0``); code 8 is -0.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Midpoints between neighbouring e2m1 magnitudes. A tie goes to the even code (m0 = 0):
# down where the lower neighbour's code is even, up where it is odd.
_E2M1_TIES_DOWN = (0.25, 1.25, 2.5, 5.0)  # 0|0.5, 1|1.5, 2|3, 4|6
_E2M1_TIES_UP = (0.75, 1.75, 3.5)  # 0.5|1, 1.5|2, 3|4


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_block(block) -> None:
    # bool is an int to Python but never a block size; a float (even 32.0) is a caller's bug.
    if isinstance(block, bool) or not isinstance(block, int):
        raise TypeError(f"block must be an int, got {block!r} ({type(block).__name__})")
    if block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")


def _check_quant_block(block) -> None:
    _check_block(block)
    if block != MX_BLOCK:
        raise ValueError(f"block must be {MX_BLOCK}: the MX ops (mxfp8_mm, fp8_fp4_mm) read 1x{MX_BLOCK} "
                         f"e8m0 blocks (MX v1.0), got block={block!r}")


#: Shared-exponent rules of the quantizers (see the module docstring).
RULES = ("floor", "rceil")


def _check_rule(rule) -> None:
    if rule not in RULES:
        hint = " (lowercase: torchao's ScaleCalculationMode.RCEIL is 'rceil')" if isinstance(rule, str) else ""
        raise ValueError(f"rule must be one of {RULES}{hint}, got {rule!r}")


def _check_2d(t, name: str, dtype: torch.dtype | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (rows, K) tensor, got shape {tuple(t.shape)}")


def _check_scale(scale, k: int, block: int, name: str, ref: torch.Tensor) -> None:
    _check_2d(scale, "scale", torch.float8_e8m0fnu)
    want = (ref.shape[0], _ceil_div(k, block))
    if tuple(scale.shape) != want:
        raise ValueError(f"scale must have shape (rows, ceil(K/{block})) = {want} for {name} of "
                         f"shape {tuple(ref.shape)} (K = {k}), got {tuple(scale.shape)}")
    if scale.device != ref.device:
        raise ValueError(f"scale must be on the same device as {name} ({ref.device}), got {scale.device}")


def _exp2_int(n: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2^n`` for int32 ``n`` in [-127, 127], built from the bit pattern
    (``exp2``/``pow`` are not guaranteed exact on every backend)."""
    bits = torch.where(n >= -126, (n + 127) << 23, torch.full_like(n, 0x00400000))  # 2^-127 is subnormal
    return bits.view(torch.float32)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """Decode e8m0 scales to float32: ``2^(code - 127)``, code 255 -> NaN.

    Parameters
    ----------
    scale : Tensor
        Any shape, dtype ``torch.float8_e8m0fnu``.

    Returns
    -------
    Tensor
        float32, same shape. Code 0 gives 2^-127 (a float32 subnormal), exactly.

    Examples
    --------
    >>> codes = torch.tensor([0, 127, 132, 255], dtype=torch.uint8)
    >>> e8m0_to_float(codes.view(torch.float8_e8m0fnu)).tolist()[1:]
    [1.0, 32.0, nan]
    """
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float8_e8m0fnu:
        got = scale.dtype if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise TypeError(f"scale must be a torch.float8_e8m0fnu tensor, got {got}")
    code = scale.view(torch.uint8).to(torch.int32)
    val = _exp2_int(code.clamp(max=254) - E8M0_BIAS)
    return torch.where(code == E8M0_NAN, torch.full_like(val, float("nan")), val)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode unpacked e2m1 codes (uint8 values 0..15) to float32 through a 16-entry table.

    Examples
    --------
    >>> e2m1_to_float(torch.tensor([1, 7, 8, 15], dtype=torch.uint8)).tolist()
    [0.5, 6.0, -0.0, -6.0]
    """
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        got = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise TypeError(f"codes must be a torch.uint8 tensor of e2m1 codes 0..15, got {got}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes must be e2m1 codes in 0..15, got max {int(codes.max())}")
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return lut[codes.long()]


def _scaled_blocks(x, block: int, emax_elem: int, rule: str = "floor",
                   max_elem: float = E4M3_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``x``, apply the shared-exponent rule and return ``(x / 2^E, codes)``:
    the scaled elements as float32 ``(rows, K)`` and the e8m0 codes ``(rows, nblocks)`` uint8."""
    _check_quant_block(block)
    _check_rule(rule)
    _check_2d(x, "x")
    if not x.is_floating_point():
        raise TypeError(f"x must have a floating-point dtype, got {x.dtype}")
    if x.dtype == torch.float4_e2m1fn_x2:  # packed pairs: no elementwise cast to float32 exists
        raise TypeError("x must hold one element per entry, got packed torch.float4_e2m1fn_x2 "
                        "(dequantize_mxfp4 it first)")
    x32 = x.to(torch.float32)
    rows, k = x32.shape
    nb = _ceil_div(k, block)
    # Zero padding never changes a block's amax; it only makes the tail block full-size.
    xb = F.pad(x32, (0, nb * block - k)).view(rows, nb, block)
    finite = torch.isfinite(xb).all(dim=-1)
    amax = torch.where(finite, xb.abs().amax(dim=-1), torch.zeros((), device=xb.device))
    if rule == "floor":
        _, e = torch.frexp(amax)  # amax = m * 2^e with m in [0.5, 1): floor(log2 amax) = e - 1
        exp = e - 1 - emax_elem
    else:  # rceil: the smallest 2^E with amax / 2^E <= max_elem, from the float32 quotient
        m, e = torch.frexp(amax / max_elem)
        exp = torch.where(m == 0.5, e - 1, e)  # an exact power of two is its own ceiling
    exp = exp.clamp(-E8M0_BIAS, E8M0_BIAS)
    code = torch.where(amax == 0, torch.zeros_like(exp), exp + E8M0_BIAS)
    code = torch.where(finite, code, torch.full_like(code, E8M0_NAN))
    # Multiply by the exact power of two 2^-E: the scaling itself never rounds for
    # normal results, so the only rounding is the one to the element format.
    scaled = xb * _exp2_int(E8M0_BIAS - code).unsqueeze(-1)
    return scaled.reshape(rows, nb * block)[:, :k], code.to(torch.uint8)


def quantize_mxfp8(x: torch.Tensor, block: int = MX_BLOCK, *, rule: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to MXFP8: e4m3 elements with one e8m0 scale per ``block`` elements along K.

    Parameters
    ----------
    x : Tensor
        ``(rows, K)``, any floating dtype (computed in float32), finite. K need not be a
        multiple of ``block``; the last block is then partial.
    block : int
        Elements per scale: 32 (MX v1.0; the only size the MX ops take).
    rule : {"floor", "rceil"}
        The shared-exponent rule (module docstring): OCP's floor (the default here and in
        torchao's ``MXTensor.to_mx``), or round-up (torchao's MX inference configs' default),
        which never saturates.

    A bf16 / fp16 / fp32 CUDA tensor is quantized by one kernel of the extension, bit for bit
    :func:`quantize_mxfp8_reference` (the torch-ops definition, which every other input takes).

    Returns
    -------
    data : Tensor
        ``(rows, K)`` ``torch.float8_e4m3fn``, ``x / scale`` rounded to nearest-even and
        saturated to +-448.
    scale : Tensor
        ``(rows, ceil(K / block))`` ``torch.float8_e8m0fnu``.

    Raises
    ------
    TypeError
        ``x`` is not a floating tensor; ``block`` is not an int.
    ValueError
        ``x`` is 0-D or 1-D; ``block`` is not 32; ``rule`` is unknown. (NaN/inf become NaN scales.)
        An N-D ``x`` (..., K) is quantized row by row; both results keep its leading dims.

    Examples
    --------
    A block with amax 448 * 2^5 gets scale 2^5 (code 132) and reaches the top of e4m3:

    >>> data, scale = quantize_mxfp8(torch.tensor([[448.0 * 32, 1.0]]))
    >>> scale.view(torch.uint8).tolist(), data.float().tolist()
    ([[132]], [[448.0, 0.03125]])
    """
    if isinstance(x, torch.Tensor) and x.dim() > 2:  # leading dims, as torchao's MXTensor takes them
        return _over_rows(quantize_mxfp8, x, block, rule)
    native = _native_quantizer(x, block, rule)
    if native is not None:
        return native(x, rule)
    return quantize_mxfp8_reference(x, block, rule=rule)


def _over_rows(quantize, x: torch.Tensor, block: int, rule: str):
    """``quantize`` of an N-D ``x`` (..., K): its rows quantized as one (rows, K) matrix, both
    results given back the leading dims."""
    data, scale = quantize(x.reshape(-1, x.shape[-1]), block, rule=rule)
    return data.reshape(*x.shape[:-1], data.shape[-1]), scale.reshape(*x.shape[:-1], scale.shape[-1])


#: Input dtypes the extension's CUDA quantizers read (MXFP8 here, rowwise e4m3 in nn; others take the torch path).
_NATIVE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _native_quantizer(x, block, rule):
    """The extension's CUDA kernel for a valid CUDA ``x`` (``torch.ops.persistent_gemm
    .quantize_mxfp8``, bitwise equal to :func:`quantize_mxfp8_reference`), else None: CPU
    tensors, other dtypes, or no extension. Arguments are checked here first, so both paths
    raise the same errors."""
    if not isinstance(x, torch.Tensor) or x.device.type != "cuda" or x.dtype not in _NATIVE_DTYPES:
        return None
    _check_quant_block(block)
    _check_rule(rule)
    _check_2d(x, "x")
    try:
        return torch.ops.persistent_gemm.quantize_mxfp8.default
    except (AttributeError, RuntimeError):  # the extension (or this op) is not built
        return None


def quantize_mxfp8_reference(x: torch.Tensor, block: int = MX_BLOCK, *,
                             rule: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_mxfp8` in plain torch ops on any device: the definition the CUDA kernel
    is tested against, and the path for CPU tensors (under torch.compile, inductor fuses it)."""
    scaled, code = _scaled_blocks(x, block, E4M3_EMAX, rule, E4M3_MAX)
    # MX saturates; clamp rather than rely on the cast's out-of-range behaviour, which
    # has differed across torch releases and backends (NaN instead of 448).
    data = scaled.clamp(-E4M3_MAX, E4M3_MAX).contiguous().to(torch.float8_e4m3fn)
    return data, code.view(torch.float8_e8m0fnu)


#: float32 amax floor of the rowwise e4m3 scales, so an all-zero row gets a finite scale.
_ROWWISE_TINY = 1e-12


def _rowwise_e4m3_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, K) -> e4m3 data and a (rows, 1) float32 scale, amax per row to 448: the fp8_rowwise
    Linear's activation quantizer (``persistent_gemm.nn._rowwise_e4m3``) in torch ops, its CPU
    path and the yardstick of its CUDA kernel (the ``quantize_rowwise_e4m3`` op)."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=_ROWWISE_TINY) / E4M3_MAX
    return (x32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def quantize_mxfp4(x: torch.Tensor, block: int = MX_BLOCK, *, rule: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to MXFP4: e2m1 elements packed two per byte, one e8m0 scale per block.

    Parameters
    ----------
    x : Tensor
        ``(rows, K)``, any floating dtype (computed in float32), finite; K must be even.
    block : int
        Elements per scale: 32 (MX v1.0; the only size the MX ops take).
    rule : {"floor", "rceil"}
        The shared-exponent rule (module docstring).

    Returns
    -------
    packed : Tensor
        ``(rows, K // 2)`` ``torch.float4_e2m1fn_x2``; byte ``i`` holds element ``2i`` in
        its low nibble and ``2i + 1`` in its high nibble. Elements are ``x / scale`` rounded
        to nearest-even on the e2m1 grid and saturated to +-6; negative values that round
        to zero keep their sign (code 8, -0).
    scale : Tensor
        As :func:`quantize_mxfp8`'s.

    Raises
    ------
    As :func:`quantize_mxfp8`, and ValueError for an odd K.

    Examples
    --------
    >>> packed, scale = quantize_mxfp4(torch.tensor([[0.5, -6.0]]))
    >>> hex(packed.view(torch.uint8).item()), scale.view(torch.uint8).item()
    ('0xf1', 127)
    """
    if isinstance(x, torch.Tensor) and x.dim() > 2:  # leading dims, as torchao's MXTensor takes them
        return _over_rows(quantize_mxfp4, x, block, rule)
    _check_quant_block(block)
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] % 2:
        raise ValueError(f"x must have an even number of columns K for e2m1 packing, "
                         f"got shape {tuple(x.shape)}")
    scaled, code = _scaled_blocks(x, block, E2M1_EMAX, rule, E2M1_MAX)
    a = scaled.abs().clamp(max=E2M1_MAX).unsqueeze(-1)
    # Magnitude code = how many midpoints lie below |v|, counting a tie only where
    # rounding up lands on the even code.
    down = torch.tensor(_E2M1_TIES_DOWN, dtype=torch.float32, device=a.device)
    up = torch.tensor(_E2M1_TIES_UP, dtype=torch.float32, device=a.device)
    mag = (a > down).sum(-1) + (a >= up).sum(-1)
    codes = (mag | (torch.signbit(scaled).to(mag.dtype) << 3)).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous().view(torch.float4_e2m1fn_x2), code.view(torch.float8_e8m0fnu)


def _expand_scale(scale: torch.Tensor, k: int, block: int) -> torch.Tensor:
    return e8m0_to_float(scale).repeat_interleave(block, dim=1)[:, :k]


def dequantize_mxfp8(data: torch.Tensor, scale: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """Dequantize MXFP8 to float32: ``data * 2^(scale_code - 127)`` per block.

    Parameters
    ----------
    data : Tensor
        ``(rows, K)`` ``torch.float8_e4m3fn``.
    scale : Tensor
        ``(rows, ceil(K / block))`` ``torch.float8_e8m0fnu``; code 255 makes its block NaN.
    block : int
        Elements per scale.

    Returns
    -------
    Tensor
        ``(rows, K)`` float32.

    Examples
    --------
    >>> x = torch.tensor([[3.0, -0.25, 96.0]])
    >>> torch.equal(dequantize_mxfp8(*quantize_mxfp8(x)), x)
    True
    """
    _check_block(block)
    _check_2d(data, "data", torch.float8_e4m3fn)
    k = data.shape[1]
    _check_scale(scale, k, block, "data", data)
    return data.to(torch.float32) * _expand_scale(scale, k, block)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """Dequantize packed MXFP4 to float32 ``(rows, 2 * packed.shape[1])``.

    Parameters
    ----------
    packed : Tensor
        ``(rows, K // 2)`` ``torch.float4_e2m1fn_x2``, low nibble = even element.
    scale : Tensor
        ``(rows, ceil(K / block))`` ``torch.float8_e8m0fnu``; code 255 makes its block NaN.
    block : int
        Elements per scale.

    Examples
    --------
    >>> x = torch.tensor([[1.5, -4.0, 0.0, 0.5]])
    >>> torch.equal(dequantize_mxfp4(*quantize_mxfp4(x)), x)
    True
    """
    _check_block(block)
    _check_2d(packed, "packed", torch.float4_e2m1fn_x2)
    rows, half = packed.shape
    k = 2 * half
    _check_scale(scale, k, block, "packed", packed)
    b = packed.view(torch.uint8)
    codes = torch.stack((b & 0x0F, b >> 4), dim=-1).reshape(rows, k)
    return e2m1_to_float(codes) * _expand_scale(scale, k, block)
