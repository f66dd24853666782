"""The test harness shared by every test file.

* Markers ``gpu``, ``sm90``, ``sm100``: ``gpu`` tests skip without a CUDA device and the built
  extension; ``sm90``/``sm100`` tests also skip unless the device is compute capability 9.0/10.0.
  Test files only mark (``pytestmark = pytest.mark.gpu``); the skipping happens here.
* Error measures: :func:`rel_err` against a float64 reference and :func:`error_bound`, the
  FlashAttention-3 rule "our error <= 2x the peer's error + a small floor", the peer being
  torch on the same inputs (or, on CPU, the float64 result rounded to the output dtype).
* Operand factories that never produce zeros (a zero hides a skipped tile or a wrong scale).
* :func:`sample_inputs`: representative valid inputs per op, shared by the CPU and GPU suites.
* :func:`built_configs` / :func:`requires_config`: what the (possibly narrowed) build holds.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterator, Optional

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

import persistent_gemm as pg
from persistent_gemm.catalogue import CATALOGUE
from persistent_gemm.schedule import TileSchedule

E4M3 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
FP4X2 = torch.float4_e2m1fn_x2
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OPS = ("mm", "scaled_mm", "mxfp8_mm", "fp8_fp4_mm")
#: Smallest magnitude the factories produce: a normal number in every dtype used (e4m3's
#: smallest normal is 2^-6), so no element rounds to zero.
TINY = 2.0**-6

HAS_GPU = torch.cuda.is_available() and pg.extension_available()
CAPABILITY = torch.cuda.get_device_capability() if HAS_GPU else None
#: The catalogue arch of the device, or None (no GPU, or one we build no kernels for).
ARCH = {(9, 0): "sm90a", (10, 0): "sm100a"}.get(CAPABILITY)
_ARCH_MARKS = {"sm90": (9, 0), "sm100": (10, 0)}


# -- schedule, catalogue and footprint tests -----------------------------------------------------
REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLUSTERS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4)]
CATALOGUE_TILES = sorted({c.cta_tile for c in CATALOGUE})
# The catalogue's (tile_m, tile_n) plus a few other legal CTA shapes, so the property tests
# do not hinge on the catalogue having a single tile shape.
TILES = sorted(set(CATALOGUE_TILES) | {(128, 128), (256, 128), (64, 256)})
PROPS = settings(deadline=None, max_examples=60)
FAST = settings(deadline=None, max_examples=150)
#: Any valid TileSchedule.
schedules = st.builds(
    TileSchedule,
    swizzle=st.integers(1, 16),
    cluster=st.sampled_from(CLUSTERS),
    raster=st.sampled_from(["row", "column"]),
)


# -- markers --------------------------------------------------------------------------------------
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and the built extension (skipped otherwise)")
    config.addinivalue_line("markers", "sm90: needs an SM90 GPU (compute capability 9.0); implies gpu")
    config.addinivalue_line("markers", "sm100: needs an SM100 GPU (compute capability 10.0); implies gpu")


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU and the built persistent_gemm extension")
    for item in items:
        arch_marks = [m for m in _ARCH_MARKS if item.get_closest_marker(m)]
        if (item.get_closest_marker("gpu") or arch_marks) and not HAS_GPU:
            item.add_marker(no_gpu)
            continue
        for m in arch_marks:
            if CAPABILITY != _ARCH_MARKS[m]:
                item.add_marker(pytest.mark.skip(reason=f"needs compute capability {_ARCH_MARKS[m]}, "
                                                        f"this device is {CAPABILITY}"))


# -- error measures -------------------------------------------------------------------------------
def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``out`` against the float64 ``ref``."""
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


#: Default floor of :func:`error_bound`: fp32 accumulations summing in different orders differ
#: by ~1e-7 at our K; a result that went through bf16 is off by ~1e-3.
FLOOR = 1e-6
#: Floor for FP8 with promoted accumulation: the tensor core's FP8 partial sums carry ~2^-13
#: relative error before each promotion (~1.3e-4 measured on an H200, ours and torch's).
FP8_FLOOR = 1e-4


