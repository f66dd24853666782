"""The rules a kernel config keeps: each rejection is one line saying which rule it breaks.

The hardware limits they check are :class:`archs.ArchLimits`, whose generated
``arch_limits.hpp`` the static_asserts read too. The other rules mirror the static_asserts and
``can_implement`` of the builders and collectives under ``include/persistent_gemm`` (each
function names its header), so a config that no kernel can take is refused in Python, before nvcc. :meth:`KernelConfig.rejection
<persistent_gemm.kernel_config.KernelConfig.rejection>` asks :func:`rejection`.
"""

from __future__ import annotations

from typing import Optional

from .archs import ARCHS as _ARCH_SPECS
from .config_fields import (ACCUMS, ARCHS, BF16_ROUTE_TILE_K, DTYPE_BYTES, DTYPES, E2M1_DTYPES, FAST_ACCUM_DTYPES,
                            GEMV_CHUNK_BYTES, GEMV_STRIP_ROWS, GEMV_TOKENS, KERNEL_STYLES, MX_DTYPES, MX_ROUTES,
                            WEIGHT_ONLY_DTYPES)
from .schedule import TileSchedule


def rejection(c) -> Optional[str]:
    """The first rule config ``c`` breaks, as a one-line reason, or None."""
    if c.arch not in ARCHS:
        return f"arch must be one of {ARCHS}, got {c.arch!r}"
    if c.dtype not in DTYPES:
        return f"dtype must be one of {DTYPES}, got {c.dtype!r}"
    if c.accum not in ACCUMS:
        return f"accum must be one of {ACCUMS}, got {c.accum!r}"
    if c.route not in MX_ROUTES:
        return f"route must be one of {MX_ROUTES}, got {c.route!r}"
    if c.route != "promote" and c.dtype not in MX_DTYPES + WEIGHT_ONLY_DTYPES:
        return (f"route={c.route!r} is an MX mainloop option ({', '.join(MX_DTYPES + WEIGHT_ONLY_DTYPES)}), "
                f"not {c.dtype}")
    if c.route == "fold" and c.dtype != "e4m3xe2m1":
        return f"route='fold' folds e2m1 weights into e4m3 (e4m3xe2m1), not {c.dtype}"
    if c.route != "promote" and c.arch != "sm90a":
        return (f"route={c.route!r} is an sm90a mainloop (sm100a's block_scale MMA applies the MX scales "
                f"itself), not {c.arch}")
    if c.accum == "fast" and c.dtype not in FAST_ACCUM_DTYPES:
        return f"accum='fast' is an FP8 mainloop option ({FAST_ACCUM_DTYPES}); {c.dtype} always accumulates in fp32"
    if c.accum == "fast" and c.arch != "sm90a":
        return (f"accum='fast' is an sm90a (wgmma) mainloop option: {c.arch}'s tcgen05 MMAs accumulate FP8 in "
                f"fp32 in TMEM, so its promoted kernels also serve use_fast_accum=True")
    if c.kernel not in KERNEL_STYLES[c.arch]:
        return f"kernel style {c.kernel!r} does not exist on {c.arch} (choose from {KERNEL_STYLES[c.arch]})"
    if not isinstance(c.schedule, TileSchedule):
        return f"schedule must be a TileSchedule, got {type(c.schedule).__name__}"
    if len(c.tile) != 3:
        return f"tile must be (tile_m, tile_n, tile_k), got {c.tile}"
    if getattr(c.schedule, "grouped", False) and (c.schedule.split_k > 1 or c.schedule.stream_k):
        return "grouped=True deals whole tiles, group by group: split_k and stream_k do not apply"
    if c.kernel == "gemv":
        return _gemv(c)
    if c.dtype in WEIGHT_ONLY_DTYPES and c.route != "bf16":
        return (f"{c.dtype} (weight-only MX) kernels are the decode GEMV (kernel='gemv') and the bf16 route "
                f"(route='bf16', sm90a)")
    tm, tn, tk = c.tile
    if c.stages is not None and not 2 <= c.stages <= 12:
        return f"stages must be None (auto) or in [2, 12], got {c.stages}"
    row = tk * DTYPE_BYTES[c.dtype]
    if row not in (64, 128, 256) or (row == 256 and (c.arch != "sm90a" or c.dtype in MX_DTYPES)):
        return (f"tile_k={tk} x {DTYPE_BYTES[c.dtype]} B is not one 64 B or 128 B swizzled row (or, for the "
                f"sm90a 16-bit and e4m3 kernels, two 128 B swizzle atoms: 256 B)")
    if tn % 16 or not 16 <= tn <= 256:
        return f"tile_n={tn} must be a multiple of 16 in [16, 256] (one wgmma/UMMA N extent)"
    if c.arch == "sm90a":
        if c.kernel == "cooperative" and tm not in (128, 256):
            return f"cooperative kernels split tile_m across 2 consumer warpgroups: tile_m must be 128 or 256, got {tm}"
        if c.kernel == "pingpong" and tm not in (64, 128):
            return f"ping-pong consumers each own a tile: tile_m must be 64 or 128, got {tm}"
        if c.route == "bf16":
            return _sm90_bf16_route(c)
        if c.dtype in MX_DTYPES:
            return _sm90_mx(c)
        if c.dtype == "e4m3" and c.accum == "promoted" and promoted_slice_n(c) < 0:
            acc = tm * tn // (256 if c.kernel == "cooperative" else 128)
            budget = _ARCH_SPECS[c.arch].limits.accumulator_register_budget
            return (f"promoted FP8 accumulation keeps an fp32 accumulator and two in-flight temporaries: "
                    f"3 x {acc} registers per consumer thread exceed the {budget} available for "
                    f"accumulators, and only 128-row cooperative tiles may promote in N-slices (whose "
                    f"temporaries must fit beside the accumulator); use a smaller tile, or accum='fast'")
    else:
        if c.swap_ab:
            return "swap_ab is an sm90a option (sm100a MX kernels read both operands from shared memory)"
        want = (64, 128) if c.kernel == "1sm" else (128, 256)
        if tm not in want:
            return f"{c.kernel} UMMA needs tile_m in {want}, got {tm}"
        if c.kernel == "2sm" and c.schedule.cluster_m % 2:
            return f"2sm kernels pair CTAs along M: cluster_m must be even, got {c.schedule.cluster_m}"
        if c.dtype in MX_DTYPES:
            return _sm100_mx(c)
    return None

