"""The catalogue: the kernel configs the build compiles, and how to find one by name.

The build (``setup.py``), the code generator (:mod:`persistent_gemm.codegen`), the runtime
dispatch, the tests and the benchmarks all read :data:`CATALOGUE`. What a config is, and its
name, is :mod:`persistent_gemm.kernel_config`; the values its fields take,
:mod:`persistent_gemm.config_fields`; the rules it keeps, :mod:`persistent_gemm.config_rules`.
All of them are importable from here too.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from .config_fields import (  # noqa: F401  (the vocabulary, importable from here as before)
    Arch, Dtype, Kernel, Accum, Route, ARCHS, DTYPES, DTYPE_BYTES, DTYPE_B_BYTES, KERNEL_STYLES,
    STYLE_TOKENS, ACCUMS, ACCUM_TOKEN, MX_ROUTES, ROUTE_TOKENS, BF16_ROUTE_TILE_K, FAST_ACCUM_DTYPES,
    SM90_ACCUMULATOR_REGISTER_BUDGET, MX_DTYPES, WEIGHT_ONLY_DTYPES, E2M1_DTYPES, SM100_MX_TILE_K,
    SM100_MX_TILE_N, SM100_SMEM_BYTES, SM100_MX_EPILOGUE_SMEM_BYTES, GEMV_STRIP_ROWS, GEMV_CHUNK_BYTES,
    GEMV_TOKENS, SWAP_TOKEN
)
from .kernel_config import ConfigError, KernelConfig, as_config, parse_name  # noqa: F401  (as before)
from .schedule import TileSchedule

#: Environment variable: a regex; only catalogue names it matches (re.search) are built.
KERNELS_ENV = "PGEMM_KERNELS"


def _cfg(tile, swizzle, cluster, kernel="cooperative", dtype="bf16", arch="sm90a", raster="row", stages=None,
         accum="promoted", swap_ab=False, split_k=1, route="promote", stream_k=False, grouped=False):
    return KernelConfig(
        accum=accum,
        route=route,
        swap_ab=swap_ab,
        tile=tile,
        schedule=TileSchedule(swizzle=swizzle, cluster=cluster, raster=raster, split_k=split_k, stream_k=stream_k,
                              grouped=grouped),
        stages=stages,
        kernel=kernel,
        dtype=dtype,
        arch=arch,
    )


#: The default catalogue. Kept lean: every entry costs minutes of nvcc time in CI.
CATALOGUE: tuple[KernelConfig, ...] = (
    _cfg((128, 256, 64), 8, (2, 1)),
    _cfg((128, 256, 64), 8, (2, 1), dtype="fp16"),
    # FP8, promoted accumulation (the default, torch._scaled_mm's accuracy): the fp32 accumulator
    # and two temporaries rule out 128x256 cooperative and 128x128 ping-pong tiles (registers).
    _cfg((128, 128, 128), 8, (2, 1), dtype="e4m3"),
    # FP8, fast accumulation (use_fast_accum=True), for the compute-bound shapes where it pays.
    _cfg((128, 256, 128), 8, (2, 1), dtype="e4m3", accum="fast"),
    _cfg((128, 128, 128), 8, (1, 2), kernel="pingpong", dtype="e4m3", accum="fast"),
    # Ragged M around 1000 against N around 3000 (the suite's 1000x3000x5000): 208 columns make
    # 8 x 15 = 120 tiles, one wave, where 256 leave 36 SMs idle; four CTAs along M share each B
    # panel by multicast (cuBLAS runs the transposed twin, 200x128 in 1x4 clusters). H100, kernel
    # time (benchmarks/results/issue27/h100_s12 at 7d1ac21): 48.5 us against 55.2 for 128x256, torch 44.8;
    # slower everywhere else we timed, where the model ranks it behind (a wgmma N of 208: CuTe's
    # extended shapes, defined in its TU alone).
    _cfg((128, 208, 64), 8, (4, 1)),
    # Narrower ping-pong tiles, clustered along N: no tail CTAs and twice the tiles where M is
    # small (decode, ragged M); the dispatcher's cost model picks among them.
    _cfg((128, 128, 64), 8, (1, 2), kernel="pingpong"),
    # Decode (M <= 128 against a wide weight): 64-column tiles put every SM on the weight
    # stream (N = 8192 gives 128 tiles, where 128-column tiles leave half the GPU idle), and
    # 64-row tiles halve the MMA work wasted on the padding rows when M <= 64.
    _cfg((128, 64, 64), 8, (1, 2), kernel="pingpong"),
    _cfg((64, 64, 64), 8, (1, 2), kernel="pingpong"),
    # Stream-K twins of the tiles that leave the last wave part-empty (ragged M, a few waves):
    # the last wave is shared out in K-tiles (schedule.stream_k_partition), at the price of a
    # fixed-order fp32 fix-up through the workspace and predicated stores.
    _cfg((128, 256, 64), 8, (2, 1), stream_k=True),
    _cfg((128, 128, 64), 8, (1, 2), kernel="pingpong", stream_k=True),
    _cfg((128, 128, 128), 8, (2, 1), dtype="e4m3", stream_k=True),
    _cfg((128, 64, 128), 8, (1, 2), kernel="pingpong", dtype="e4m3"),
    _cfg((64, 64, 128), 8, (1, 2), kernel="pingpong", dtype="e4m3"),
    # Decode (M <= 16) at the weight's read stream: swap-AB puts the weight on the 64-row wgmma
    # side and the tokens on a 16-wide N, so no MMA work or TMA zero-fill is spent on padding
    # rows, and a stage is 16 KB of weight, 256 B per weight row (two swizzle atoms: measured
    # 3-5% faster than 128 B rows, benchmarks/results/issue12 at 7d1ac21). Split-K 4 puts every SM on the
    # weight where it has few 64-row tiles (N <= 2048: <= 32 tiles).
    _cfg((64, 16, 128), 1, (1, 1), kernel="pingpong", swap_ab=True),
    _cfg((64, 16, 128), 1, (1, 1), kernel="pingpong", swap_ab=True, split_k=4),
    _cfg((64, 16, 128), 1, (1, 1), kernel="pingpong", dtype="fp16", swap_ab=True),
    _cfg((64, 16, 256), 1, (1, 1), kernel="pingpong", dtype="e4m3", swap_ab=True),
    _cfg((64, 16, 256), 1, (1, 1), kernel="pingpong", dtype="e4m3", swap_ab=True, split_k=4),
    # Ragged token counts past decode (128 < M <= 4 bands): swap-AB again, tokens on wgmma's N at a
    # full-width extent (144: CuTe's extended shapes, defined in its TU alone), so 257 tokens are
    # 2 bands of 144, not 3 of 128; 128 weight rows per cooperative tile, and split-K 2 fills the
    # GPU where the weight has few 128-row tiles (4096 rows x 2 bands: 64 clusters on 66 workers).
    # H100, kernel time, 257x4096^2 (benchmarks/results/issue27/h100_s11 at 7d1ac21): 25.9 us against 33.0
    # for the best tile before.
    _cfg((128, 144, 64), 1, (1, 2), swap_ab=True, split_k=2),
    # Its e4m3 twins. Fast accumulation: the same tile, K = 128 (18.9 us against 21.2 at 257
    # tokens). Promoted: the fp32 accumulator and two temporaries leave no registers for 144
    # tokens, so 96 (three bands cover 257 tokens: 288) with no split (19.8 us against 22.7; at
    # 384x4096x14336 37.9 against 59.1, torch 46.0).
    _cfg((128, 144, 128), 1, (1, 2), dtype="e4m3", accum="fast", swap_ab=True, split_k=2),
    _cfg((128, 96, 128), 1, (1, 2), dtype="e4m3", swap_ab=True),
    # MX (1x32 e8m0 block scales, applied per 32-K block in the mainloop). mxfp8 prefill: both
    # operands by TMA into smem, 128x128 cooperative (the promotion's three accumulator sets fill
    # the register budget). Decode: swap-AB, the weight on the 64-row side, tokens as a narrow N.
    _cfg((128, 128, 128), 8, (2, 1), dtype="mxfp8"),
    _cfg((64, 16, 128), 8, (1, 1), kernel="pingpong", dtype="mxfp8", swap_ab=True),
    _cfg((64, 64, 128), 8, (1, 1), kernel="pingpong", dtype="mxfp8", swap_ab=True),
    # FP8 x FP4: always swap-AB (the e2m1 weight is converted in registers, the A side's privilege).
    _cfg((128, 128, 128), 8, (1, 2), dtype="e4m3xe2m1", swap_ab=True),
    _cfg((64, 16, 128), 8, (1, 1), kernel="pingpong", dtype="e4m3xe2m1", swap_ab=True),
    _cfg((64, 64, 128), 8, (1, 1), kernel="pingpong", dtype="e4m3xe2m1", swap_ab=True),
    # MX prefill, bf16 route: both scales folded into bf16 operands, no per-32 promotion. 128
    # weight rows x 256 tokens: the widest wgmma N, so each converted weight fragment feeds 256
    # tokens (H200 probe: 128x128 ran 0.7x of it at 8192^3; a 2x1 cluster changed nothing).
    _cfg((128, 256, 64), 8, (1, 1), dtype="mxfp8", swap_ab=True, route="bf16"),
    _cfg((128, 256, 64), 8, (1, 1), dtype="e4m3xe2m1", swap_ab=True, route="bf16"),
    # ... and 64 weight rows x 128 tokens, ping-pong, for 64 < M <= ~512: twice the weight tiles
    # (N = 8192: 128, one per SM) where the 128-row tile leaves half the GPU idle, and the other
    # consumer's epilogue overlapped.
    _cfg((64, 128, 64), 8, (1, 1), kernel="pingpong", dtype="mxfp8", swap_ab=True, route="bf16"),
    _cfg((64, 128, 64), 8, (1, 1), kernel="pingpong", dtype="e4m3xe2m1", swap_ab=True, route="bf16"),
    # FP8 x FP4 prefill, fold route: the promotion kernel's tile with the weight's scale folded
    # into its e4m3 conversion (one FFMA per element per block instead of FMUL + FFMA).
    _cfg((128, 128, 128), 8, (1, 2), dtype="e4m3xe2m1", swap_ab=True, route="fold"),
    # MX decode (M <= 64): the stream-K tensor-core GEMV, one config per token tile (8, 16, 32, 64
    # tokens: M <= 8 runs one n8 MMA tile). Both families' configs are one translation unit each.
    *(_cfg((GEMV_STRIP_ROWS, t, GEMV_CHUNK_BYTES * w), 1, (1, 1), kernel="gemv", dtype=d, swap_ab=True)
      for d, w in (("mxfp8", 1), ("e4m3xe2m1", 2)) for t in GEMV_TOKENS),
    # Weight-only MX (weight_only_mm): prefill on the bf16 route, whose pre-pass only copies the
    # bf16 activations into the mainloop's K order, and decode (M <= 64) on the GEMV with bf16
    # activations read as they are; the weight's e4m3 / e2m1 bytes become bf16 in registers.
    *(_cfg(tile, 8, (1, 1), kernel=style, dtype=d, swap_ab=True, route="bf16")
      for d in WEIGHT_ONLY_DTYPES for tile, style in (((128, 256, 64), "cooperative"), ((64, 128, 64), "pingpong"))),
    *(_cfg((GEMV_STRIP_ROWS, t, GEMV_CHUNK_BYTES * w), 1, (1, 1), kernel="gemv", dtype=d, swap_ab=True)
      for d, w in (("bf16xe4m3", 1), ("bf16xe2m1", 2)) for t in GEMV_TOKENS),
    # Grouped (MoE experts, pg.grouped_mm): the same GEMV walking (expert, strip) items decided on
    # the device from offs, every MX family, one TU per family.
    *(_cfg((GEMV_STRIP_ROWS, t, GEMV_CHUNK_BYTES * w), 1, (1, 1), kernel="gemv", dtype=d, swap_ab=True, grouped=True)
      for d, w in (("bf16xe2m1", 2), ("bf16xe4m3", 1), ("e4m3xe2m1", 2), ("mxfp8", 1)) for t in GEMV_TOKENS),
    # ... and prefill (tens of rows per expert and up): the bf16 route walking (expert, tile) ids
    # decided on the device, each tile's tokens counted from its expert's first row (no padding,
    # no tile across experts). 128 tokens: gpt-oss-20b at 1024 tokens has ~128 rows per expert;
    # 256 tokens: each converted weight fragment feeds twice the tokens (4096 tokens: ~512 per expert).
    *(_cfg((128, t, 64), 8, (1, 1), dtype=d, swap_ab=True, route="bf16", grouped=True)
      for d in ("bf16xe2m1", "bf16xe4m3", "e4m3xe2m1", "mxfp8") for t in (128, 256)),
    _cfg((256, 256, 64), 8, (2, 1), kernel="2sm", arch="sm100a"),
    _cfg((256, 256, 64), 8, (2, 1), kernel="2sm", dtype="fp16", arch="sm100a"),
    # SM100 scaled_mm (e4m3, tensorwise / rowwise scales in the epilogue; compiled, not run): the
    # 16-bit kernel's 2-SM 256x256 MMA tile, K = 128 (one 128 B swizzled e4m3 row). tcgen05
    # accumulates in fp32, so this one config serves use_fast_accum False and True.
    _cfg((256, 256, 128), 8, (2, 1), kernel="2sm", dtype="e4m3", arch="sm100a"),
    # SM100 MX (tcgen05 block_scale MMAs, kind::mxf8f6f4; compiled and SASS-checked, not run by
    # this project): a 1-SM and a 2-SM tile per family, per-CTA N = 128 (see config_rules._sm100_mx).
    _cfg((128, 128, 128), 8, (1, 1), kernel="1sm", dtype="mxfp8", arch="sm100a"),
    _cfg((256, 128, 128), 8, (2, 1), kernel="2sm", dtype="mxfp8", arch="sm100a"),
    _cfg((128, 128, 128), 8, (1, 1), kernel="1sm", dtype="e4m3xe2m1", arch="sm100a"),
    _cfg((256, 128, 128), 8, (2, 1), kernel="2sm", dtype="e4m3xe2m1", arch="sm100a"),
    # Grouped MXFP8 and FP8 x FP4 (pg.grouped_mm on SM100; compiled, not run here): the scheduler's
    # grouped walk over band-aligned copies of the experts' rows (kernel/sm100_mx_gemm_builder.hpp).
    # After the dense ones: a family's first config carries every output dtype.
    _cfg((128, 128, 128), 8, (1, 1), kernel="1sm", dtype="mxfp8", arch="sm100a", grouped=True),
    _cfg((128, 128, 128), 8, (1, 1), kernel="1sm", dtype="e4m3xe2m1", arch="sm100a", grouped=True),
)


def by_name() -> dict[str, KernelConfig]:
    return {c.name: c for c in CATALOGUE}


def did_you_mean(name: str, n: int = 3) -> str:
    """The catalogue names closest to ``name`` (difflib), as a suffix for an error message."""
    import difflib

    close = difflib.get_close_matches(name, [c.name for c in CATALOGUE], n=n, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def lookup(name: str) -> KernelConfig:
    """The catalogue entry called ``name``; an unknown name says which are closest."""
    table = by_name()
    if name not in table:
        raise ConfigError(f"unknown config {name!r}{did_you_mean(name)}; the catalogue has {len(table)} configs "
                          "(persistent_gemm.CATALOGUE, or python -m persistent_gemm list)")
    return table[name]


def selected(pattern: Optional[str] = None, archs: Optional[tuple[str, ...]] = None) -> list[KernelConfig]:
    """Catalogue entries to build: names matching ``pattern`` (default: $PGEMM_KERNELS, else all)
    and whose arch is in ``archs``."""
    if pattern is None:
        pattern = os.environ.get(KERNELS_ENV, "")
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"{KERNELS_ENV}={pattern!r} is not a valid regex: {e}") from None
    return [c for c in CATALOGUE if rx.search(c.name) and (archs is None or c.arch in archs)]
