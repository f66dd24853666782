"""The fake and CPU kernels of ``torch.ops.persistent_gemm.quantized_linear`` (schema and CUDA
entry in csrc/: ops.cpp, quantize.cpp): one swapped persistent_gemm.nn Linear whose activations
are quantized per call, in one op call. Kept apart from _ops.py, the four GEMM ops' Python face."""

from __future__ import annotations

import torch

from ._ops import _LIB, _check_2d, _check_devices, _check_quantizer_input, _out, _result
from .quant import _rowwise_e4m3_reference, quantize_mxfp8_reference

_LINEAR_FORMATS = ("fp8_rowwise", "mxfp8", "fp8_fp4")


def _linear_parts(format, rule):
    """quantized_linear's two definitions for ``format``: the activation quantizer (torch ops,
    any device) and the GEMM op it feeds (with its scale layouts)."""
    torch._check(format in _LINEAR_FORMATS,
                 lambda: f"quantized_linear: format must be one of {_LINEAR_FORMATS}, got {format!r}")
    if format == "fp8_rowwise":
        return _rowwise_e4m3_reference, torch.ops.persistent_gemm.scaled_mm.default
    op = torch.ops.persistent_gemm.mxfp8_mm if format == "mxfp8" else torch.ops.persistent_gemm.fp8_fp4_mm
    return (lambda x: quantize_mxfp8_reference(x, rule=rule)), op.default


def _check_linear_k(x, weight_q):
    """x (rows, K) against the prepared weight (N, K), or (N, K/2) packed e2m1 (quantize.cpp's rule)."""
    _check_2d("weight_q", weight_q)
    k = weight_q.shape[1] * (2 if weight_q.dtype == torch.float4_e2m1fn_x2 else 1)
    torch._check(x.shape[1] == k, lambda: f"quantized_linear: x has K = {x.shape[1]}, weight_q K = {k}")


def composed(x, weight_q, weight_scale, format, out_dtype, bias, rule, use_fast_accum, config):
    """The definition: the format's activation quantizer (torch ops), then its GEMM op. The CPU
    kernel below, and nn.Linear's path for activations the quantizer kernels do not take (the CUDA
    entry runs the quantizer kernel, bit for bit the same, and the same op's CUDA entry)."""
    quantize, gemm = _linear_parts(format, rule)
    xq, xs = quantize(x)
    if format == "fp8_rowwise":
        return gemm(xq, weight_q.t(), xs, weight_scale, out_dtype, use_fast_accum, config, bias)
    return gemm(xq, weight_q.t(), xs, weight_scale, out_dtype, "plain", config, "blocked", bias)


@torch.library.impl(f"{_LIB}::quantized_linear", "CPU")
def _quantized_linear_cpu(x, weight_q, weight_scale, format, out_dtype=None, bias=None, rule="floor",
                          use_fast_accum=False, config=None):
    _check_devices("quantized_linear", x=x, weight_q=weight_q, weight_scale=weight_scale, bias=bias)
    _check_quantizer_input(x)
    _check_linear_k(x, weight_q)
    return composed(x, weight_q, weight_scale, format, out_dtype, bias, rule, use_fast_accum, config)


@torch.library.register_fake(f"{_LIB}::quantized_linear")
def _quantized_linear_fake(x, weight_q, weight_scale, format, out_dtype=None, bias=None, rule="floor",
                           use_fast_accum=False, config=None):
    _check_devices("quantized_linear", x=x, weight_q=weight_q, weight_scale=weight_scale, bias=bias)
    _check_quantizer_input(x)
    _linear_parts(format, rule)
    _check_linear_k(x, weight_q)
    return _result(x, weight_q.shape[0], _out(out_dtype, torch.bfloat16), bias)