def sliced_promotion_extra_registers(slice_n: int, tile_k: int, double_a: bool = False) -> int:
    """Registers the sliced promoting mainloop holds per consumer thread besides the accumulator:
    two slice temporaries (64 x slice_n fp32 over 128 threads) and one or two A fragments of a
    K-tile (64 x tile_k e4m3 over 128 threads). Mirrors kernel/promotion_rule.hpp."""
    return 2 * (64 * slice_n // 128) + (2 if double_a else 1) * (64 * tile_k // 128 // 4)


def promoted_slice_n(c) -> int:
    """Which promoting mainloop an sm90a e4m3 promoted config gets (mirrors choice() in
    kernel/promotion_rule.hpp, less its one-or-two A fragments): 0, the whole-tile one (fp32 accumulator + two whole-tile
    temporaries fit the accumulator budget); a slice width, the N-sliced one (128-row cooperative
    tiles: the widest of 64, 32, 16 columns, an even count of them, whose registers fit the
    sliced budget); -1, neither."""
    tm, tn, tk = c.tile
    coop = c.kernel == "cooperative"
    acc = tm * tn // (256 if coop else 128)  # a cooperative tile spans 256 consumer threads
    lim = _ARCH_SPECS[c.arch].limits
    if 3 * acc <= lim.accumulator_register_budget:
        return 0
    if not coop or tm != 128:
        return -1
    for slice_n in (64, 32, 16):
        if tn % slice_n == 0 and (tn // slice_n) % 2 == 0 and \
                acc + sliced_promotion_extra_registers(slice_n, tk) <= lim.sliced_promotion_register_budget:
            return slice_n
    return -1


def _gemv(c) -> Optional[str]:
    """The rules of the MX decode kernel (mirrors the static_asserts and can_implement of
    kernel/sm90_mx_gemv.hpp): its schedule is stream-K over weight strips, so the 2-D tile
    schedule's knobs do not apply and must stay at their defaults."""
    tm, tn, tk = c.tile
    s = c.schedule
    if c.dtype not in MX_DTYPES + WEIGHT_ONLY_DTYPES:
        return (f"kernel='gemv' is the MX decode kernel ({', '.join(MX_DTYPES + WEIGHT_ONLY_DTYPES)}), "
                f"not {c.dtype}")
    if not c.swap_ab:
        return "gemv kernels are swap_ab: the weight is the mma's 16-row A side, the tokens its n8 side"
    if tm != GEMV_STRIP_ROWS:
        return f"gemv kernels stream {GEMV_STRIP_ROWS}-row weight strips (one scale atom of rows): tile_m must be {GEMV_STRIP_ROWS}, got {tm}"
    if tn not in GEMV_TOKENS:
        return f"gemv kernels take whole n8 token tiles, at most 8: tile_n must be one of {GEMV_TOKENS}, got {tn}"
    want_k = GEMV_CHUNK_BYTES * (2 if c.dtype in E2M1_DTYPES else 1)
    if tk != want_k:
        return (f"gemv kernels stream {GEMV_CHUNK_BYTES} weight bytes per row per unit: tile_k must be {want_k} "
                f"for {c.dtype}, got {tk}")
    if (s.swizzle, s.cluster, s.raster, s.split_k, s.stream_k) != (1, (1, 1), "row", 1, False):
        return ("gemv kernels are scheduled stream-K over weight strips (schedule.strip_stream_k): swizzle, "
                f"cluster, raster, split_k and stream_k do not apply (use sw1, 1x1, row, split_k=1), got {s}")
    if c.stages is not None:
        return "gemv kernels size their stage ring from shared memory: stages must be None"
    return None

def _sm100_mx(c) -> Optional[str]:
    """The rules of the SM100 block-scaled path (mirrors the static_asserts of
    kernel/sm100_mx_gemm_builder.hpp and CUTLASS's block-scaled builder)."""
    tm, tn, tk = c.tile
    lim = _ARCH_SPECS[c.arch].limits
    want_m = 256 if c.kernel == "2sm" else 128
    if tm != want_m:
        return (f"sm100a MX {c.kernel} kernels need tile_m = {want_m} (a {want_m // (2 if c.kernel == '2sm' else 1)}"
                f"-row block-scaled UMMA per CTA), got {tm}")
    if tk != lim.mx_tile_k:
        return (f"sm100a MX kernels need tile_k = {lim.mx_tile_k}: the e2m1 operand is loaded into 8-bit "
                f"smem containers 128 elements deep, one scale atom column per K tile; got {tk}")
    if tn == 256:
        return ("sm100a MX kernels cannot use tile_n = 256: two 256-column fp32 accumulators fill all 512 TMEM "
                "columns, leaving none for the scale factors, so CUTLASS overlaps the accumulators, which our "
                "kernel does not implement (use tile_n = 128)")
    if tn != lim.mx_tile_n:
        return (f"sm100a MX kernels need tile_n = {lim.mx_tile_n} (64 and 192 need per-tile scale-factor "
                f"column shifts in TMEM that our kernel does not implement), got {tn}")
    if c.stages is not None:
        # Per CTA and stage: its A rows and its share of B (a 2-SM pair splits B), 128 B each
        # (e2m1 sits in 8-bit containers), plus one 512 B scale atom per operand.
        ctas = 2 if c.kernel == "2sm" else 1
        stage = (tm // ctas) * tk + (tn // ctas) * tk + 2 * 512
        fit = (lim.smem_bytes - lim.mx_epilogue_smem_bytes) // stage
        if c.stages > fit:
            return (f"stages={c.stages}: {stage} B per stage fit at most {fit} times in the "
                    f"{lim.smem_bytes} B of shared memory beside the epilogue's")
    return None

def _sm90_bf16_route(c) -> Optional[str]:
    """The rules of the MX bf16 route (mirrors the static_asserts of
    collective/sm90_mx_bf16_mma.hpp and kernel/sm90_mx_bf16_gemm_builder.hpp)."""
    tm, tn, tk = c.tile
    if not c.swap_ab:
        return ("route='bf16' kernels are swap_ab: the weight is converted to bf16 in registers, and only the "
                "wgmma's A operand comes from registers")
    if tk != BF16_ROUTE_TILE_K:
        return f"route='bf16' needs tile_k = {BF16_ROUTE_TILE_K} (two 1x32 blocks, one 128 B bf16 row), got {tk}"
    if tm not in (64, 128) or (c.kernel == "cooperative" and tm != 128):
        return (f"route='bf16' tiles hold 64 weight rows per consumer warpgroup: tile_m must be 128 (cooperative) "
                f"or 64 (ping-pong), got {tm}")
    if c.schedule.split_k > 1 or c.schedule.stream_k:
        return "route='bf16' has no split-K or stream-K (its mainloop runs the whole K of a tile)"
    if c.dtype not in WEIGHT_ONLY_DTYPES and tuple(c.schedule.cluster) != (1, 1):
        return ("route='bf16' with e4m3 activations runs on 1x1 clusters only: its 2x1 and 1x2 specs failed to "
                "launch on an H100 (invalid argument, cause not yet found); the weight-only routes take clusters")
    return None

def _sm90_mx(c) -> Optional[str]:
    """The rules of the SM90 MX mainloop (mirrors the static_asserts of
    collective/sm90_mx_block_scaled_mma.hpp and kernel/sm90_mx_gemm_builder.hpp)."""
    tm, tn, tk = c.tile
    lim = _ARCH_SPECS[c.arch].limits
    if tk != lim.mx_tile_k:
        return (f"MX kernels need tile_k = {lim.mx_tile_k} (four 1x32 scale blocks, one blocked-layout atom column), "
                f"got {tk}")
    if tn > 128 and tn % 128 or tn <= 128 and 128 % tn:
        return f"MX kernels need tile_n dividing 128 or a multiple of it (scale atoms hold 128 rows), got {tn}"
    if c.dtype == "e4m3xe2m1" and not c.swap_ab:
        return ("FP8 x FP4 kernels must be swap_ab: the e2m1 weight is converted to e4m3 in registers, and "
                "only the wgmma's A operand comes from registers")
    acc = tm * tn // (256 if c.kernel == "cooperative" else 128)
    if 3 * acc > lim.accumulator_register_budget:
        return (f"MX promotion keeps an fp32 accumulator and two in-flight temporaries: 3 x {acc} registers per "
                f"consumer thread exceed the {lim.accumulator_register_budget} available for accumulators "
                f"(use a smaller tile)")
    return None
