"""Operand factories that never produce zeros, strided and broadcast cases, the device walk's expectation, poisoned outputs."""

from __future__ import annotations

import torch

import persistent_gemm as pg

from .common import E4M3, E8M0, FP4X2, TINY

# -- operand factories ----------------------------------------------------------------------------
def _gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    """Push magnitudes below TINY up to +-TINY (sign kept; +0 goes to +TINY)."""
    return torch.where(x.abs() < TINY, torch.where(x < 0, -TINY, TINY), x)


def randn(rows: int, cols: int, dtype=torch.bfloat16, seed: int = 0, device="cpu", scale: float = 1.0):
    """Row-major (rows, cols) randn * scale in ``dtype``, no zeros."""
    x = torch.randn(rows, cols, generator=_gen(seed, device), device=device) * scale
    return _nonzero(x).to(dtype)


def operand(rows: int, cols: int, dtype, row_major: bool = True, seed: int = 0, device="cpu") -> torch.Tensor:
    """(rows, cols) random operand, row-major or a column-major view (the transpose of a
    row-major (cols, rows) tensor)."""
    if row_major:
        return randn(rows, cols, dtype, seed, device)
    return randn(cols, rows, dtype, seed, device).t()


def fp8_operand(rows: int, cols: int, row_major: bool = True, seed: int = 0, device="cpu",
                scale: float = 2.0) -> torch.Tensor:
    """(rows, cols) random e4m3 (randn * scale, saturated to +-448, never zero)."""
    if not row_major:
        return fp8_operand(cols, rows, True, seed, device, scale).t()
    x = torch.randn(rows, cols, generator=_gen(seed, device), device=device) * scale
    return _nonzero(x.clamp(-448.0, 448.0)).to(E4M3)


def fp8_pair(m: int, n: int, k: int, seed: int = 0, device="cpu", scale: float = 2.0):
    """scaled_mm operands: a (M, K) row-major, b (K, N) column-major."""
    return (fp8_operand(m, k, True, seed, device, scale), fp8_operand(k, n, False, seed + 1, device, scale))


def fp32_scales(m: int, n: int, rowwise: bool, seed: int = 0, device="cpu"):
    """scaled_mm scales: tensorwise 0-d, or rowwise (M, 1) and (1, N) in [0.5, 1.5)."""
    if not rowwise:
        return torch.tensor(0.75, device=device), torch.tensor(1.25, device=device)
    g = _gen(seed, device)
    return (torch.rand(m, 1, generator=g, device=device) + 0.5,
            torch.rand(1, n, generator=g, device=device) + 0.5)


def e8m0_scales(rows: int, blocks: int, seed: int = 0, device="cpu", center: int = 127,
                spread: int = 20) -> torch.Tensor:
    """Random e8m0 scales, codes in [center - spread, center + spread] (2^-20 .. 2^20 by
    default); a row of two or more blocks holds both extremes, 2^(2 spread) apart."""
    lo, hi = center - spread, center + spread
    codes = torch.randint(lo, hi + 1, (rows, blocks), generator=_gen(seed, device), device=device)
    if blocks >= 2:
        even = (torch.arange(rows, device=device) % 2 == 0)
        codes[:, 0] = torch.where(even, lo, hi)
        codes[:, -1] = torch.where(even, hi, lo)
    return codes.to(torch.uint8).view(E8M0)


