"""Kernel configurations and their canonical names: the one catalogue.

A :class:`KernelConfig` holds a :class:`~persistent_gemm.schedule.TileSchedule` beside the
tile shape, pipeline depth, kernel style, input dtype family and target arch. Its canonical
name, e.g. ``sm90a_bf16_128x256x64_c2x1_sw8_row_coop``, is at once the ``config=`` string the
ops accept, the generated file's stem, the pytest id and the benchmark label.

The build (``setup.py``), the code generator (:mod:`persistent_gemm.codegen`), the runtime
dispatch, the tests and the benchmarks all read :data:`CATALOGUE`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Literal, Optional

from .archs import ARCH_NAMES
from .archs import ARCHS as _ARCH_SPECS
from .library import lowering
from .schedule import TileSchedule

Arch = Literal["sm90a", "sm100a"]  # for type checkers; the values come from archs.ARCHS
Dtype = Literal["bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1", "bf16xe4m3", "bf16xe2m1"]
Kernel = Literal["cooperative", "pingpong", "gemv", "1sm", "2sm"]
Accum = Literal["promoted", "fast"]
Route = Literal["promote", "bf16"]

ARCHS: tuple[str, ...] = ARCH_NAMES
DTYPES: tuple[str, ...] = ("bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1", "bf16xe4m3", "bf16xe2m1")
#: bytes per element of the A operand (the op's activations), per dtype family (for K-tile and
#: footprint rules), and of the B operand (the weight) where they differ
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "e4m3": 1, "mxfp8": 1, "e4m3xe2m1": 1, "bf16xe4m3": 2, "bf16xe2m1": 2}
DTYPE_B_BYTES = {"e4m3xe2m1": 0.5, "bf16xe4m3": 1, "bf16xe2m1": 0.5}
KERNEL_STYLES = {a.name: a.styles for a in _ARCH_SPECS.values()}
_STYLE_TOKEN = {"cooperative": "coop", "pingpong": "pp", "gemv": "gemv", "1sm": "1sm", "2sm": "2sm"}
_TOKEN_STYLE = {v: k for k, v in _STYLE_TOKEN.items()}
#: Accumulation modes. "promoted": FP8 partial sums are added into an fp32 accumulator every
#: K-tile (torch._scaled_mm's default, use_fast_accum=False); "fast": they stay in the tensor
#: core's reduced-precision accumulator for the whole K loop (use_fast_accum=True). 16-bit
#: operands always accumulate in fp32 and are "promoted" by definition.
ACCUMS: tuple[str, ...] = ("promoted", "fast")
_ACCUM_TOKEN = "fastacc"  # name suffix of fast-accumulation configs; promoted has none
#: MX mainloop routes (how the 1x32 e8m0 scales meet the tensor core), by name:
#:   "promote": FP8 wgmma per 32-K block into a temporary, promoted into the fp32 accumulator with
#:              both scales (FMUL + FFMA per element per block; collective/sm90_mx_block_scaled_mma.hpp)
#:   "bf16":    both scales folded exactly into bf16 operands (the weight in registers, the
#:              activations by a pre-pass), bf16 wgmma, fp32 over the whole K, no promotion
#:              (collective/sm90_mx_bf16_mma.hpp). Adds the ``_bf16route`` token.
#:   "fold":    FP8 x FP4 only: the promotion route with the weight's block scale folded exactly
#:              into its e2m1 -> e4m3 conversion per (16-row strip, 32-K block), leaving one FMUL
#:              per column and one FFMA per element per block; strips whose codes span more than
#:              e4m3 can carry convert plainly (exact either way; python/persistent_gemm/fold.py).
#:              Adds the ``_fold`` token.
MX_ROUTES: tuple[str, ...] = ("promote", "bf16", "fold")
_ROUTE_TOKENS = {"bf16": "bf16route", "fold": "fold"}
_TOKEN_ROUTES = {v: k for k, v in _ROUTE_TOKENS.items()}
#: The bf16 route's K-tile: two 1x32 blocks, one 128 B swizzled bf16 row.
BF16_ROUTE_TILE_K = 64
#: Dtype families whose mainloop has a fast-accumulation variant.
FAST_ACCUM_DTYPES: tuple[str, ...] = ("e4m3",)
#: Accumulator registers a SM90 consumer thread may hold (of its 232), the rest going to
#: addressing and pipeline state. Mirrors kAccumulatorRegisterBudget in sm90_gemm_builder.hpp.
SM90_ACCUMULATOR_REGISTER_BUDGET = 192

#: Dtype families applied with 1x32 e8m0 block scales in the mainloop (the MX ops).
MX_DTYPES: tuple[str, ...] = ("mxfp8", "e4m3xe2m1")
#: Weight-only MX families (weight_only_mm): bf16 activations as the model has them x an MXFP8
#: (e4m3) or MXFP4 (e2m1) weight with its e8m0 1x32 scales. Nothing is quantized at run time.
#: Kernels: the decode GEMV (kernel="gemv", M <= 64) and the bf16 route (route="bf16", prefill).
WEIGHT_ONLY_DTYPES: tuple[str, ...] = ("bf16xe4m3", "bf16xe2m1")
#: Families whose weight is e2m1 (two codes per byte: K-tiles and chunks count codes)
E2M1_DTYPES: tuple[str, ...] = ("e4m3xe2m1", "bf16xe2m1")
#: The SM100 block-scaled path's tile rules (kernel/sm100_tile_mapping.hpp's sm100_mx constants).
SM100_MX_TILE_K = 128
SM100_MX_TILE_N = 128
SM100_SMEM_BYTES = 232448               # opt-in dynamic shared memory per CTA
SM100_MX_EPILOGUE_SMEM_BYTES = 17408    # the TMA-store epilogue's staging + barriers (estimate)
#: The MX decode kernel (kernel style "gemv", kernel/sm90_mx_gemv.hpp): 128-row weight strips,
#: 256 weight bytes per row per work unit, 8..64 tokens (whole n8 MMA tiles), stream-K over strips.
GEMV_STRIP_ROWS = 128
GEMV_CHUNK_BYTES = 256
GEMV_TOKENS: tuple[int, ...] = (8, 16, 32, 64)
#: Name token of swap-AB configs: the weight is the MMA's A operand, D is written transposed.
_SWAP_TOKEN = "swapab"

#: Environment variable: a regex; only catalogue names it matches (re.search) are built.
KERNELS_ENV = "PGEMM_KERNELS"


class ConfigError(ValueError):
    """A kernel configuration that cannot be instantiated; the message says why."""


@dataclass(frozen=True)
class KernelConfig:
    """One kernel instantiation.

    Parameters
    ----------
    tile : (tile_m, tile_n, tile_k)
        CTA tile. On SM90 cooperative kernels split tile_m across two consumer warpgroups
        (tile_m in {128, 256}); ping-pong consumers each own a whole tile (tile_m = 64 or 128).
        tile_k * element bytes must be 64 or 128 (one swizzled shared-memory row), or 256 (two
        128 B swizzle atoms) for the sm90a 16-bit and e4m3 kernels.
    schedule : TileSchedule
        Swizzle, cluster shape and raster order.
    stages : int or None
        Shared-memory pipeline depth; ``None`` lets CUTLASS fill the shared memory left after
        the epilogue (``StageCountAutoCarveout``).
    kernel : {"cooperative", "pingpong"} on sm90a, {"1sm", "2sm"} on sm100a
        (the name tokens ``"coop"`` and ``"pp"`` are accepted and stored as the full spelling)
    dtype : {"bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1"}
    arch : {"sm90a", "sm100a"}
    accum : {"promoted", "fast"}
        FP8 accumulation (see :data:`ACCUMS`); ``"fast"`` exists for e4m3 only and adds the
        ``_fastacc`` token to the name.
    swap_ab : bool
        The kernel computes D^T = W X^T: the weight fills the wgmma's 64-row M side and the
        tokens become a narrow N (decode), D is written transposed; ``tile`` is then
        (weight rows, tokens, K). Adds the ``_swapab`` token. sm90a only; FP8 x FP4 requires it
        (its e2m1 weight is converted in registers, which only the A side allows). Swap-AB and
        split-K kernels of the 16-bit and e4m3 families write D by predicated stores.
    route : {"promote", "bf16", "fold"}
        MX families only (see :data:`MX_ROUTES`): ``"bf16"`` folds both block scales into bf16
        operands and accumulates in fp32 over the whole K (sm90a, swap-AB, tile_k = 64);
        ``"fold"`` (FP8 x FP4) folds the weight's scale into its e4m3 conversion and promotes
        per block with the activation's.
    """

    tile: tuple[int, int, int] = (128, 256, 64)
    schedule: TileSchedule = field(default_factory=TileSchedule)
    stages: Optional[int] = None
    kernel: Kernel = "cooperative"
    dtype: Dtype = "bf16"
    arch: Arch = "sm90a"
    accum: Accum = "promoted"
    swap_ab: bool = False
    route: Route = "promote"

    def __post_init__(self) -> None:
        object.__setattr__(self, "tile", tuple(int(t) for t in self.tile))
        # The names' style tokens are accepted as spellings of the style ("pp" -> "pingpong").
        # Also "ping-pong", "Ping_Pong", "coop": case, '-' and '_' do not matter.
        if isinstance(self.kernel, str):
            key = self.kernel.lower().replace("-", "").replace("_", "")
            style = _TOKEN_STYLE.get(key) or next((s for s in _STYLE_TOKEN if s == key), None)
            if style is not None:
                object.__setattr__(self, "kernel", style)
        reason = self.rejection()
        if reason:
            raise ConfigError(f"invalid kernel config: {reason}")

    def rejection(self) -> Optional[str]:
        """The first rule this config breaks, as a one-line reason, or None."""
        if self.arch not in ARCHS:
            return f"arch must be one of {ARCHS}, got {self.arch!r}"
        if self.dtype not in DTYPES:
            return f"dtype must be one of {DTYPES}, got {self.dtype!r}"
        if self.accum not in ACCUMS:
            return f"accum must be one of {ACCUMS}, got {self.accum!r}"
        if self.route not in MX_ROUTES:
            return f"route must be one of {MX_ROUTES}, got {self.route!r}"
        if self.route != "promote" and self.dtype not in MX_DTYPES + WEIGHT_ONLY_DTYPES:
            return (f"route={self.route!r} is an MX mainloop option ({', '.join(MX_DTYPES + WEIGHT_ONLY_DTYPES)}), "
                    f"not {self.dtype}")
        if self.route == "fold" and self.dtype != "e4m3xe2m1":
            return f"route='fold' folds e2m1 weights into e4m3 (e4m3xe2m1), not {self.dtype}"
        if self.route != "promote" and self.arch != "sm90a":
            return (f"route={self.route!r} is an sm90a mainloop (sm100a's block_scale MMA applies the MX scales "
                    f"itself), not {self.arch}")
        if self.accum == "fast" and self.dtype not in FAST_ACCUM_DTYPES:
            return f"accum='fast' is an FP8 mainloop option ({FAST_ACCUM_DTYPES}); {self.dtype} always accumulates in fp32"
        if self.kernel not in KERNEL_STYLES[self.arch]:
            return f"kernel style {self.kernel!r} does not exist on {self.arch} (choose from {KERNEL_STYLES[self.arch]})"
        if not isinstance(self.schedule, TileSchedule):
            return f"schedule must be a TileSchedule, got {type(self.schedule).__name__}"
        if len(self.tile) != 3:
            return f"tile must be (tile_m, tile_n, tile_k), got {self.tile}"
        if self.kernel == "gemv":
            return self._gemv_rejection()
        if self.dtype in WEIGHT_ONLY_DTYPES and self.route != "bf16":
            return (f"{self.dtype} (weight-only MX) kernels are the decode GEMV (kernel='gemv') and the bf16 route "
                    f"(route='bf16', sm90a)")
        tm, tn, tk = self.tile
        if self.stages is not None and not 2 <= self.stages <= 12:
            return f"stages must be None (auto) or in [2, 12], got {self.stages}"
        row = tk * DTYPE_BYTES[self.dtype]
        if row not in (64, 128, 256) or (row == 256 and (self.arch != "sm90a" or self.dtype in MX_DTYPES)):
            return (f"tile_k={tk} x {DTYPE_BYTES[self.dtype]} B is not one 64 B or 128 B swizzled row (or, for the "
                    f"sm90a 16-bit and e4m3 kernels, two 128 B swizzle atoms: 256 B)")
        if tn % 16 or not 16 <= tn <= 256:
            return f"tile_n={tn} must be a multiple of 16 in [16, 256] (one wgmma/UMMA N extent)"
        if self.arch == "sm90a":
            if self.kernel == "cooperative" and tm not in (128, 256):
                return f"cooperative kernels split tile_m across 2 consumer warpgroups: tile_m must be 128 or 256, got {tm}"
            if self.kernel == "pingpong" and tm not in (64, 128):
                return f"ping-pong consumers each own a tile: tile_m must be 64 or 128, got {tm}"
            if self.route == "bf16":
                return self._sm90_bf16_route_rejection()
            if self.dtype in MX_DTYPES:
                return self._sm90_mx_rejection()
            if self.dtype == "e4m3" and self.accum == "promoted":
                # A cooperative tile is split over 256 consumer threads, a ping-pong tile is one WG's.
                acc = tm * tn // (256 if self.kernel == "cooperative" else 128)
                if 3 * acc > SM90_ACCUMULATOR_REGISTER_BUDGET:
                    return (f"promoted FP8 accumulation keeps an fp32 accumulator and two in-flight temporaries: "
                            f"3 x {acc} registers per consumer thread exceed the {SM90_ACCUMULATOR_REGISTER_BUDGET} "
                            f"available for accumulators (use a smaller tile, or accum='fast')")
        else:
            if self.swap_ab:
                return "swap_ab is an sm90a option (sm100a MX kernels read both operands from shared memory)"
            want = (64, 128) if self.kernel == "1sm" else (128, 256)
            if tm not in want:
                return f"{self.kernel} UMMA needs tile_m in {want}, got {tm}"
            if self.kernel == "2sm" and self.schedule.cluster_m % 2:
                return f"2sm kernels pair CTAs along M: cluster_m must be even, got {self.schedule.cluster_m}"
            if self.dtype in MX_DTYPES:
                return self._sm100_mx_rejection()
        return None

    def _gemv_rejection(self) -> Optional[str]:
        """The rules of the MX decode kernel (mirrors the static_asserts and can_implement of
        kernel/sm90_mx_gemv.hpp): its schedule is stream-K over weight strips, so the 2-D tile
        schedule's knobs do not apply and must stay at their defaults."""
        tm, tn, tk = self.tile
        s = self.schedule
        if self.dtype not in MX_DTYPES + WEIGHT_ONLY_DTYPES:
            return (f"kernel='gemv' is the MX decode kernel ({', '.join(MX_DTYPES + WEIGHT_ONLY_DTYPES)}), "
                    f"not {self.dtype}")
        if not self.swap_ab:
            return "gemv kernels are swap_ab: the weight is the mma's 16-row A side, the tokens its n8 side"
        if tm != GEMV_STRIP_ROWS:
            return f"gemv kernels stream {GEMV_STRIP_ROWS}-row weight strips (one scale atom of rows): tile_m must be {GEMV_STRIP_ROWS}, got {tm}"
        if tn not in GEMV_TOKENS:
            return f"gemv kernels take whole n8 token tiles, at most 8: tile_n must be one of {GEMV_TOKENS}, got {tn}"
        want_k = GEMV_CHUNK_BYTES * (2 if self.dtype in E2M1_DTYPES else 1)
        if tk != want_k:
            return (f"gemv kernels stream {GEMV_CHUNK_BYTES} weight bytes per row per unit: tile_k must be {want_k} "
                    f"for {self.dtype}, got {tk}")
        if (s.swizzle, s.cluster, s.raster, s.split_k) != (1, (1, 1), "row", 1):
            return ("gemv kernels are scheduled stream-K over weight strips (schedule.strip_stream_k): swizzle, "
                    f"cluster, raster and split_k do not apply (use sw1, 1x1, row, split_k=1), got {s}")
        if self.stages is not None:
            return "gemv kernels size their stage ring from shared memory: stages must be None"
        return None

    def _sm100_mx_rejection(self) -> Optional[str]:
        """The rules of the SM100 block-scaled path (mirrors the static_asserts of
        kernel/sm100_mx_gemm_builder.hpp and CUTLASS's block-scaled builder)."""
        tm, tn, tk = self.tile
        want_m = 256 if self.kernel == "2sm" else 128
        if tm != want_m:
            return (f"sm100a MX {self.kernel} kernels need tile_m = {want_m} (a {want_m // (2 if self.kernel == '2sm' else 1)}"
                    f"-row block-scaled UMMA per CTA), got {tm}")
        if tk != SM100_MX_TILE_K:
            return (f"sm100a MX kernels need tile_k = {SM100_MX_TILE_K}: the e2m1 operand is loaded into 8-bit "
                    f"smem containers 128 elements deep, one scale atom column per K tile; got {tk}")
        if tn == 256:
            return ("sm100a MX kernels cannot use tile_n = 256: two 256-column fp32 accumulators fill all 512 TMEM "
                    "columns, leaving none for the scale factors, so CUTLASS overlaps the accumulators, which our "
                    "kernel does not implement (use tile_n = 128)")
        if tn != SM100_MX_TILE_N:
            return (f"sm100a MX kernels need tile_n = {SM100_MX_TILE_N} (64 and 192 need per-tile scale-factor "
                    f"column shifts in TMEM that our kernel does not implement), got {tn}")
        if self.stages is not None:
            # Per CTA and stage: its A rows and its share of B (a 2-SM pair splits B), 128 B each
            # (e2m1 sits in 8-bit containers), plus one 512 B scale atom per operand.
            ctas = 2 if self.kernel == "2sm" else 1
            stage = (tm // ctas) * tk + (tn // ctas) * tk + 2 * 512
            fit = (SM100_SMEM_BYTES - SM100_MX_EPILOGUE_SMEM_BYTES) // stage
            if self.stages > fit:
                return (f"stages={self.stages}: {stage} B per stage fit at most {fit} times in the "
                        f"{SM100_SMEM_BYTES} B of shared memory beside the epilogue's")
        return None

    def _sm90_bf16_route_rejection(self) -> Optional[str]:
        """The rules of the MX bf16 route (mirrors the static_asserts of
        collective/sm90_mx_bf16_mma.hpp and kernel/sm90_mx_bf16_gemm_builder.hpp)."""
        tm, tn, tk = self.tile
        if not self.swap_ab:
            return ("route='bf16' kernels are swap_ab: the weight is converted to bf16 in registers, and only the "
                    "wgmma's A operand comes from registers")
        if tk != BF16_ROUTE_TILE_K:
            return f"route='bf16' needs tile_k = {BF16_ROUTE_TILE_K} (two 1x32 blocks, one 128 B bf16 row), got {tk}"
        if tm not in (64, 128) or (self.kernel == "cooperative" and tm != 128):
            return (f"route='bf16' tiles hold 64 weight rows per consumer warpgroup: tile_m must be 128 (cooperative) "
                    f"or 64 (ping-pong), got {tm}")
        if self.schedule.split_k > 1:
            return "route='bf16' has no split-K (its mainloop runs the whole K of a tile)"
        if self.dtype not in WEIGHT_ONLY_DTYPES and tuple(self.schedule.cluster) != (1, 1):
            return ("route='bf16' with e4m3 activations runs on 1x1 clusters only: its 2x1 and 1x2 specs failed to "
                    "launch on an H100 (invalid argument, cause not yet found); the weight-only routes take clusters")
        return None

    def _sm90_mx_rejection(self) -> Optional[str]:
        """The rules of the SM90 MX mainloop (mirrors the static_asserts of
        collective/sm90_mx_block_scaled_mma.hpp and kernel/sm90_mx_gemm_builder.hpp)."""
        tm, tn, tk = self.tile
        if tk != 128:
            return f"MX kernels need tile_k = 128 (four 1x32 scale blocks, one blocked-layout atom column), got {tk}"
        if tn > 128 and tn % 128 or tn <= 128 and 128 % tn:
            return f"MX kernels need tile_n dividing 128 or a multiple of it (scale atoms hold 128 rows), got {tn}"
        if self.dtype == "e4m3xe2m1" and not self.swap_ab:
            return ("FP8 x FP4 kernels must be swap_ab: the e2m1 weight is converted to e4m3 in registers, and "
                    "only the wgmma's A operand comes from registers")
        acc = tm * tn // (256 if self.kernel == "cooperative" else 128)
        if 3 * acc > SM90_ACCUMULATOR_REGISTER_BUDGET:
            return (f"MX promotion keeps an fp32 accumulator and two in-flight temporaries: 3 x {acc} registers per "
                    f"consumer thread exceed the {SM90_ACCUMULATOR_REGISTER_BUDGET} available for accumulators "
                    f"(use a smaller tile)")
        return None

    @property
    def cta_tile(self) -> tuple[int, int]:
        """The output tile one CTA owns, which is what the scheduler counts. Equal to
        ``tile[:2]`` except for 2-SM UMMA, where a CTA pair shares one ``tile_m``-row MMA tile
        and each CTA owns half of its rows."""
        tm, tn, _ = self.tile
        return (tm // 2, tn) if self.kernel == "2sm" else (tm, tn)

    def grid(self, M: int, N: int, *, batch: int = 1, K: Optional[int] = None):
        """This config's schedule bound to an (M, N) problem, in CTA tiles (and, given ``K``,
        its K-tiles, which split-K divides). The extents are the kernel's: for a ``swap_ab``
        config, which computes D^T, pass the op's (N, M)."""
        return self.schedule.over(M, N, (*self.cta_tile, self.tile[2]), batch=batch, K=K)

    def kernel_rejection(self) -> Optional[str]:
        """Why no kernel can be generated for this (valid) config, or None. A valid config can
        always be named, walked, pictured and parity-tested; only these cannot be compiled."""
        low = lowering(self.arch, self.dtype)
        if low is None:
            return f"no kernel lowering exists for {self.arch} {self.dtype}"
        if self.schedule.split_k > 1 and (self.arch != "sm90a" or low.tu != "gemm"):
            return (f"split_k={self.schedule.split_k}: the K-range reduction is built into the sm90a 16-bit and "
                    f"e4m3 kernels only (not {self.arch} {self.dtype}), so {self.name} cannot be built; its "
                    f"schedule can still be walked and pictured")
        return None

    # -- naming ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        tm, tn, tk = self.tile
        s = self.schedule
        parts = [
            self.arch,
            self.dtype,
            f"{tm}x{tn}x{tk}",
            f"c{s.cluster_m}x{s.cluster_n}",
            f"sw{s.swizzle}",
            s.raster,
        ]
        if s.split_k > 1:
            parts.append(f"sk{s.split_k}")
        parts.append(_STYLE_TOKEN[self.kernel])
        if self.swap_ab:
            parts.append(_SWAP_TOKEN)
        if self.accum == "fast":
            parts.append(_ACCUM_TOKEN)
        if self.route != "promote":
            parts.append(_ROUTE_TOKENS[self.route])
        if self.stages is not None:
            parts.append(f"s{self.stages}")
        return "_".join(parts)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_name(cls, name: str) -> "KernelConfig":
        """Inverse of :attr:`name`. Raises :class:`ConfigError` naming the bad field."""
        m = _NAME_RE.fullmatch(name)
        if not m:
            raise ConfigError(
                f"config name {name!r} is not of the form "
                "<arch>_<dtype>_<tm>x<tn>x<tk>_c<cm>x<cn>_sw<S>_<row|column>[_sk<split_k>]_<coop|pp|gemv|1sm|2sm>"
                "[_swapab][_fastacc][_bf16route|_fold][_s<stages>]"
            )
        g = m.groupdict()
        if g["sk"] is not None and int(g["sk"]) == 1:
            raise ConfigError(f"config name {name!r}: split_k=1 is written without the _sk token")
        try:
            schedule = TileSchedule(
                swizzle=int(g["sw"]), cluster=(int(g["cm"]), int(g["cn"])), raster=g["raster"],
                split_k=int(g["sk"]) if g["sk"] else 1,
            )
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config name {name!r}: {e}") from None
        return cls(
            tile=(int(g["tm"]), int(g["tn"]), int(g["tk"])),
            schedule=schedule,
            stages=int(g["stages"]) if g["stages"] else None,
            kernel=_TOKEN_STYLE[g["style"]],
            dtype=g["dtype"],
            arch=g["arch"],
            accum="fast" if g["accum"] else "promoted",
            swap_ab=bool(g["swap"]),
            route=_TOKEN_ROUTES[g["route"][1:]] if g["route"] else "promote",
        )

    # -- lowering --------------------------------------------------------------------------
    def template_args(self) -> dict[str, str]:
        """C++ spellings of this config's compile-time parameters (see codegen templates)."""
        tm, tn, tk = self.tile
        s = self.schedule
        raster = "Row" if s.raster == "row" else "Column"
        return {
            "name": self.name,
            "arch": self.arch,
            "tile_shape": f"cute::Shape<cute::_{tm}, cute::_{tn}, cute::_{tk}>",
            "cluster_shape": f"cute::Shape<cute::_{s.cluster_m}, cute::_{s.cluster_n}, cute::_1>",
            "tile_m": str(self.cta_tile[0]),  # the scheduler's (per-CTA) tile
            "tile_n": str(self.cta_tile[1]),
            "tile_k": str(tk),
            "cluster_m": str(s.cluster_m),
            "cluster_n": str(s.cluster_n),
            "swizzle": str(s.swizzle),
            "raster": f"persistent_gemm::scheduler::Raster::{raster}",
            "schedule_tag": (
                f"persistent_gemm::scheduler::PersistentSchedule<{s.swizzle}, {s.cluster_m}, {s.cluster_n}, "
                f"persistent_gemm::scheduler::Raster::{raster}" + (f", {s.split_k}>" if s.split_k > 1 else ">")
            ),
            "stages": "0" if self.stages is None else str(self.stages),
            "kernel_style": {
                "cooperative": "persistent_gemm::kernel::Cooperative",
                "pingpong": "persistent_gemm::kernel::PingPong",
                "gemv": "persistent_gemm::kernel::Gemv",
                "1sm": "persistent_gemm::kernel::Umma1Sm",
                "2sm": "persistent_gemm::kernel::Umma2Sm",
            }[self.kernel],
            "dtype": self.dtype,
            "accum": ("persistent_gemm::kernel::AccumFast" if self.accum == "fast"
                      else "persistent_gemm::kernel::AccumPromoted"),
            "swap_ab": str(self.swap_ab).lower(),
            "split_k": str(s.split_k),
            "route": self.route,
        }


_NAME_RE = re.compile(
    rf"(?P<arch>{'|'.join(ARCHS)})_(?P<dtype>bf16xe4m3|bf16xe2m1|bf16|fp16|e4m3xe2m1|e4m3|mxfp8)_(?P<tm>\d+)x(?P<tn>\d+)x(?P<tk>\d+)"
    r"_c(?P<cm>\d+)x(?P<cn>\d+)_sw(?P<sw>\d+)_(?P<raster>row|column)(?:_sk(?P<sk>\d+))?_(?P<style>coop|pp|gemv|1sm|2sm)(?P<swap>_swapab)?(?P<accum>_fastacc)?(?P<route>_bf16route|_fold)?(?:_s(?P<stages>\d+))?"
)


def _cfg(tile, swizzle, cluster, kernel="cooperative", dtype="bf16", arch="sm90a", raster="row", stages=None,
         accum="promoted", swap_ab=False, split_k=1, route="promote"):
    return KernelConfig(
        accum=accum,
        route=route,
        swap_ab=swap_ab,
        tile=tile,
        schedule=TileSchedule(swizzle=swizzle, cluster=cluster, raster=raster, split_k=split_k),
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
    # Narrower ping-pong tiles, clustered along N: no tail CTAs and twice the tiles where M is
    # small (decode, ragged M); the dispatcher's cost model picks among them.
    _cfg((128, 128, 64), 8, (1, 2), kernel="pingpong"),
    # Decode (M <= 128 against a wide weight): 64-column tiles put every SM on the weight
    # stream (N = 8192 gives 128 tiles, where 128-column tiles leave half the GPU idle), and
    # 64-row tiles halve the MMA work wasted on the padding rows when M <= 64.
    _cfg((128, 64, 64), 8, (1, 2), kernel="pingpong"),
    _cfg((64, 64, 64), 8, (1, 2), kernel="pingpong"),
    _cfg((128, 64, 128), 8, (1, 2), kernel="pingpong", dtype="e4m3"),
    _cfg((64, 64, 128), 8, (1, 2), kernel="pingpong", dtype="e4m3"),
    # Decode (M <= 16) at the weight's read stream: swap-AB puts the weight on the 64-row wgmma
    # side and the tokens on a 16-wide N, so no MMA work or TMA zero-fill is spent on padding
    # rows, and a stage is 16 KB of weight, 256 B per weight row (two swizzle atoms: measured
    # 3-5% faster than 128 B rows, benchmarks/results/issue12). Split-K 4 puts every SM on the
    # weight where it has few 64-row tiles (N <= 2048: <= 32 tiles).
    _cfg((64, 16, 128), 1, (1, 1), kernel="pingpong", swap_ab=True),
    _cfg((64, 16, 128), 1, (1, 1), kernel="pingpong", swap_ab=True, split_k=4),
    _cfg((64, 16, 128), 1, (1, 1), kernel="pingpong", dtype="fp16", swap_ab=True),
    _cfg((64, 16, 256), 1, (1, 1), kernel="pingpong", dtype="e4m3", swap_ab=True),
    _cfg((64, 16, 256), 1, (1, 1), kernel="pingpong", dtype="e4m3", swap_ab=True, split_k=4),
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
    _cfg((256, 256, 64), 8, (2, 1), kernel="2sm", arch="sm100a"),
    _cfg((256, 256, 64), 8, (2, 1), kernel="2sm", dtype="fp16", arch="sm100a"),
    # SM100 MX (tcgen05 block_scale MMAs, kind::mxf8f6f4; compiled and SASS-checked, not run by
    # this project): a 1-SM and a 2-SM tile per family, per-CTA N = 128 (see _sm100_mx_rejection).
    _cfg((128, 128, 128), 8, (1, 1), kernel="1sm", dtype="mxfp8", arch="sm100a"),
    _cfg((256, 128, 128), 8, (2, 1), kernel="2sm", dtype="mxfp8", arch="sm100a"),
    _cfg((128, 128, 128), 8, (1, 1), kernel="1sm", dtype="e4m3xe2m1", arch="sm100a"),
    _cfg((256, 128, 128), 8, (2, 1), kernel="2sm", dtype="e4m3xe2m1", arch="sm100a"),
)


def as_config(config) -> KernelConfig:
    """``config`` itself, or the config a canonical name spells (any valid spec, in the catalogue
    or not); ConfigError names a bad name's fault, TypeError anything else."""
    if isinstance(config, str):
        return KernelConfig.from_name(config)
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig or a canonical config name, got {type(config).__name__}")
    return config


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
