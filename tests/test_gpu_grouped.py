"""grouped_mm on a GPU (issue 45): the grouped decode GEMV and the grouped prefill tiles (the bf16
route) of every MX format against float64 with NaN-poisoned outputs (empty and single-row
experts, E = 1, experts past one token tile, a weight whose N is not a whole strip, bias, every
output dtype), the masked form, CUDA-graph replay with new routing, no host sync, and offs checked
on the device. CPU suite: tests/test_grouped.py."""

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import (FP16_SAFE_SCALES, error_bound, expert_stack, grouped_activations, grouped_reference, randn,
                      rel_err, rounding_err)

import persistent_gemm as pg

pytestmark = [pytest.mark.gpu]

CUDA = "cuda"
MX = ("mxfp4_weight_only", "mxfp8_weight_only", "fp8_fp4", "mxfp8")


def run_poisoned(fn):
    pg._C.set_poison_outputs(True)
    try:
        return fn()
    finally:
        pg._C.set_poison_outputs(False)


def assert_graph_replays_new_routing(call, route, av, w):
    """Capture ``call`` (warmed up on a side stream) under ``set_sync_debug_mode("error")``, so a host
    read of offs (or anything) on the op's path raises; then replay it after ``route(seed)`` rewrites
    offs in place, against float64 each time."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.set_sync_debug_mode("error")
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed in (1, 2, 3):
        counts = route(seed)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = grouped_reference(av, w, counts)
        assert rel_err(out, ref) <= error_bound(rounding_err(ref, torch.bfloat16), 1e-6), counts


# Row counts per expert: decode (a few experts with a row or two), top-k batches whose experts
# exceed one 8/16-row item, empty experts at both ends, E = 1, one expert of 200 rows.
COUNTS = {
    "decode": [0, 1, 0, 1, 1, 0, 0, 1],
    "batch16": [9, 0, 17, 3, 1, 12, 0, 22],
    "ends_empty": [0, 0, 5, 40, 0],
    "one_expert": [37],
    "wide": [200, 1],
}


@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("case", COUNTS, ids=str)
def test_grouped_matches_float64(fmt, case):
    counts = COUNTS[case]
    e, n, k = len(counts), 320, 1024  # N: two whole strips and a partial one
    pw, w = expert_stack(fmt, e, n, k, seed=e + n, device=CUDA)
    a, sa, av = grouped_activations(fmt, sum(counts), k, seed=len(case), device=CUDA)
    offs = torch.cumsum(torch.tensor(counts, device=CUDA), 0).to(torch.int32)
    bias = randn(e, n, torch.bfloat16, seed=5, device=CUDA)
    out = run_poisoned(lambda: pg.grouped_mm(a, pw, offs, scale_a=sa, bias=bias))
    ref = grouped_reference(av, w, counts, bias)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16 and not out.isnan().any()
    err, bound = rel_err(out, ref), error_bound(rounding_err(ref, torch.bfloat16), 1e-6)
    assert err <= bound, f"rel err {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("fmt", ["mxfp4_weight_only", "fp8_fp4"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16], ids=str)
def test_grouped_output_dtypes(fmt, out_dtype):
    counts = [3, 0, 6]
    center, spread = FP16_SAFE_SCALES if out_dtype == torch.float16 else (127, 20)
    pw, w = expert_stack(fmt, 3, 256, 512, seed=2, device=CUDA, center=center, spread=spread)
    a, sa, av = grouped_activations(fmt, sum(counts), 512, seed=3, device=CUDA)
    offs = torch.cumsum(torch.tensor(counts, device=CUDA), 0).to(torch.int32)
    out = pg.grouped_mm(a, pw, offs, scale_a=sa, out_dtype=out_dtype)
    ref = grouped_reference(av, w, counts)
    assert out.dtype == out_dtype
    assert rel_err(out, ref) <= error_bound(rounding_err(ref, out_dtype), 1e-6)


@pytest.mark.parametrize("fmt", MX)
def test_masked_form(fmt):
    e, rows, n, k = 4, 24, 256, 512
    pw, w = expert_stack(fmt, e, n, k, seed=9, device=CUDA)
    a, sa, av = grouped_activations(fmt, e * rows, k, seed=10, device=CUDA)
    counts = torch.tensor([0, 24, 3, 11], dtype=torch.int32, device=CUDA)
    out = pg.masked_grouped_mm(a.reshape(e, rows, k), pw, counts,
                               scale_a=None if sa is None else sa.reshape(e, rows, -1))
    assert out.shape == (e, rows, n)
    for i, c in enumerate(counts.tolist()):
        if c:
            ref = av.reshape(e, rows, k)[i, :c] @ w[i].t()
            assert rel_err(out[i, :c], ref) <= error_bound(rounding_err(ref, torch.bfloat16), 1e-6)
        assert (out[i, c:] == 0).all()


# The grouped prefill tiles (sm90a bf16 route, TileSchedule(grouped=True)), forced by name: experts
# of one row, of whole 128-row tiles and past them, empty ones at both ends, E = 1, and N past a
# whole 128-row weight tile.
TILE_FAMILY = {"mxfp4_weight_only": "bf16xe2m1", "mxfp8_weight_only": "bf16xe4m3", "fp8_fp4": "e4m3xe2m1",
               "mxfp8": "mxfp8"}
TILE_COUNTS = {
    "prefill": [130, 0, 256, 1, 77, 300],
    "ends_empty": [0, 0, 129, 5, 0],
    "one_expert": [260],
    "decode": [0, 1, 0, 2],
}


def tile_config(fmt, tokens=128):
    name = f"sm90a_{TILE_FAMILY[fmt]}_128x{tokens}x64_c1x1_sw8_row_grouped_coop_swapab_bf16route"
    if name not in pg.built_configs("sm90a"):
        pytest.skip(f"{name} is not built (PGEMM_KERNELS)")
    return name


@pytest.mark.parametrize("tokens", [128, 256])
@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("case", TILE_COUNTS, ids=str)
def test_grouped_tiles_match_float64(fmt, case, tokens):
    config = tile_config(fmt, tokens)
    counts = TILE_COUNTS[case]
    e, n, k = len(counts), 320, 1056  # N: 2.5 weight tiles; K: 33 blocks (a partial 64-K tile)
    pw, w = expert_stack(fmt, e, n, k, seed=e + 7, device=CUDA)
    a, sa, av = grouped_activations(fmt, sum(counts), k, seed=len(case) + 1, device=CUDA)
    offs = torch.cumsum(torch.tensor(counts, device=CUDA), 0).to(torch.int32)
    bias = randn(e, n, torch.bfloat16, seed=6, device=CUDA)
    out = run_poisoned(lambda: pg.grouped_mm(a, pw, offs, scale_a=sa, bias=bias, config=config))
    ref = grouped_reference(av, w, counts, bias)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16 and not out.isnan().any()
    err, bound = rel_err(out, ref), error_bound(rounding_err(ref, torch.bfloat16), 1e-6)
    assert err <= bound, f"rel err {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("fmt", ["mxfp4_weight_only", "mxfp8"])
def test_grouped_tiles_fp32_out_and_masked_form(fmt):
    config = tile_config(fmt)
    e, rows, n, k = 3, 150, 256, 512
    pw, w = expert_stack(fmt, e, n, k, seed=13, device=CUDA)
    a, sa, av = grouped_activations(fmt, e * rows, k, seed=14, device=CUDA)
    counts = torch.tensor([150, 0, 131], dtype=torch.int32, device=CUDA)
    out = pg.masked_grouped_mm(a.reshape(e, rows, k), pw, counts, out_dtype=torch.float32,
                               scale_a=None if sa is None else sa.reshape(e, rows, -1), config=config)
    assert out.shape == (e, rows, n) and out.dtype == torch.float32
    for i, c in enumerate(counts.tolist()):
        if c:
            ref = av.reshape(e, rows, k)[i, :c] @ w[i].t()
            assert rel_err(out[i, :c], ref) <= error_bound(rounding_err(ref, torch.float32), 1e-6)
        assert (out[i, c:] == 0).all()


def test_grouped_tiles_replay_new_routing_in_a_graph():
    config = tile_config("mxfp4_weight_only")
    e, n, k, rows = 4, 256, 512, 600
    pw, w = expert_stack("mxfp4_weight_only", e, n, k, seed=15, device=CUDA)
    a, sa, av = grouped_activations("mxfp4_weight_only", rows, k, seed=16, device=CUDA)
    offs = torch.zeros(e, dtype=torch.int32, device=CUDA)

    def route(seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        counts = torch.bincount(torch.randint(0, e, (rows,), generator=g) ** 2 % e, minlength=e)  # skewed
        offs.copy_(torch.cumsum(counts, 0).to(torch.int32))
        return counts.tolist()

    route(0)
    assert_graph_replays_new_routing(lambda: pg.grouped_mm(a, pw, offs, config=config), route, av, w)


def test_bf16_experts_match_float64():
    counts = [4, 0, 9]
    w = randn(3 * 128, 256, torch.bfloat16, seed=1, device=CUDA).reshape(3, 128, 256)
    a = randn(13, 256, torch.bfloat16, seed=2, device=CUDA)
    offs = torch.cumsum(torch.tensor(counts, device=CUDA), 0).to(torch.int32)
    bias = randn(3, 128, torch.bfloat16, seed=3, device=CUDA)
    out = pg.grouped_mm(a, w.transpose(1, 2), offs, bias=bias)
    ref = grouped_reference(a.double(), w.double(), counts, bias)
    # torch._grouped_mm rounds to bf16 before the bias is added: two roundings
    assert rel_err(out, ref) <= error_bound(2 * rounding_err(ref, torch.bfloat16), 1e-5)


@pytest.mark.parametrize("fmt", ["mxfp4_weight_only", "fp8_fp4"])
def test_graph_replay_with_new_routing_and_no_host_sync(fmt):
    e, n, k, rows = 8, 256, 512, 16
    pw, w = expert_stack(fmt, e, n, k, seed=11, device=CUDA)
    a, sa, av = grouped_activations(fmt, rows, k, seed=12, device=CUDA)
    offs = torch.zeros(e, dtype=torch.int32, device=CUDA)

    def route(seed):  # random counts summing to `rows`, written into offs in place
        g = torch.Generator(device="cpu").manual_seed(seed)
        experts = torch.randint(0, e, (rows,), generator=g)
        counts = torch.bincount(experts, minlength=e)
        offs.copy_(torch.cumsum(counts, 0).to(torch.int32))
        return counts.tolist()

    route(0)
    assert_graph_replays_new_routing(lambda: pg.grouped_mm(a, pw, offs, scale_a=sa), route, av, w)


@pytest.mark.parametrize("kernel", ["gemv", "tiles"])
def test_bad_offs_fails_the_launch_with_a_message(kernel):
    # offs is checked on the device (the GEMV: by its table's build; the tiles: by their
    # pre-pass): a bad one prints the entry and traps (the context is lost afterwards, so in a
    # child process).
    config = repr(tile_config("mxfp4_weight_only")) if kernel == "tiles" else None
    code = textwrap.dedent(f"""
        import torch, persistent_gemm as pg
        wq, ws = pg.quantize_mxfp4(torch.randn(4 * 128, 256, device="cuda"))
        pw = pg.prepare_weight(wq.reshape(4, 128, -1), ws.reshape(4, 128, -1), fmt="fp4")
        a = torch.randn(6, 256, device="cuda", dtype=torch.bfloat16)
        pg.grouped_mm(a, pw, torch.tensor([2, 1, 4, 6], dtype=torch.int32, device="cuda"), config={config})
        torch.cuda.synchronize()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "offs must be non-decreasing" in r.stdout + r.stderr and "offs[1] = 1" in r.stdout + r.stderr
