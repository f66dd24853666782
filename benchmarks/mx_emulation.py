"""The MX benchmark's emulated peers (bench_mx.py): torchao-style dequantization to bf16 and the
rowwise e4m3 requantization, in torch ops with no host synchronisation, so they can be
graph-captured."""

from __future__ import annotations

import torch

from persistent_gemm.quant import e8m0_to_float

def dequant_mxfp8_bf16(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    rows, k = q.shape  # K % 32 == 0 on every benchmark shape
    return (q.float().view(rows, k // 32, 32) * e8m0_to_float(s).unsqueeze(-1)).view(rows, k).to(torch.bfloat16)


def dequant_mxfp4_bf16(packed: torch.Tensor, s: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8)
    rows, k = b.shape[0], 2 * b.shape[1]
    vals = lut[torch.stack((b & 0x0F, b >> 4), dim=-1).view(rows, k).long()]  # element 2i: low nibble
    return (vals.view(rows, k // 32, 32) * e8m0_to_float(s).unsqueeze(-1)).view(rows, k).to(torch.bfloat16)


def rowwise_e4m3(d: torch.Tensor, s: torch.Tensor):
    """e4m3 with one fp32 scale per row: the row's largest MX block scale (a power of two)."""
    scale = e8m0_to_float(s.view(torch.uint8).amax(dim=1, keepdim=True).view(torch.float8_e8m0fnu))
    return (d / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale.contiguous()
