"""Tests for persistent_gemm.quant (OCP MX v1.0 MXFP8 / MXFP4 reference quantization).

The strongest check is ``_reference``: an independent, brute-force implementation (Python
``math.frexp`` per block, nearest point of the full element grid with ties to the even code,
all in float64) that the vectorized module must match bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from persistent_gemm import quant
from persistent_gemm.quant import (
    dequantize_mxfp4,
    dequantize_mxfp8,
    e2m1_to_float,
    e8m0_to_float,
    quantize_mxfp4,
    quantize_mxfp8,
)

E2M1_EXPECTED = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def codes_of(scale: torch.Tensor) -> torch.Tensor:
    return scale.view(torch.uint8).to(torch.int64)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8)
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1)


def varied(rows: int, k: int, seed: int, lo: int = -30, hi: int = 30) -> torch.Tensor:
    """Normal values with a different power-of-two magnitude per row and per element block."""
    g = gen(seed)
    x = torch.randn(rows, k, generator=g)
    row_exp = torch.randint(lo, hi + 1, (rows, 1), generator=g)
    blk_exp = torch.randint(-3, 4, (rows, -(-k // 32)), generator=g).repeat_interleave(32, 1)[:, :k]
    return x * torch.exp2((row_exp + blk_exp).float())


def _grid(fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """All non-negative finite element values (float64) and their codes."""
    if fmt == "e4m3":
        codes = torch.arange(0, 127, dtype=torch.uint8)  # 0x7F is NaN
        vals = codes.view(torch.float8_e4m3fn).to(torch.float64)
    else:
        codes = torch.arange(0, 8, dtype=torch.uint8)
        vals = torch.tensor(E2M1_EXPECTED[:8], dtype=torch.float64)
    return vals, codes.to(torch.int64)


def _reference(x: torch.Tensor, fmt: str, block: int = 32):
    """Brute force: per-block E via math.frexp, nearest grid point, ties to even code."""
    emax, vmax = (8, 448.0) if fmt == "e4m3" else (2, 6.0)
    x64 = x.to(torch.float32).to(torch.float64)
    rows, k = x64.shape
    nb = -(-k // block)
    scode = torch.zeros(rows, nb, dtype=torch.int64)
    s = torch.zeros(rows, k, dtype=torch.float64)
    for r in range(rows):
        for b in range(nb):
            amax = max(abs(v) for v in x64[r, b * block:(b + 1) * block].tolist())
            e = 0 if amax == 0 else min(max(math.frexp(amax)[1] - 1 - emax, -127), 127)
            scode[r, b] = 0 if amax == 0 else e + 127
            s[r, b * block:(b + 1) * block] = math.ldexp(1.0, int(scode[r, b]) - 127)
    v = (x64 / s).abs().clamp(max=vmax)
    vals, codes = _grid(fmt)
    d = (v.unsqueeze(-1) - vals).abs()
    best = d.min(dim=-1, keepdim=True).values
    # Among equally near grid points pick the even code (mantissa LSB 0).
    nearest = d == best
    cand = nearest & ((codes % 2 == 0) | (nearest.sum(-1, keepdim=True) == 1))
    mag = torch.where(cand, codes, torch.full_like(codes, 10**6)).min(dim=-1).values
    sign = torch.signbit(x64).to(torch.int64)
    elem = mag | (sign << (7 if fmt == "e4m3" else 3))
    return elem, scode


# --------------------------------------------------------------------------- decoding tables


def test_e2m1_all_16_codes_decode():
    got = e2m1_to_float(torch.arange(16, dtype=torch.uint8))
    assert got.dtype == torch.float32
    assert got.tolist() == E2M1_EXPECTED
    assert torch.signbit(got).tolist() == [c >= 8 for c in range(16)]  # code 8 is -0


def test_e2m1_to_float_rejects_bad_codes():
    with pytest.raises(ValueError, match="codes"):
        e2m1_to_float(torch.tensor([3, 16], dtype=torch.uint8))
    with pytest.raises(TypeError, match="codes"):
        e2m1_to_float(torch.tensor([3]))


def test_e8m0_extremes_and_all_codes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = e8m0_to_float(codes.view(torch.float8_e8m0fnu))
    assert got.dtype == torch.float32
    assert got[0].item() == 2.0**-127
    assert got[127].item() == 1.0
    assert got[254].item() == 2.0**127
    assert math.isnan(got[255].item())
    assert got[:255].tolist() == [math.ldexp(1.0, c - 127) for c in range(255)]
    with pytest.raises(TypeError, match="scale"):
        e8m0_to_float(codes)


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("seed", range(4))
def test_mxfp8_exactly_representable_round_trips(seed):
    g = gen(seed)
    rows, k = 5, 96
    codes = torch.randint(0, 256, (rows, k), generator=g, dtype=torch.int64)
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes).to(torch.uint8)  # drop NaNs
    vals = codes.view(torch.float8_e4m3fn).float()
    # Pin each block's amax to 448: a lower amax with mantissa 1.875 (e.g. 240) would be
    # scaled to 480 and saturate (see test_e4m3_block_amax_mantissa_1_875_saturates).
    vals[:, 0::32] = torch.where(vals[:, 0::32] < 0, -448.0, 448.0)
    e = torch.randint(-40, 41, (rows, k // 32), generator=g).repeat_interleave(32, 1)
    x = vals * torch.exp2(e.float())
    data, scale = quantize_mxfp8(x)
    assert data.dtype == torch.float8_e4m3fn and data.shape == (rows, k)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (rows, 3)
    assert torch.equal(dequantize_mxfp8(data, scale), x)


@pytest.mark.parametrize("seed", range(4))
def test_mxfp4_exactly_representable_round_trips(seed):
    g = gen(seed)
    rows, k = 6, 64
    codes = torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)
    e = torch.randint(-40, 41, (rows, k // 32), generator=g).repeat_interleave(32, 1)
    x = e2m1_to_float(codes) * torch.exp2(e.float())
    packed, scale = quantize_mxfp4(x)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (rows, k // 2)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (rows, 2)
    dq = dequantize_mxfp4(packed, scale)
    assert torch.equal(dq, x)
    assert torch.equal(torch.signbit(dq), torch.signbit(x))


def test_e2m1_round_to_nearest_even_ties():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    near = [0.26, 0.74, 1.24, 1.76, 2.49, 3.51, 4.99, 5.01]
    near_want = [0.5, 0.5, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    row = ties + [-t for t in ties] + near + [7.9, -7.0]  # amax 7.9 -> scale 2^0
    x = torch.tensor([row])
    packed, scale = quantize_mxfp4(x)
    assert codes_of(scale).tolist() == [[127]]
    expect = want + [-w for w in want] + near_want + [6.0, -6.0]
    assert dequantize_mxfp4(packed, scale)[0].tolist() == expect


def test_e4m3_round_to_nearest_even_ties_and_subnormals():
    # amax 500 -> floor(log2) = 8 -> scale 2^0, so these are the element values themselves.
    row = [500.0, 17.0, 19.0, 2.0**-10, 3 * 2.0**-10, 1.0625, 1.1875, 464.0, -300.0]
    want = [448.0, 16.0, 20.0, 0.0, 2.0**-8, 1.0, 1.25, 448.0, -288.0]
    data, scale = quantize_mxfp8(torch.tensor([row]))
    assert codes_of(scale).tolist() == [[127]]
    assert data.float()[0].tolist() == want


def test_e4m3_block_amax_mantissa_1_875_saturates():
    # The spec rule maps amax 240 = 1.875 * 2^7 to E = -1, so 240 becomes 480 > 448 and
    # saturates: an e4m3-representable block amax is not always reproduced exactly.
    data, scale = quantize_mxfp8(torch.tensor([[240.0, 3.0]]))
    assert codes_of(scale).item() == 126
    assert dequantize_mxfp8(data, scale).tolist() == [[224.0, 3.0]]


# --------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("k", [1, 31, 32, 33, 100])
def test_mxfp8_matches_reference(k):
    x = varied(4, k, seed=k)
    data, scale = quantize_mxfp8(x)
    elem, scode = _reference(x, "e4m3")
    assert scale.shape == (4, -(-k // 32))
    assert torch.equal(codes_of(scale), scode)
    assert torch.equal(data.view(torch.uint8).to(torch.int64), elem)


@pytest.mark.parametrize("k", [2, 30, 32, 34, 100])
def test_mxfp4_matches_reference(k):
    x = varied(4, k, seed=100 + k)
    packed, scale = quantize_mxfp4(x)
    elem, scode = _reference(x, "e2m1")
    assert torch.equal(codes_of(scale), scode)
    assert torch.equal(unpack(packed).to(torch.int64), elem)


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(["e4m3", "e2m1"]),
    rows=st.integers(1, 3),
    half_k=st.integers(1, 40),
    data=st.data(),
)
def test_matches_reference_on_arbitrary_float32(fmt, rows, half_k, data):
    k = 2 * half_k
    vals = data.draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                              min_size=rows * k, max_size=rows * k))
    assume(any(v != 0 for v in vals))
    x = torch.tensor(vals, dtype=torch.float32).reshape(rows, k)
    elem, scode = _reference(x, fmt)
    if fmt == "e4m3":
        d, s = quantize_mxfp8(x)
        got = d.view(torch.uint8).to(torch.int64)
    else:
        p, s = quantize_mxfp4(x)
        got = unpack(p).to(torch.int64)
    assert torch.equal(codes_of(s), scode)
    assert torch.equal(got, elem)


# --------------------------------------------------------------------------- error bounds


@pytest.mark.parametrize("k", [1, 31, 33, 100, 256])
def test_mxfp8_round_trip_error_bound(k):
    x = varied(16, k, seed=7 * k)
    data, scale = quantize_mxfp8(x)
    dq = dequantize_mxfp8(data, scale)
    s = e8m0_to_float(scale).repeat_interleave(32, 1)[:, :k]
    v = (x / s).abs()
    err = (x - dq).abs()
    normal = v >= 2.0**-6
    # 3 mantissa bits: RNE error <= 2^-4 relative; saturation of (448, 512) to 448 < 2^-3.
    assert torch.all(err[normal] <= 2.0**-3 * x.abs()[normal])
    unsat = normal & (v <= 448)
    assert torch.all(err[unsat] <= 2.0**-4 * x.abs()[unsat])
    # Subnormal spacing is 2^-9 of the scale, so at most half of that.
    assert torch.all(err[~normal] <= 2.0**-10 * s[~normal])
    assert torch.count_nonzero(err) > 0


@pytest.mark.parametrize("k", [2, 32, 34, 100, 256])
def test_mxfp4_round_trip_error_bound(k):
    x = varied(16, k, seed=11 * k)
    packed, scale = quantize_mxfp4(x)
    dq = dequantize_mxfp4(packed, scale)
    s = e8m0_to_float(scale).repeat_interleave(32, 1)[:, :k]
    v = (x / s).abs()
    err = (x - dq).abs()
    # Half-spacing of the e2m1 grid is 0.25 below 2, then 0.5 and 1: at most |v|/4 for
    # |v| >= 1; saturating (6, 8) to 6 also loses < |v|/4. Below 1 the spacing is 0.5.
    assert torch.all(err <= torch.maximum(x.abs() / 4, s / 4))
    assert torch.all(err[v < 1] <= s[v < 1] / 4)
    # Block-wise: the scaled amax is below 8, so no error exceeds 2 * scale.
    assert torch.all(err < 2 * s)


# --------------------------------------------------------------------------- the scale rule


def test_scale_rule_mxfp8_exact_top_of_range():
    g = gen(1)
    x = torch.rand(2, 64, generator=g) * 400 * 32
    x[0, 5] = -448.0 * 32  # amax 448 * 2^5 -> E = 13 - 8 = 5
    x[1] *= 2.0**-25
    x[1, 40] = 448.0 * 2.0**-20  # -> E = -20
    data, scale = quantize_mxfp8(x)
    assert codes_of(scale)[0, 0].item() == 132
    assert codes_of(scale)[1, 1].item() == 127 - 20
    assert data[0, 5].float().item() == -448.0


def test_scale_rule_mxfp4():
    g = gen(2)
    x = (torch.rand(1, 64, generator=g) * 2 - 1) * 0.7
    x[0, 3] = 6 * 2.0**-3  # amax 0.75 -> floor(log2) = -1 -> E = -3
    x[0, 40] = 8.0 + 1e-3  # amax just above 8 -> E = 1, 8.001 / 2 rounds to 4
    packed, scale = quantize_mxfp4(x)
    assert codes_of(scale).tolist() == [[124, 128]]
    dq = dequantize_mxfp4(packed, scale)
    assert dq[0, 3].item() == 0.75 and dq[0, 40].item() == 8.0


def test_zero_block_gets_code_zero_and_zero_elements():
    g = gen(3)
    x = torch.randn(2, 96, generator=g)
    x[1, 32:64] = 0.0
    x[1, 40] = -0.0
    data, scale = quantize_mxfp8(x)
    assert codes_of(scale)[1, 1].item() == 0
    assert torch.count_nonzero(data[1, 32:64].float()) == 0
    assert (codes_of(scale)[0] > 0).all() and torch.count_nonzero(data[0].float()) > 0
    packed, scale4 = quantize_mxfp4(x)
    assert codes_of(scale4)[1, 1].item() == 0
    assert torch.count_nonzero(dequantize_mxfp4(packed, scale4)[1, 32:64]) == 0


@pytest.mark.parametrize("amax, code, top", [(500.0, 127, 448.0), (511.99, 127, 448.0),
                                             (512.0, 128, 256.0), (256.0, 127, 256.0)])
def test_overflowing_elements_saturate_e4m3(amax, code, top):
    g = gen(4)
    x = torch.rand(1, 32, generator=g) * 200
    x[0, 7] = amax
    data, scale = quantize_mxfp8(x)
    assert codes_of(scale).item() == code
    assert data[0, 7].float().item() == top
    assert not torch.isnan(data.float()).any()


def test_exponent_clamped_to_e8m0_range():
    tiny = torch.tensor([[2.0**-130, -2.0**-149, 2.0**-131]])  # E would be -138 < -127
    data, scale = quantize_mxfp8(tiny)
    assert codes_of(scale).item() == 0
    # 2^-130 * 2^127 = 0.125 is representable, 2^-149 * 2^127 is not (-> -0).
    assert dequantize_mxfp8(data, scale).tolist() == [[2.0**-130, -0.0, 2.0**-131]]
    big = torch.tensor([[torch.finfo(torch.float32).max, 1.0]])
    data, scale = quantize_mxfp8(big)
    assert codes_of(scale).item() == 127 + 119 and data[0, 0].float().item() == 448.0
    packed, scale = quantize_mxfp4(big)
    assert codes_of(scale).item() == 127 + 125 and unpack(packed)[0, 0].item() == 7


def test_partial_last_block_uses_its_own_amax():
    x = torch.full((1, 33), 1000.0)
    x[0, 32] = 3.0  # partial block: amax 3 -> E = 1 - 8 = -7
    data, scale = quantize_mxfp8(x)
    assert codes_of(scale).tolist() == [[127 + 9 - 8, 127 - 7]]
    assert dequantize_mxfp8(data, scale)[0, 32].item() == 3.0


def test_low_precision_input_dtypes():
    x = varied(3, 64, seed=5, lo=-5, hi=5)
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        xd = x.to(dt)
        d1, s1 = quantize_mxfp8(xd)
        d2, s2 = quantize_mxfp8(xd.float())
        assert torch.equal(d1.view(torch.uint8), d2.view(torch.uint8))
        assert torch.equal(s1.view(torch.uint8), s2.view(torch.uint8))


# --------------------------------------------------------------------------- packing


def test_packing_low_nibble_is_even_element():
    x = torch.tensor([[0.5, 6.0, -1.0, 2.0]])  # codes 1, 7, 10, 4; amax 6 -> scale 1
    packed, scale = quantize_mxfp4(x)
    assert packed.view(torch.uint8).tolist() == [[0x71, 0x4A]]
    g = gen(6)
    codes = torch.randint(0, 16, (3, 64), generator=g, dtype=torch.uint8)
    codes[:, 0] = 7  # pin each block's amax to 6 so the scale is 1
    codes[:, 32] = 15
    packed, scale = quantize_mxfp4(e2m1_to_float(codes))
    assert codes_of(scale).eq(127).all()
    b = packed.view(torch.uint8)
    assert torch.equal(b & 0xF, codes[:, 0::2]) and torch.equal(b >> 4, codes[:, 1::2])


# --------------------------------------------------------------------------- NaN scales, errors


def test_nan_scale_code_gives_nan_block():
    x = varied(1, 64, seed=8)
    data, scale = quantize_mxfp8(x)
    bad = scale.view(torch.uint8).clone()
    bad[0, 1] = 0xFF
    dq = dequantize_mxfp8(data, bad.view(torch.float8_e8m0fnu))
    assert torch.isnan(dq[0, 32:]).all() and torch.equal(dq[0, :32], dequantize_mxfp8(data, scale)[0, :32])
    packed, scale4 = quantize_mxfp4(x)
    bad4 = scale4.view(torch.uint8).clone()
    bad4[0, 0] = 0xFF
    dq4 = dequantize_mxfp4(packed, bad4.view(torch.float8_e8m0fnu))
    assert torch.isnan(dq4[0, :32]).all() and not torch.isnan(dq4[0, 32:]).any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_gets_a_nan_scale_in_its_block_only(bad):
    # No host-syncing check: the block holding NaN/inf gets scale code 255 and dequantizes to NaN
    # (poisoning its GEMM row), every other block is quantized as usual.
    x = varied(2, 64, seed=9)
    x[1, 35] = bad
    for q, dq in ((quantize_mxfp8, dequantize_mxfp8), (quantize_mxfp4, dequantize_mxfp4)):
        data, scale = q(x)
        codes = codes_of(scale)
        assert codes[1, 1] == 255 and (codes[0] != 255).all() and codes[1, 0] != 255
        out = dq(data, scale)
        assert torch.isnan(out[1, 32:]).all() and not torch.isnan(out[:, :32]).any()
        clean = x.clone()
        clean[1, 32:] = 1.0
        ref_data, ref_scale = q(clean)
        assert torch.equal(codes_of(ref_scale)[:, 0], codes[:, 0])
    big = quantize_mxfp8(torch.tensor([[1e300, 1.0]], dtype=torch.float64))[1]  # inf in float32
    assert codes_of(big).tolist() == [[255]]


def test_quantizers_trace_without_graph_breaks():
    x = varied(4, 96, seed=12)
    for q in (quantize_mxfp8, quantize_mxfp4):
        compiled = torch.compile(lambda t, q=q: q(t, rule="rceil"), fullgraph=True, backend="eager")
        for got, want in zip(compiled(x), q(x, rule="rceil")):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_rceil_rule_never_saturates_and_rounds_the_scale_up():
    # amax 448 * 2^5 is exactly representable with scale 2^5 under both rules; amax just above it
    # saturates under floor (same scale) but takes scale 2^6 under rceil.
    x = torch.tensor([[448.0 * 32, 1.0], [448.0 * 32 * 1.01, 1.0]])
    assert codes_of(quantize_mxfp8(x)[1]).tolist() == [[132], [132]]
    assert codes_of(quantize_mxfp8(x, rule="rceil")[1]).tolist() == [[132], [133]]
    data, scale = quantize_mxfp8(x * 1.7, rule="rceil")
    assert (data.float().abs().amax(dim=1) <= 448).all()
    assert torch.allclose(dequantize_mxfp8(data, scale), x * 1.7, rtol=2 ** -3)
    # e2m1: amax 6 -> scale 2^0 under both; 6.5 -> 2^0 (saturates to 6) vs 2^1 (rceil).
    y = torch.tensor([[6.0, 1.0], [6.5, 1.0]])
    assert codes_of(quantize_mxfp4(y)[1]).tolist() == [[127], [127]]
    assert codes_of(quantize_mxfp4(y, rule="rceil")[1]).tolist() == [[127], [128]]
    with pytest.raises(ValueError, match="rule must be one of"):
        quantize_mxfp8(x, rule="round")


@pytest.mark.parametrize("block", [16, 64])
def test_quantizers_refuse_blocks_no_op_accepts(block):
    for q in (quantize_mxfp8, quantize_mxfp4):
        with pytest.raises(ValueError, match=r"block must be 32.*got block=" + str(block)):
            q(varied(2, 64, seed=1), block=block)


@pytest.mark.parametrize("k", [1, 33])
def test_odd_k_rejected_for_mxfp4(k):
    with pytest.raises(ValueError, match=r"x must have an even number of columns"):
        quantize_mxfp4(varied(2, k, seed=k))


def test_quantize_argument_errors():
    x = varied(2, 64, seed=10)
    with pytest.raises(ValueError, match=r"x must be a 2-D"):
        quantize_mxfp8(x[0])
    with pytest.raises(ValueError, match=r"x must be a 2-D"):
        quantize_mxfp4(x[0])


@pytest.mark.parametrize("quantize", [quantize_mxfp8, quantize_mxfp4], ids=lambda f: f.__name__)
def test_quantize_takes_leading_dims(quantize):
    # Newcomer report #25: (..., K) as torchao's MXTensor takes it, row by row, leading dims kept.
    x = varied(6, 64, seed=11)
    flat = quantize(x)
    for shape in ((2, 3, 64), (1, 6, 64), (3, 2, 1, 64)):
        data, scale = quantize(x.reshape(shape))
        assert data.shape == (*shape[:-1], flat[0].shape[-1]) and scale.shape == (*shape[:-1], 2)
        assert torch.equal(data.reshape(flat[0].shape).view(torch.uint8), flat[0].view(torch.uint8))
        assert torch.equal(scale.reshape(6, 2).view(torch.uint8), flat[1].view(torch.uint8))
    with pytest.raises(TypeError, match=r"x must have a floating-point dtype"):
        quantize_mxfp8(torch.ones(2, 32, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        quantize_mxfp4([[1.0, 2.0]])
    with pytest.raises(ValueError, match="block"):
        quantize_mxfp8(x, block=0)


def test_dequantize_argument_errors():
    x = varied(2, 64, seed=11)
    data, scale = quantize_mxfp8(x)
    packed, scale4 = quantize_mxfp4(x)
    with pytest.raises(TypeError, match=r"data must have dtype torch.float8_e4m3fn"):
        dequantize_mxfp8(x, scale)
    with pytest.raises(ValueError, match=r"data must be a 2-D"):
        dequantize_mxfp8(data[0], scale)
    with pytest.raises(TypeError, match=r"scale must have dtype torch.float8_e8m0fnu"):
        dequantize_mxfp8(data, scale.view(torch.uint8))
    with pytest.raises(ValueError, match=r"scale must have shape .*\(2, 2\)"):
        dequantize_mxfp8(data, scale[:, :1])
    with pytest.raises(ValueError, match=r"scale must have shape .*\(2, 2\)"):
        dequantize_mxfp8(data[:, :40], scale[:1])
    with pytest.raises(TypeError, match=r"packed must have dtype torch.float4_e2m1fn_x2"):
        dequantize_mxfp4(packed.view(torch.uint8), scale4)
    with pytest.raises(ValueError, match=r"packed must be a 2-D"):
        dequantize_mxfp4(packed[0], scale4)
    with pytest.raises(ValueError, match=r"scale must have shape .*\(2, 1\)"):
        dequantize_mxfp4(packed[:, :16], scale4)
    with pytest.raises(ValueError, match="block"):
        dequantize_mxfp4(packed, scale4, block=-1)


def test_module_constants():
    assert quant.E4M3_MAX == float(torch.finfo(torch.float8_e4m3fn).max)
    assert quant.E2M1_VALUES == tuple(E2M1_EXPECTED)
    assert quant.MX_BLOCK == 32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    x = varied(64, 200, seed=12)
    for q, dq in ((quantize_mxfp8, dequantize_mxfp8), (quantize_mxfp4, dequantize_mxfp4)):
        e_cpu, s_cpu = q(x)
        e_gpu, s_gpu = q(x.cuda())
        assert torch.equal(e_gpu.view(torch.uint8).cpu(), e_cpu.view(torch.uint8))
        assert torch.equal(s_gpu.view(torch.uint8).cpu(), s_cpu.view(torch.uint8))
        assert torch.equal(dq(e_gpu, s_gpu).cpu(), dq(e_cpu, s_cpu))


@pytest.mark.skipif(not __import__("persistent_gemm").extension_available(), reason="needs the built extension")
@pytest.mark.parametrize("fmt", ["mxfp8", "fp4"])
def test_dequantize_mx_op_on_cpu_is_the_definition_in_bf16(fmt):
    # persistent_gemm.dequantize_mx (the dequantize+mm baseline's first step; CUDA kernel in
    # host/mx_bf16_prepass.cuh) on the CPU: quant.py's dequantization rounded to bf16 once; its
    # fake gives the (rows, K) bf16 shape for packed FP4 too.
    x = torch.randn(33, 96) * torch.logspace(-2, 2, 33)[:, None]
    data, scale = quant.quantize_mxfp8(x) if fmt == "mxfp8" else quant.quantize_mxfp4(x)
    out = torch.ops.persistent_gemm.dequantize_mx(data, scale)
    want = (quant.dequantize_mxfp8 if fmt == "mxfp8" else quant.dequantize_mxfp4)(data, scale).bfloat16()
    assert out.dtype == torch.bfloat16 and out.shape == (33, 96)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    mode = torch._subclasses.FakeTensorMode()
    fd, fs = mode.from_tensor(data), mode.from_tensor(scale)
    with mode:
        fake = torch.ops.persistent_gemm.dequantize_mx(fd, fs)
    assert fake.shape == (33, 96) and fake.dtype == torch.bfloat16
