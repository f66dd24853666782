"""Weight-only MX on a GPU (issue 24): ``pg.mm(x, prepared_weight)`` on CUDA tensors against
float64, NaN-poisoned outputs, bf16 activations (the fused kernels where built) and fp16 ones (the
exact reference, which warns once), both weight formats, CUDA-graph replay of swapped Linears.
The kernels' own suite is tests/test_gpu_weight_only_kernels.py."""

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


@pytest.mark.parametrize("fmt", ["mxfp8_weight_only", "mxfp4_weight_only"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_swapped_linear_replays_in_a_cuda_graph(fmt, dtype):
    # fp16 activations take the op's reference path; its e2m1 decode once copied a host table,
    # which CUDA-graph capture refuses. Both paths capture and replay to the eager result.
    from persistent_gemm import nn as pgnn

    model = pgnn.quantize_(torch.nn.Sequential(torch.nn.Linear(512, 320)).to(CUDA, dtype), fmt)
    x = randn(4, 512, dtype, seed=5, device=CUDA)
    with torch.no_grad():
        eager = model(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(x)
        out.fill_(float("nan"))
        g.replay()
    torch.cuda.synchronize()
    assert out.dtype == dtype and not out.isnan().any()
    # cuBLAS may pick another algorithm under capture (the fp16 path's fp32 sums): one rounding
    torch.testing.assert_close(out, eager, rtol=2**-9, atol=1e-4)


def test_fp16_activations_say_they_take_the_reference():
    # Once per process, so run it in a fresh one.
    import subprocess
    import sys

    code = ("import warnings, torch, persistent_gemm as pg\n"
            "w, s = pg.quantize_mxfp4(torch.randn(256, 512, device='cuda'))\n"
            "pw = pg.prepare_weight(w, s, fmt='fp4')\n"
            "with warnings.catch_warnings(record=True) as got:\n"
            "    warnings.simplefilter('always')\n"
            "    for dtype in (torch.float16, torch.float16, torch.bfloat16):\n"
            "        pg.mm(torch.randn(4, 512, device='cuda', dtype=dtype), pw)\n"
            "torch.cuda.synchronize()\n"
            "print('\\n'.join(str(x.message) for x in got))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # A C++ warning reaches Python's warnings or, outside a Python-bound call, stderr: once either way.
    assert (out.stdout + out.stderr).count("fp16 activations run the exact reference") == 1, out.stdout + out.stderr
