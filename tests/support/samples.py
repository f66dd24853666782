"""The ops' references, call conventions and shared sample inputs."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import persistent_gemm as pg

from .common import OPS
from .operands import fp8_fp4_operands, fp8_pair, fp32_scales, mxfp8_operands, operand, randn

# -- references -----------------------------------------------------------------------------------
def default_out_dtype(op: str, args) -> torch.dtype:
    return args[0].dtype if op == "mm" else torch.bfloat16


def reference(op: str, args) -> torch.Tensor:
    """The float64 product an op's inputs define, dequantized independently of the op (the
    Python MX dequantizers, not the C++ references)."""
    if op == "mm":
        a, b = args
        return a.double() @ b.double()
    if op == "scaled_mm":
        a, b, sa, sb = args
        return (a.double() * sa.double()) @ (b.double() * sb.double())
    a, sa, b, sb = args
    da = pg.dequantize_mxfp8(a, sa).double()
    if op == "mxfp8_mm":
        db = pg.dequantize_mxfp8(b.t(), sb).double()  # (N, K)
    else:
        db = pg.dequantize_mxfp4(b.t(), sb).double()
    return da @ db.t()


def op_fn(op: str):
    return getattr(torch.ops.persistent_gemm, op).default


def call_args(op: str, args: tuple) -> tuple:
    """``args`` in the op's positional order. The tests keep an MX operand with its scale,
    ``(a, scale_a, b, scale_b)`` (or ``(a, scale_a, prepared_weight)``); the MX ops take
    torch._scaled_mm's order, ``(a, b, scale_a, scale_b)`` (``(a, prepared_weight, scale_a)``).
    Other ops' tuples are already in their order."""
    if op not in ("mxfp8_mm", "fp8_fp4_mm"):
        return tuple(args)
    if len(args) == 3:
        a, sa, pw = args
        return a, pw, sa
    a, sa, b, sb, *rest = args
    return (a, b, sa, sb, *rest)


# -- sample inputs --------------------------------------------------------------------------------
_MM_SHAPES = [(24, 17, 40), (7, 129, 33), (129, 31, 95), (1, 64, 1), (33, 100, 64), (64, 48, 1000)]
_SCALED_SHAPES = [(24, 17, 64), (7, 129, 33), (129, 7, 257), (33, 100, 80)]
_MXFP8_SHAPES = [(24, 17, 64), (7, 129, 33), (1, 5, 31), (33, 100, 100)]  # K % 32 != 0 included
_FP4_SHAPES = [(24, 17, 64), (7, 129, 32), (33, 100, 96)]


def sample_inputs(op: str, device="cpu") -> Iterator[tuple[tuple, dict]]:
    """Representative valid inputs of ``op`` as ``(args, kwargs)``, tensors positional, for
    ``torch.ops.persistent_gemm.<op>.default(*args, **kwargs)`` or the typed wrapper. Covers
    tails (M, N, K off tile multiples; K % 32 != 0 for mxfp8), every out dtype (None: the
    default), both layouts of each mm operand, tensorwise and rowwise scales in both
    accumulation modes, quantized and random wide-range MX scales."""
    if op == "mm":
        i = 0
        for dtype in (torch.bfloat16, torch.float16):
            other16 = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
            for layout, out in zip(("rr", "rc", "cr", "cc"), (None, torch.float32, other16, dtype)):
                m, n, k = _MM_SHAPES[i % len(_MM_SHAPES)]
                a = operand(m, k, dtype, layout[0] == "r", seed=10 + i, device=device)
                b = operand(k, n, dtype, layout[1] == "r", seed=50 + i, device=device)
                i += 1
                yield (a, b), {"out_dtype": out}
    elif op == "scaled_mm":
        i = 0
        for rowwise in (False, True):
            for out in (None, torch.bfloat16, torch.float16, torch.float32):
                m, n, k = _SCALED_SHAPES[i % len(_SCALED_SHAPES)]
                a, b = fp8_pair(m, n, k, seed=100 + i, device=device)
                sa, sb = fp32_scales(m, n, rowwise, seed=i, device=device)
                i += 1
                yield (a, b, sa, sb), {"out_dtype": out, "use_fast_accum": bool(i % 2 == 0)}
    elif op == "mxfp8_mm":
        outs = (None, torch.float32, torch.float16, torch.bfloat16)  # fp16 on a quantized sample
        for i, ((m, n, k), out) in enumerate(zip(_MXFP8_SHAPES, outs)):
            if i % 2 == 0:  # the quantizer, rows spanning 6 decades (fp16 out fits)
                rows = torch.logspace(-4, 2, m, device=device).unsqueeze(1)
                xq, xs = pg.quantize_mxfp8(randn(m, k, torch.float32, 200 + i, device) * rows)
                wq, ws = pg.quantize_mxfp8(randn(n, k, torch.float32, 300 + i, device))
                yield (xq, xs, wq.t(), ws), {"out_dtype": out}
            else:  # random data under random wide-range scales
                yield mxfp8_operands(m, n, k, seed=400 + i, device=device), {"out_dtype": out}
    elif op == "fp8_fp4_mm":
        outs = (None, torch.float32, torch.float16, torch.bfloat16)  # fp16 on a quantized sample
        for i, ((m, n, k), out) in enumerate(zip(_FP4_SHAPES + [_FP4_SHAPES[0]], outs)):
            if i % 2 == 0:
                xq, xs = pg.quantize_mxfp8(randn(m, k, torch.float32, 500 + i, device))
                wq, ws = pg.quantize_mxfp4(randn(n, k, torch.float32, 600 + i, device))
                yield (xq, xs, wq.t(), ws), {"out_dtype": out}
            else:
                yield fp8_fp4_operands(m, n, k, seed=700 + i, device=device), {"out_dtype": out}
    else:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")


def _describe(op: str, index: int, args, kwargs) -> str:
    """A readable id for one sample: MxNxK, out dtype, layouts or scale kind."""
    m, k = args[0].shape
    n = args[2 if op in ("mxfp8_mm", "fp8_fp4_mm") else 1].shape[1]
    out = str(kwargs.get("out_dtype") or "default").replace("torch.", "")
    if op == "mm":
        lay = "".join("c" if t.stride(0) == 1 and t.stride(1) != 1 else "r" for t in args)
        extra = f"{str(args[0].dtype).replace('torch.', '')}-{lay}"
    elif op == "scaled_mm":
        extra = ("rowwise" if args[2].numel() > 1 else "tensorwise") + ("-fastacc" if kwargs.get("use_fast_accum") else "")
    else:
        extra = "quantized" if index % 2 == 0 else "wide_scales"  # as sample_inputs alternates
    return f"{m}x{n}x{k}-{out}-{extra}"


def sample_cases(ops=OPS) -> list:
    """``pytest.param(op, index)`` for every sample of every op, with readable ids, built on
    the CPU at collection; a test gets the tensors on its device with :func:`nth_sample`."""
    if not pg.extension_available():
        return []
    return [pytest.param(op, i, id=f"{op}-{i}-{_describe(op, i, args, kw)}")
            for op in ops for i, (args, kw) in enumerate(sample_inputs(op))]


def nth_sample(op: str, index: int, device="cpu") -> tuple[tuple, dict]:
    for i, sample in enumerate(sample_inputs(op, device)):
        if i == index:
            return sample
    raise IndexError(f"{op} has no sample {index}")