def error_bound(peer_err: float, floor: float = FLOOR) -> float:
    """The FlashAttention-3 tolerance: ours must be within 2x the peer's error against the
    same float64 reference, plus ``floor`` for where the peer happens to be exact."""
    return 2.0 * peer_err + floor


def rounding_err(ref: torch.Tensor, out_dtype: torch.dtype) -> float:
    """The error of the float64 ``ref`` correctly rounded to ``out_dtype``: the least any
    implementation returning ``out_dtype`` can have. The CPU suite's peer."""
    rounded = ref.to(out_dtype)
    # An overflow would make the bound inf and every answer pass: that is a bad test input.
    assert torch.isfinite(rounded).all(), f"the reference overflows {out_dtype}: pick smaller inputs"
    return rel_err(rounded, ref)


def fp8_accum_floor(k: int, fast_accum: bool) -> float:
    """Accumulation error allowed an FP8 GEMM of depth ``k`` beyond the output rounding.
    Promoted: flat in K (chunks are fp32-summed), a few FP8_FLOOR. Fast: one reduced-precision
    accumulator over all of K, growing like sqrt(K) (H200: 2.1e-3 at K = 8192, 4.4e-3 at
    28672, ~2.5e-5 sqrt(K)); allow 2x that."""
    return 5e-5 * math.sqrt(max(k, 1)) if fast_accum else 5 * FP8_FLOOR


# -- peers: torch on the same inputs --------------------------------------------------------------
def torch_mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """torch.mm with the same output dtype: the peer of ``pg.mm``."""
    if out_dtype == a.dtype:
        return torch.mm(a, b)
    try:  # the mm.dtype overload (bf16/fp16 in, fp32 out, same tensor-core accumulation)
        c = torch.mm(a, b, out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        c = torch.mm(a.float(), b.float())
    return c.to(out_dtype)


def _pad_to(x: torch.Tensor, rows: int, cols: int, fill: float = 0.0) -> torch.Tensor:
    """``x`` (row-major result) zero- (or ``fill``-) padded to (rows, cols); fp8 through bytes."""
    if x.shape == (rows, cols):
        return x
    if x.element_size() == 1 and x.dtype != torch.uint8:
        return _pad_to(x.view(torch.uint8), rows, cols).view(x.dtype)
    out = x.new_full((rows, cols), fill)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def torch_scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum) -> Optional[torch.Tensor]:
    """torch._scaled_mm on the same product (``pg.scaled_mm``'s peer), or None where torch
    cannot compute it. torch wants K and N multiples of 16: operands are zero-padded, which
    changes nothing (zero products add nothing; the padding is sliced off). Where torch refuses
    rowwise scales for out_dtype, it runs with unit scales in fp32 and the rowwise scales are
    applied after, as our epilogue does."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    mp, kp, np_ = (-(-x // 16) * 16 for x in (m, k, n))
    ap = _pad_to(a, mp, kp)
    bp = _pad_to(b.t(), np_, kp).t()  # column-major stays column-major
    rowwise = scale_a.numel() != 1 or scale_b.numel() != 1
    sa = _pad_to(scale_a, mp, 1, 1.0) if rowwise else scale_a
    sb = _pad_to(scale_b, 1, np_, 1.0) if rowwise else scale_b
    try:
        return torch._scaled_mm(ap, bp, sa, sb, out_dtype=out_dtype, use_fast_accum=use_fast_accum)[:m, :n]
    except (RuntimeError, NotImplementedError):
        if not rowwise:
            return None
    one = torch.ones((), device=a.device)
    try:
        acc = torch._scaled_mm(ap, bp, one, one, out_dtype=torch.float32, use_fast_accum=use_fast_accum)
    except (RuntimeError, NotImplementedError):
        return None
    return (acc * sa * sb)[:m, :n].to(out_dtype)


def scaled_mm_bound(ref, a, b, scale_a, scale_b, out_dtype, use_fast_accum) -> float:
    """error_bound of torch._scaled_mm's error in the same accumulation mode; where torch has
    no answer, of the output rounding (no kernel does better) plus fp8_accum_floor."""
    peer = torch_scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    if peer is None:
        return error_bound(rounding_err(ref, out_dtype), fp8_accum_floor(a.shape[1], use_fast_accum))
    # Fast accumulation's error depends on how the K loop is cut: cuBLAS may split K over CTAs
    # on small grids (each part accumulating less), our persistent kernels never do. So its
    # floor is the error expected of one unsplit K loop, not the promoted one.
    floor = fp8_accum_floor(a.shape[1], True) if use_fast_accum else FP8_FLOOR
    return error_bound(rel_err(peer, ref), floor)


def check_mm(out, a, b, out_dtype=None):
    """``out`` = a @ b in out_dtype, no NaN, within error_bound of torch.mm's error."""
    out_dtype = out_dtype or a.dtype
    assert out.shape == (a.shape[0], b.shape[1]) and out.dtype == out_dtype
    assert not out.isnan().any(), "NaN in the output: a tile was never written"
    ref = a.double() @ b.double()
    err, bound = rel_err(out, ref), error_bound(rel_err(torch_mm(a, b, out_dtype), ref))
    assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g}"