def e2m1_operand(rows: int, k: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """(rows, K/2) random packed e2m1 pairs (element 2i in the low nibble), no zero codes
    (0 and 8 are +-0)."""
    nonzero = torch.tensor([c for c in range(16) if c not in (0, 8)], dtype=torch.uint8, device=device)
    idx = torch.randint(0, 14, (rows, k), generator=_gen(seed, device), device=device)
    codes = nonzero[idx]
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous().view(FP4X2)


def mx_blocks(k: int) -> int:
    return -(-k // pg.quant.MX_BLOCK)


#: e8m0 (center, spread) whose products keep a K <= ~1000 result inside fp16 (max 65504):
#: scales 2^-24 .. 2^0, still 2^24 apart within a row.
FP16_SAFE_SCALES = (115, 12)


def mxfp8_operands(m, n, k, seed=0, device="cpu", center=127, spread=20):
    """mxfp8_mm operands with random e4m3 data and wide-range random scales: a (M, K),
    scale_a (M, ceil(K/32)), b (K, N) column-major, scale_b (N, ceil(K/32)). For fp16 output
    pass ``*FP16_SAFE_SCALES`` (the default range overflows it)."""
    a = fp8_operand(m, k, True, seed, device)
    b = fp8_operand(k, n, False, seed + 1, device)
    return (a, e8m0_scales(m, mx_blocks(k), seed + 2, device, center, spread),
            b, e8m0_scales(n, mx_blocks(k), seed + 3, device, center, spread))


def fp8_fp4_operands(m, n, k, seed=0, device="cpu", center=127, spread=20):
    """fp8_fp4_mm operands with random data and wide-range random scales: a (M, K) e4m3,
    b (K/2, N) column-major packed e2m1 (the transpose of (N, K/2))."""
    a = fp8_operand(m, k, True, seed, device)
    return (a, e8m0_scales(m, mx_blocks(k), seed + 2, device, center, spread),
            e2m1_operand(n, k, seed + 1, device).t(), e8m0_scales(n, mx_blocks(k), seed + 3, device, center, spread))


# -- strided and broadcast operands ---------------------------------------------------------------
def strided_mm_cases(m=37, n=29, k=70, dtype=torch.bfloat16, device="cpu") -> dict:
    """mm operands with every kind of stride torch.mm accepts: broadcast (stride 0) rows,
    columns or both, no unit stride at all, transposes with gaps."""
    x = randn(1, k, dtype, 1, device)  # one row, broadcast to M rows
    w = randn(k, 1, dtype, 2, device)  # one column, broadcast to N columns
    full_a, full_b = operand(m, k, dtype, True, 3, device), operand(k, n, dtype, True, 4, device)
    c = torch.tensor(1.5, dtype=dtype, device=device)
    return {
        "a_expand_rows": (x.expand(m, k), full_b),  # strides (0, 1)
        "a_expand_cols": (randn(m, 1, dtype, 5, device).expand(m, k), full_b),  # (1, 0)
        "b_expand_cols": (full_a, w.expand(k, n)),  # (1, 0)
        "b_expand_rows": (full_a, randn(1, n, dtype, 6, device).expand(k, n)),  # (0, 1)
        "both_expanded": (x.expand(m, k), w.expand(k, n)),
        "a_scalar_broadcast": (c.expand(m, k), full_b),  # (0, 0)
        "b_scalar_broadcast": (full_a, c.expand(k, n)),
        "both_scalar_broadcast": (c.expand(m, k), (-c).expand(k, n)),
        "a_every_other": (operand(2 * m, 3 * k, dtype, True, 7, device)[::2, ::3], full_b),  # no unit stride
        "b_every_other": (full_a, operand(3 * k, 2 * n, dtype, True, 8, device)[::3, ::2]),
        "transposed_gaps": (operand(k, 2 * m, dtype, True, 9, device)[:, ::2].t(),
                            operand(2 * n, k, dtype, True, 10, device)[::2].t()),
    }


STRIDED_MM_CASES = ("a_expand_rows", "a_expand_cols", "b_expand_cols", "b_expand_rows", "both_expanded",
                    "a_scalar_broadcast", "b_scalar_broadcast", "both_scalar_broadcast", "a_every_other",
                    "b_every_other", "transposed_gaps")


def strided_scaled_mm_cases(m=37, n=29, k=96, device="cpu") -> dict:
    """scaled_mm operands (a row-major, b column-major) with broadcast or padded strides."""
    x = fp8_operand(1, k, True, 1, device)
    w = fp8_operand(k, 1, True, 2, device)
    a, b = fp8_pair(m, n, k, 3, device)
    return {
        "a_expand_rows": (x.expand(m, k), b),  # row-major with stride(0) == 0
        "b_expand_cols": (a, w.expand(k, n)),  # column-major with stride(1) == 0
        "both_expanded": (x.expand(m, k), w.expand(k, n)),
        # leading dimensions K + 16 and K + 32, b's base 8 bytes in
        "padded_leading_dims": (fp8_operand(m, k + 16, True, 4, device)[:, :k],
                                fp8_operand(n, k + 32, True, 5, device)[:, 8:k + 8].t()),
    }


STRIDED_SCALED_MM_CASES = ("a_expand_rows", "b_expand_cols", "both_expanded", "padded_leading_dims")


# -- the scheduler's device walk ------------------------------------------------------------------
def expected_device_walk(cfg, m: int, n: int, l: int, workers: int, like: torch.Tensor,
                         k_tiles: int = 1) -> torch.Tensor:
    """What ``pg._C.device_schedule`` must return for ``cfg``, from the Python reference:
    ``[worker, CTA in cluster, step] = (batch, tile row, tile col, in bounds, split, k_begin,
    k_end)``, -1 elsewhere."""
    grid = cfg.grid(m, n, batch=l, K=k_tiles * cfg.tile[2])
    cm, cn = cfg.schedule.cluster
    expect = torch.full_like(like, -1)
    for w in range(workers):
        for v in grid.tiles_of(w, workers):
            for rm in range(cm):
                for rn in range(cn):
                    mi, ni = v.cluster_row * cm + rm, v.cluster_col * cn + rn
                    inb = int(mi < grid.tiles_m and ni < grid.tiles_n)
                    expect[w, rm * cn + rn, v.step] = torch.tensor([v.batch, mi, ni, inb, v.split, v.k_begin, v.k_end])
    return expect


# -- poisoned outputs -----------------------------------------------------------------------------
def poisoned(fn, m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Run fn() with the extension's poison hook on: every kernel output buffer is NaN-filled
    just before the launch, so a tile the kernel never writes stays NaN."""
    pg._C.set_poison_outputs(True)
    try:
        out = fn()
    finally:
        pg._C.set_poison_outputs(False)
    assert out.shape == (m, n) and out.dtype == dtype
    return out


# -- a schedule a user writes ---------------------------------------------------------------------
def check_user_schedule(spec, shapes) -> None:
    """JIT-compile ``spec`` (a bf16 KernelConfig in no catalogue), run it forced on each (M, N, K)
    of ``shapes`` against float64 with poisoned outputs, require the same bits through its
    canonical name, and hold its device walk to the Python reference (split-K and stream-K
    schedules alike)."""
    from persistent_gemm import jit

    from .bounds import check_mm

    name = jit.ensure(spec)
    for m, n, k in shapes:
        a = operand(m, k, torch.bfloat16, True, seed=m, device="cuda")
        b = operand(k, n, torch.bfloat16, False, seed=n, device="cuda")
        out = poisoned(lambda: pg.mm(a, b, config=spec), m, n, torch.bfloat16)
        check_mm(out, a, b, torch.bfloat16)
        assert torch.equal(out, poisoned(lambda: pg.mm(a, b, config=name), m, n, torch.bfloat16))
    kt = 1000 // spec.tile[2] + 1
    got = pg._C.device_schedule(name, 1000, 300, l=1, workers=17, k_tiles=kt).cpu()
    torch.testing.assert_close(got, expected_device_walk(spec, 1000, 300, 1, 17, got, k_tiles=kt), rtol=0, atol=0)


# -- grouped GEMMs (MoE experts) -------------------------------------------------------------------
def expert_stack(fmt, e, n, k, seed=0, device="cpu", center=127, spread=20):
    """(b for grouped_mm, its float64 (E, N, K) values) in format ``fmt`` (pg.nn's names): bf16
    (E, K, N) weights, or a stacked PreparedWeight of random weights with random e8m0 scales in
    [center - spread, center + spread] (``FP16_SAFE_SCALES`` for fp16 outputs)."""
    if fmt == "bf16":
        w = randn(e * n, k, torch.bfloat16, seed=seed, device=device).reshape(e, n, k)
        return w.transpose(1, 2).contiguous(), w.double()
    e2m1 = fmt in ("mxfp4_weight_only", "fp8_fp4")
    quantize, deq = (pg.quantize_mxfp4, pg.dequantize_mxfp4) if e2m1 else (pg.quantize_mxfp8, pg.dequantize_mxfp8)
    wq, _ = quantize(randn(e * n, k, torch.float32, seed=seed, device=device))
    ws = e8m0_scales(e * n, mx_blocks(k), seed=seed + 1, device=device, center=center, spread=spread)
    pw = pg.prepare_weight(wq.reshape(e, n, -1), ws.reshape(e, n, -1), fmt="fp4" if e2m1 else "mxfp8")
    return pw, deq(wq, ws).double().reshape(e, n, k)


def grouped_activations(fmt, rows, k, seed=0, device="cpu"):
    """(a, scale_a, their float64 values): bf16 rows, MXFP8-quantized for the formats that take them."""
    x = randn(rows, k, torch.bfloat16, seed=seed, device=device)
    if fmt in ("fp8_fp4", "mxfp8"):
        xq, xs = pg.quantize_mxfp8(x)
        return xq, xs, pg.dequantize_mxfp8(xq, xs).double()
    return x, None, x.double()


def grouped_reference(values_a, values_w, counts, bias=None):
    """float64 grouped_mm: rows sorted by expert, ``counts[e]`` of them expert e's, plus its bias row."""
    out, row = [], 0
    for e, c in enumerate(counts):
        y = values_a[row:row + c] @ values_w[e].t()
        out.append(y + bias[e].double() if bias is not None else y)
        row += c
    return torch.cat(out)
