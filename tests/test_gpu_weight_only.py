"""Weight-only MX on a GPU (issue 24): ``pg.mm(x, prepared_weight)`` on CUDA tensors against
float64, NaN-poisoned outputs, bf16 and fp16 activations, both weight formats. Until the fused
kernels land the op runs its reference path there (fp64 accumulation): these tests pin its
semantics and device handling, and will hold the kernels to the same bound."""

import pytest
import torch
from conftest import e8m0_scales, error_bound, mx_blocks, poisoned, randn, rel_err, rounding_err

import persistent_gemm as pg

pytestmark = [pytest.mark.gpu]

CUDA = "cuda"


@pytest.mark.parametrize("fmt", ["mxfp8", "fp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 8191, 256), (129, 300, 992)])
def test_weight_only_matches_float64_on_cuda(fmt, dtype, m, n, k):
    quantize = pg.quantize_mxfp8 if fmt == "mxfp8" else pg.quantize_mxfp4
    wq, _ = quantize(randn(n, k, torch.float32, seed=n, device=CUDA))
    center, spread = (119, 4) if dtype == torch.float16 else (127, 20)
    ws = e8m0_scales(n, mx_blocks(k), seed=k, device=CUDA, center=center, spread=spread)
    deq = pg.dequantize_mxfp8 if fmt == "mxfp8" else pg.dequantize_mxfp4
    pw = pg.prepare_weight(wq, ws, fmt=fmt)
    x = randn(m, k, dtype, seed=m, device=CUDA)
    ref = x.double() @ deq(wq, ws).double().t()
    out = poisoned(lambda: pg.mm(x, pw), m, n, dtype)
    assert out.device.type == "cuda" and out.dtype == dtype
    err, bound = rel_err(out, ref), error_bound(rounding_err(ref, dtype), 1e-6)
    assert err <= bound, f"rel err {err:.3g} > {bound:.3g}"
