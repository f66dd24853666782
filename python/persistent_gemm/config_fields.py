"""The vocabulary of a kernel config: the values each field takes, the tokens that spell them in a
canonical name, the element sizes, and the tile and hardware limits the rules check
(:mod:`persistent_gemm.config_rules`). Plain data, importable without torch.
"""

from __future__ import annotations

from typing import Literal

from .archs import ARCH_NAMES
from .archs import ARCHS as _ARCH_SPECS

Arch = Literal["sm90a", "sm100a"]  # for type checkers; the values come from archs.ARCHS
Dtype = Literal["bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1", "bf16xe4m3", "bf16xe2m1"]
Kernel = Literal["cooperative", "pingpong", "gemv", "1sm", "2sm"]
Accum = Literal["promoted", "fast"]
Route = Literal["promote", "bf16", "fold"]

ARCHS: tuple[str, ...] = ARCH_NAMES
DTYPES: tuple[str, ...] = ("bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1", "bf16xe4m3", "bf16xe2m1")
#: bytes per element of the A operand (the op's activations), per dtype family (for K-tile and
#: footprint rules), and of the B operand (the weight) where they differ
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "e4m3": 1, "mxfp8": 1, "e4m3xe2m1": 1, "bf16xe4m3": 2, "bf16xe2m1": 2}
DTYPE_B_BYTES = {"e4m3xe2m1": 0.5, "bf16xe4m3": 1, "bf16xe2m1": 0.5}
KERNEL_STYLES = {a.name: a.styles for a in _ARCH_SPECS.values()}
#: Name token of each kernel style.
STYLE_TOKENS = {"cooperative": "coop", "pingpong": "pp", "gemv": "gemv", "1sm": "1sm", "2sm": "2sm"}
#: Accumulation modes. "promoted": FP8 partial sums are added into an fp32 accumulator every
#: K-tile (torch._scaled_mm's default, use_fast_accum=False); "fast": they stay in the tensor
#: core's reduced-precision accumulator for the whole K loop (use_fast_accum=True). 16-bit
#: operands always accumulate in fp32 and are "promoted" by definition.
ACCUMS: tuple[str, ...] = ("promoted", "fast")
ACCUM_TOKEN = "fastacc"  # name suffix of fast-accumulation configs; promoted has none
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
ROUTE_TOKENS = {"bf16": "bf16route", "fold": "fold"}
#: The bf16 route's K-tile: two 1x32 blocks, one 128 B swizzled bf16 row.
BF16_ROUTE_TILE_K = 64
#: Dtype families whose mainloop has a fast-accumulation variant.
FAST_ACCUM_DTYPES: tuple[str, ...] = ("e4m3",)
#: Accumulator registers a SM90 consumer thread may hold (archs.ArchLimits, also read by the builders).
SM90_ACCUMULATOR_REGISTER_BUDGET = _ARCH_SPECS["sm90a"].limits.accumulator_register_budget

#: Dtype families applied with 1x32 e8m0 block scales in the mainloop (the MX ops).
MX_DTYPES: tuple[str, ...] = ("mxfp8", "e4m3xe2m1")
#: Weight-only MX families (weight_only_mm): bf16 activations as the model has them x an MXFP8
#: (e4m3) or MXFP4 (e2m1) weight with its e8m0 1x32 scales. Nothing is quantized at run time.
#: Kernels: the decode GEMV (kernel="gemv", M <= 64) and the bf16 route (route="bf16", prefill).
WEIGHT_ONLY_DTYPES: tuple[str, ...] = ("bf16xe4m3", "bf16xe2m1")
#: Families whose weight is e2m1 (two codes per byte: K-tiles and chunks count codes)
E2M1_DTYPES: tuple[str, ...] = ("e4m3xe2m1", "bf16xe2m1")
#: The SM100 block-scaled path's tile and shared-memory limits (archs.ArchLimits).
SM100_MX_TILE_K = _ARCH_SPECS["sm100a"].limits.mx_tile_k
SM100_MX_TILE_N = _ARCH_SPECS["sm100a"].limits.mx_tile_n
SM100_SMEM_BYTES = _ARCH_SPECS["sm100a"].limits.smem_bytes
SM100_MX_EPILOGUE_SMEM_BYTES = _ARCH_SPECS["sm100a"].limits.mx_epilogue_smem_bytes
#: The MX decode kernel (kernel style "gemv", kernel/sm90_mx_gemv.hpp): 128-row weight strips,
#: 256 weight bytes per row per work unit, 8..64 tokens (whole n8 MMA tiles), stream-K over strips.
GEMV_STRIP_ROWS = 128
GEMV_CHUNK_BYTES = 256
GEMV_TOKENS: tuple[int, ...] = (8, 16, 32, 64)
#: Name token of swap-AB configs: the weight is the MMA's A operand, D is written transposed.
SWAP_TOKEN = "swapab"