def check_scaled_mm(out, a, b, scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=False):
    """``out`` = (scale_a a) @ (scale_b b), no NaN, within scaled_mm_bound."""
    assert out.shape == (a.shape[0], b.shape[1]) and out.dtype == out_dtype
    assert not out.isnan().any(), "NaN in the output: a tile was never written"
    ref = (a.double() * scale_a.double()) @ (b.double() * scale_b.double())
    err = rel_err(out, ref)
    bound = scaled_mm_bound(ref, a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g}"


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


# -- what the build holds -------------------------------------------------------------------------
_FASTACC_RE = re.compile(r"_fastacc(?:_s\d+)?$")


def family_of(name: str) -> str:
    """The dtype family of a canonical config name: ``sm90a_e4m3_...`` -> ``e4m3``."""
    return name.split("_")[1]


def is_fast_accum(entry: dict) -> bool:
    return bool(entry["fast_accum"]) if "fast_accum" in entry else bool(_FASTACC_RE.search(entry["config"]))


def _built_entries() -> list[dict]:
    if not pg.extension_available():
        return []
    return list(pg._C.built_kernels())


def built_configs(family: str, fast_accum: Optional[bool] = None, arch: Optional[str] = None) -> list[str]:
    """Sorted canonical names of the built configs of a dtype family (bf16, fp16, e4m3, mxfp8,
    e4m3xe2m1), optionally only fast- or promoted-accumulation ones, optionally one arch.
    ``[]`` when nothing matches or the extension is missing, so it is safe in parametrize
    (an empty parameter set is reported as one skipped test)."""
    names = set()
    for e in _built_entries():
        name = e["config"]
        if family_of(name) != family or (arch is not None and not name.startswith(arch + "_")):
            continue
        if fast_accum is not None and is_fast_accum(e) != fast_accum:
            continue
        names.add(name)
    return sorted(names)


_REG_DTYPES = {0: torch.bfloat16, 1: torch.float16, 2: torch.float32}  # registry.h's DType


def config_out_dtypes(name: str) -> tuple:
    """Output dtypes a forced config serves: those its variants write, and every one if it has
    an fp32 variant (the dispatcher casts fp32 down once). Shape-tuned configs carry only the
    common fast path, so forcing them with another out dtype is a clear error, not a test."""
    written = {_REG_DTYPES.get(e["d_dtype"]) for e in _built_entries() if e["config"] == name}
    return OUT_DTYPES if torch.float32 in written else tuple(d for d in OUT_DTYPES if d in written)


def config_is_fast_accum(name: str) -> bool:
    """Whether a built config accumulates FP8 the fast way (else by its name's token)."""
    for e in _built_entries():
        if e["config"] == name:
            return is_fast_accum(e)
    return bool(_FASTACC_RE.search(name))


def requires_config(name: str) -> None:
    """Skip the calling test unless ``name`` is built (PGEMM_KERNELS narrows the build)."""
    if name not in {e["config"] for e in _built_entries()}:
        pytest.skip(f"config {name} is not built in this build")


def catalogue_config(name: str):
    return next(c for c in pg.CATALOGUE if c.name == name)


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
