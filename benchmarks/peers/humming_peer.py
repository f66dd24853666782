"""humming (PyPI ``humming-kernels`` 0.1.19, vllm-project/humming) as an optional peer of bench_mx.py.

humming JIT-compiles (NVRTC) weight-only-quantized GEMMs; on SM90 with e4m3 activations it
dequantizes e2m1 / e4m3 weights to e4m3 in registers and runs FP8 WGMMA, applying 1x32
activation group scales (float32 on SM90: ``LayerConfig`` resolves an unset input-scale dtype
to float32 when block-scaled MMA is unavailable) and 1x32 e8m0 weight group scales.

Our operands -> humming's, converted once in :func:`make` (outside any timing):

* weights: humming packs elements LSB-first into int32 words (``pack_weight.cuh``: element i
  at bit ``i * bits``), which is exactly our little-endian byte layout (e2m1: element 2i in the
  low nibble; e4m3: one byte per element), so the bytes are reinterpreted as int32 (N, K*bits/32)
  without a copy. Codes are the standard e2m1 / e4m3fn encodings (``dtypes.torch_dtype_map``).
* weight scales: our e8m0 (N, K/32) as they are (``bs_dtype=float8e8m0``, group 32); humming's
  ``HummingLayer.transform`` then repacks weight and scales into its own layout (for e2m1 x e4m3
  it folds the e8m0 scales into the weight, ``use_fused_e8m0_scale``).
* activations: our e4m3 (M, K) as they are; scales e8m0 -> float32 exactly (2^(code-127)),
  row-major (M, K/32), multiplicative (humming's test runner dequantizes ``a * scale``).

The format was derived from reading humming's source (humming/layer.py, forward.py,
schema/humming.py, config/config.py, testing/runner.py), not yet run on a GPU: bench_mx.py
checks every peer's output against the emulation and prints MISMATCH if it is wrong.
"""

from __future__ import annotations

import torch

_B_DTYPE = {"mxfp8_mm": "float8e4m3", "fp8_fp4_mm": "float4e2m1"}


def available() -> bool:
    """True when humming and its runtime dependencies (cuda-python, jinja2) import."""
    try:
        import humming.layer  # noqa: F401
    except Exception:  # ImportError, or its import-time device probing failing
        return False
    return True


def _e8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    """Exact float32 2^(code - 127) (code 0 is the subnormal 2^-127, built from its bits)."""
    code = s.view(torch.uint8).to(torch.int32)
    bits = torch.where(code > 0, code << 23, torch.full_like(code, 0x00400000))
    return bits.view(torch.float32)


def make(op: str, xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor):
    """A zero-argument callable computing ``dequant(xq, xs) @ dequant(wq, ws).T`` as (M, N) bf16
    with humming, or None when ``op`` has no humming equivalent. ``xq`` (M, K) e4m3 with e8m0
    ``xs`` (M, K/32); ``wq`` (N, K) e4m3 (mxfp8_mm) or (N, K/2) float4_e2m1fn_x2 (fp8_fp4_mm) with
    e8m0 ``ws`` (N, K/32): the operands of bench_mx.py, as our quantizers produce them."""
    if op not in _B_DTYPE:
        return None
    from humming.layer import HummingLayer

    n, k = wq.shape[0], xq.shape[1]
    layer = HummingLayer(
        shape_n=n,
        shape_k=k,
        weight_config={"quant_method": "humming", "dtype": _B_DTYPE[op], "scale_dtype": "float8e8m0",
                       "group_size": 32},
        input_config={"quant_method": "humming", "dtype": "float8e4m3", "group_size": 32,
                      "quant_mode": "dynamic_group"},
        torch_dtype=torch.bfloat16,
    ).cuda()
    weight = wq.contiguous().view(torch.uint8).view(torch.int32)
    layer.load_from_tensors({"weight": weight, "weight_scale": ws.contiguous()})
    layer.transform()
    a, a_scale = xq.contiguous(), _e8m0_to_float(xs).contiguous()
    return lambda: layer(a, input_scale=a_scale)


def make_weight_only(fp4: bool, x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor):
    """A zero-argument callable computing ``x @ dequant(wq, ws).T`` as (M, N) bf16 with humming's
    bf16-activation kernel (no ``input_config``: the activations stay bf16). Operands as in
    :func:`make`; ``x`` (M, K) bf16."""
    from humming.layer import HummingLayer

    n, k = wq.shape[0], x.shape[1]
    layer = HummingLayer(
        shape_n=n,
        shape_k=k,
        weight_config={"quant_method": "humming", "dtype": "float4e2m1" if fp4 else "float8e4m3",
                       "scale_dtype": "float8e8m0", "group_size": 32},
        torch_dtype=torch.bfloat16,
    ).cuda()
    layer.load_from_tensors({"weight": wq.contiguous().view(torch.uint8).view(torch.int32),
                             "weight_scale": ws.contiguous()})
    layer.transform()
    a = x.contiguous()
    return lambda: layer(a)
