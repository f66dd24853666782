"""The MoE routing kernels (host/moe_routing.cuh) on a GPU against their CPU definitions
(csrc/moe_routing.cpp): moe_dispatch and moe_combine bit for bit, moe_activation within fp32's
expf; decode and prefill sizes (one CTA a row, many rows a CTA), E up to 256, int32 and int64
indices, NaN-poisoned outputs; CUDA-graph replay with new routing; bad indices fail the launch with
a message. CPU suite: tests/test_moe_routing.py."""

import subprocess
import sys
import textwrap

import pytest
import torch

import persistent_gemm as pg

pytestmark = [pytest.mark.gpu]

CUDA = "cuda"


@pytest.fixture(autouse=True)
def _poisoned():
    """Every output starts as all-ones bytes (NaN, -1): a value the kernels do not write shows."""
    pg._C.set_poison_outputs(True)
    yield
    pg._C.set_poison_outputs(False)


def routed(tokens, e, top_k, seed, dtype=torch.int64, device=CUDA):
    g = torch.Generator().manual_seed(seed)
    # a skewed routing: a few experts take most slots, some take none
    hot = torch.randint(0, e, (tokens, top_k), generator=g) % max(1, e // 3)
    cold = torch.randint(0, e, (tokens, top_k), generator=g)
    pick = torch.rand(tokens, top_k, generator=g) < 0.7
    return torch.where(pick, hot, cold).to(dtype).to(device)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("tokens,e,top_k,d", [(1, 32, 4, 2880), (16, 32, 4, 2880), (128, 128, 4, 520),
                                              (4096, 32, 4, 2880), (2000, 256, 8, 136), (3, 1, 1, 8)])
def test_dispatch_matches_the_cpu_bit_for_bit(tokens, e, top_k, d, index_dtype):
    indices = routed(tokens, e, top_k, seed=tokens + e, dtype=index_dtype)
    x = torch.randn(tokens, d, device=CUDA).bfloat16()
    scales = torch.randint(0, 255, (tokens, d // 32 + 1), device=CUDA, dtype=torch.uint8)  # an odd row size
    offs, slot_rows, (xs, ss) = pg.moe_dispatch(indices, e, x, scales)
    ref = pg.moe_dispatch(indices.cpu(), e, x.cpu(), scales.cpu())
    torch.cuda.synchronize()
    assert torch.equal(offs.cpu(), ref[0]) and torch.equal(slot_rows.cpu(), ref[1])
    assert torch.equal(xs.cpu(), ref[2][0]) and torch.equal(ss.cpu(), ref[2][1])


def test_dispatch_of_strided_rows():
    indices = routed(50, 16, 2, seed=1)
    wide = torch.randn(50, 300, device=CUDA).bfloat16()
    x = wide[:, 10:266]  # rows 600 bytes apart, 512 bytes each
    _, _, (xs,) = pg.moe_dispatch(indices, 16, x)
    assert torch.equal(xs.cpu(), pg.moe_dispatch(indices.cpu(), 16, x.cpu())[2][0])


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("tokens,top_k,d", [(1, 4, 2880), (16, 4, 2880), (4096, 4, 2880), (70000, 1, 16)])
def test_combine_matches_the_cpu_bit_for_bit(tokens, top_k, d, w_dtype):
    g = torch.Generator().manual_seed(tokens)
    y = torch.randn(tokens * top_k, d, generator=g).bfloat16().to(CUDA)
    slot_rows = torch.randperm(tokens * top_k, generator=g).int().to(CUDA)
    w = (torch.rand(tokens, top_k, generator=g) + 0.1).to(w_dtype).to(CUDA)
    out = pg.moe_combine(y, slot_rows, w, out_dtype=torch.float32)
    assert torch.equal(out.cpu(), pg.moe_combine(y.cpu(), slot_rows.cpu(), w.cpu(), out_dtype=torch.float32))


@pytest.mark.parametrize("kind", ["silu", "gpt_oss"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_activation_matches_the_cpu(kind, out_dtype):
    h = (torch.randn(70000, 2 * 40) * 6).bfloat16()  # more rows than a grid's y extent
    h[7, 3] = float("nan")
    out = pg.moe_activation(h.to(CUDA), kind, out_dtype=out_dtype).cpu()
    ref = pg.moe_activation(h, kind, out_dtype=out_dtype)
    assert torch.isnan(out[7, 3])
    # the same fp32 formula; CUDA's expf is within 2 ulp of the CPU's, so at most one rounding apart
    torch.testing.assert_close(out, ref, rtol=2**-7 if out_dtype == torch.bfloat16 else 2**-20, atol=1e-6,
                               equal_nan=True)


def test_a_layer_replays_new_routing_in_a_cuda_graph():
    tokens, e, top_k, d = 16, 32, 4, 256
    x = torch.randn(tokens, d, device=CUDA).bfloat16()
    indices = routed(tokens, e, top_k, seed=3)
    weights = torch.rand(tokens, top_k, device=CUDA)

    def step():
        offs, slot_rows, (xs,) = pg.moe_dispatch(indices, e, x)
        h = torch.cat((xs, xs), 1)
        return offs, pg.moe_combine(pg.moe_activation(h, "silu"), slot_rows, weights)

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        offs, out = step()
    indices.copy_(routed(tokens, e, top_k, seed=4))
    weights.copy_(torch.rand(tokens, top_k, device=CUDA))
    out.fill_(float("nan"))
    g.replay()
    eager_offs, eager = step()
    torch.cuda.synchronize()
    assert torch.equal(offs, eager_offs) and torch.equal(out, eager)


@pytest.mark.parametrize("op,message", [
    ("pg.moe_dispatch(torch.tensor([[1, 2], [0, 9]], device='cuda'), 8, torch.zeros(2, 64, device='cuda'))",
     "router_indices[1][1] = 9 is not an expert index in [0, 8)"),
    ("pg.moe_combine(torch.zeros(4, 64, device='cuda'), torch.tensor([0, 5, 1, 2], dtype=torch.int32, device='cuda'), "
     "torch.ones(2, 2, device='cuda'))", "slot_rows[1] = 5 is not a row of y (4 rows)"),
])
def test_device_values_are_checked_on_the_device(op, message):
    # The kernel prints the entry and traps (the context is lost afterwards: a child process).
    code = textwrap.dedent(f"""
        import torch, persistent_gemm as pg
        {op}
        torch.cuda.synchronize()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and message in r.stdout + r.stderr, r.stdout + r.stderr
