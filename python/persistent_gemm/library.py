"""The lowering tables, one per concept (after CUTLASS's ``library.py``): element types with
their C++, registry and torch spellings, and one lowering record per (arch, dtype family) that
says how a :class:`~persistent_gemm.catalogue.KernelConfig` of that family becomes C++.

:mod:`persistent_gemm.codegen` reads these to write the kernel translation units and the
kernel table; tests and benchmarks read them for spellings. A family without a record has
schedules and a catalogue name but no kernel to generate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

__all__ = ["Element", "ELEMENTS", "Variant", "Lowering", "LOWERINGS", "lowering", "fit_variants", "GEMV_VARIANTS",
           "BF16_ROUTE_VARIANTS", "WEIGHT_ONLY_GEMV_VARIANTS"]


@dataclass(frozen=True)
class Element:
    """One element type. ``registry`` is its ``persistent_gemm::DType`` enumerator
    (``include/persistent_gemm/registry.h``), ``torch`` the ``torch`` dtype attribute."""

    name: str
    cpp: str
    registry: str
    torch: str
    bits: int


ELEMENTS: dict[str, Element] = {e.name: e for e in (
    Element("bf16", "cutlass::bfloat16_t", "BF16", "bfloat16", 16),
    Element("fp16", "cutlass::half_t", "FP16", "float16", 16),
    Element("fp32", "float", "FP32", "float32", 32),
    Element("e4m3", "cutlass::float_e4m3_t", "E4M3", "float8_e4m3fn", 8),
    Element("e8m0", "cutlass::float_ue8m0_t", "E8M0", "float8_e8m0fnu", 8),
    Element("e2m1", "cutlass::float_e2m1_t", "E2M1", "float4_e2m1fn_x2", 4),
)}

#: The names the rest of the library gives a family (its op, its pg.nn format, its quantizer),
#: accepted wherever a family is asked for (explain, the CLI) beside the canonical one.
FAMILY_ALIASES: dict[str, str] = {
    "mm": "bf16", "scaled_mm": "e4m3", "fp8_rowwise": "e4m3", "mxfp8_mm": "mxfp8",
    "fp8_fp4_mm": "e4m3xe2m1", "fp8_fp4": "e4m3xe2m1", "mxfp4": "e4m3xe2m1", "fp4": "e4m3xe2m1",
    "mxfp8_weight_only": "bf16xe4m3", "mxfp4_weight_only": "bf16xe2m1",
}


def canonical_family(name):
    """``name`` as a catalogue dtype family: itself, an alias of FAMILY_ALIASES, or a torch dtype of a
    16-bit or e4m3 family (torch.bfloat16 -> "bf16"). Anything else is returned unchanged, for
    the caller's own error."""
    import torch

    if isinstance(name, torch.dtype):
        return next((e.name for e in ELEMENTS.values() if getattr(torch, e.torch, None) == name
                     and e.name in ("bf16", "fp16", "e4m3")), name)
    return FAMILY_ALIASES.get(name, name) if isinstance(name, str) else name


#: Epilogue scale modes (registry.h ScaleMode) by their variant spelling.
SCALE_MODES = {"none": "None", "tensor": "Tensorwise", "row": "Rowwise", "block": "Block32"}


@dataclass(frozen=True)
class Variant:
    """One instantiation of a config: operand majorness, output dtype, scales, store path."""

    a_k_major: bool
    b_k_major: bool
    out: str
    scale: str = "none"
    tma_store: bool = True

    @property
    def suffix(self) -> str:
        layout = ("ak" if self.a_k_major else "am") + ("bk" if self.b_k_major else "bn")
        parts = [layout, self.out]
        if self.scale != "none":
            parts.append(self.scale)
        parts.append("tma" if self.tma_store else "direct")
        return "_".join(parts)


@dataclass(frozen=True)
class Lowering:
    """How configs of one (arch, family) become C++.

    ``a``/``b`` name the operand elements, ``block_scale`` the per-1x32 scale element of MX
    families (None: no mainloop scales). ``builder`` is the C++ class template in
    ``include/persistent_gemm/kernel/<header>.hpp``; ``epilogue_args`` says whether it takes
    the SM90 builder's trailing (scale mode, TMA store, accumulation) parameters.

    Variant policy: the first catalogue config of each (arch, family, accum) -- the primary --
    gets ``primary`` (every layout and output the dispatcher may need without a copy); configs
    tuned for particular shapes get only ``tuned``, the common fast path.
    """

    arch: str
    family: str
    a: str
    b: str
    builder: str
    header: str
    primary: tuple[Variant, ...]
    tuned: tuple[Variant, ...]
    block_scale: Optional[str] = None
    epilogue_args: bool = False
    #: MX builders (Sm90MxGemm): the C++ tag of the X operand's element in the mainloop
    operand_x: Optional[str] = None
    #: The MX decode kernel (Sm90MxGemv, kernel style "gemv"): the C++ tag of the weight's bytes;
    #: None where the family has none
    gemv_weight: Optional[str] = None
    #: The swap-AB MX kernels' (decode GEMV, bf16 route) activation tag: e4m3 with e8m0 scales
    #: (the MX ops), or bf16 (weight-only; kernel/activation_tags.hpp)
    activation: str = "persistent_gemm::kernel::ActivationsE4m3"
    #: which kernel translation-unit template codegen fills: "gemm" (Sm90Gemm / Sm100Gemm),
    #: "sm90_mx" (Sm90MxGemm), "sm100_mx" (Sm100MxGemm), "gemv" (Sm90MxGemv only)
    tu: str = "gemm"


def _sixteen_bit_sm90(d: str) -> dict:
    layouts = tuple(Variant(ak, bk, d) for ak in (True, False) for bk in (True, False))
    return dict(primary=layouts + (Variant(True, True, "fp32"), Variant(True, True, d, tma_store=False)),
                tuned=(Variant(True, True, d),))


_SM90 = dict(builder="persistent_gemm::kernel::Sm90Gemm", header="sm90_gemm_builder", epilogue_args=True)
_SM100 = dict(builder="persistent_gemm::kernel::Sm100Gemm", header="sm100_gemm_builder")
_FP8_TUNED = (Variant(True, True, "bf16", "tensor"), Variant(True, True, "bf16", "row"))

# MX: block scales are applied in the mainloop and D is written by predicated stores (the
# transposed D of a swap-AB kernel cannot be a TMA store box); fp32 out covers fp16 by one cast.
_SM90_MX = dict(builder="persistent_gemm::kernel::Sm90MxGemm", header="sm90_mx_gemm_builder", block_scale="e8m0",
                tu="sm90_mx",
                primary=(Variant(True, True, "bf16", "block", False), Variant(True, True, "fp32", "block", False)),
                tuned=(Variant(True, True, "bf16", "block", False),))

# SM100 MX: the tensor core applies the scales (tcgen05 block_scale MMA); D by TMA store, fp32
# out covers fp16 by one cast.
_SM100_MX = dict(builder="persistent_gemm::kernel::Sm100MxGemm", header="sm100_mx_gemm_builder", block_scale="e8m0",
                 tu="sm100_mx",
                 primary=(Variant(True, True, "bf16", "block"), Variant(True, True, "fp32", "block")),
                 tuned=(Variant(True, True, "bf16", "block"),))

# The MX decode kernel (style "gemv") writes every output dtype itself: predicated scalar stores,
# no TMA box, so fp16 needs no cast and an unaligned N no padded D. Instantiations are small (no
# CUTLASS collective), and one TU holds a family's gemv configs.
GEMV_HEADER = "gemv_builder"  # Sm90MxGemv (kernel/sm90_mx_gemv.hpp) by named spec
GEMV_BUILDER = "persistent_gemm::kernel::Sm90MxGemvBuilder"
GEMV_VARIANTS = tuple(Variant(True, True, d, "block", False) for d in ("bf16", "fp16", "fp32"))

# Weight-only MX (bf16 activations): the decode GEMV and the bf16 route (BF16_ROUTE_VARIANTS),
# D in the activations' dtype or fp32.
WEIGHT_ONLY_GEMV_VARIANTS = tuple(Variant(True, True, d, "block", False) for d in ("bf16", "fp32"))
_SM90_WEIGHT_ONLY = dict(builder=GEMV_BUILDER, header=GEMV_HEADER, block_scale="e8m0", tu="gemv",
                         primary=WEIGHT_ONLY_GEMV_VARIANTS, tuned=WEIGHT_ONLY_GEMV_VARIANTS)

# The MX bf16 route (KernelConfig.route == "bf16", both sm90a MX families): a pre-pass and the
# GEMM in one entry; D by predicated (transposed) stores; fp32 out covers fp16 by one cast.
BF16_ROUTE_HEADER = "sm90_mx_bf16_gemm_builder"
BF16_ROUTE_BUILDER = "persistent_gemm::kernel::Sm90MxBf16Gemm"
BF16_ROUTE_VARIANTS = (Variant(True, True, "bf16", "block", False), Variant(True, True, "fp32", "block", False))

# The FP8 x FP4 fold route (KernelConfig.route == "fold"): the promotion builder with the weight's
# tag for a scale-folding conversion; one TU holds the config's variants.
FOLD_OPERAND_X = "persistent_gemm::collective::MxOperandE2m1Fold"

LOWERINGS: dict[tuple[str, str], Lowering] = {(r.arch, r.family): r for r in (
    Lowering("sm90a", "mxfp8", "e4m3", "e4m3", operand_x="persistent_gemm::collective::MxOperandE4m3",
             gemv_weight="persistent_gemm::kernel::GemvWeightE4m3", **_SM90_MX),
    Lowering("sm90a", "e4m3xe2m1", "e4m3", "e2m1", operand_x="persistent_gemm::collective::MxOperandE2m1",
             gemv_weight="persistent_gemm::kernel::GemvWeightE2m1", **_SM90_MX),
    # Weight-only MX: the decode GEMV with bf16 activations (no activation scales); bf16 or fp32 D.
    Lowering("sm90a", "bf16xe4m3", "bf16", "e4m3", operand_x="persistent_gemm::collective::MxOperandE4m3",
             gemv_weight="persistent_gemm::kernel::GemvWeightE4m3",
             activation="persistent_gemm::kernel::ActivationsBf16", **_SM90_WEIGHT_ONLY),
    Lowering("sm90a", "bf16xe2m1", "bf16", "e2m1", operand_x="persistent_gemm::collective::MxOperandE2m1",
             gemv_weight="persistent_gemm::kernel::GemvWeightE2m1",
             activation="persistent_gemm::kernel::ActivationsBf16", **_SM90_WEIGHT_ONLY),
    Lowering("sm90a", "bf16", "bf16", "bf16", **_SM90, **_sixteen_bit_sm90("bf16")),
    Lowering("sm90a", "fp16", "fp16", "fp16", **_SM90, **_sixteen_bit_sm90("fp16")),
    Lowering("sm90a", "e4m3", "e4m3", "e4m3", **_SM90,
             primary=_FP8_TUNED + (Variant(True, True, "fp32", "tensor"), Variant(True, True, "fp32", "row")),
             tuned=_FP8_TUNED),
    # SM100 16-bit mm: D in the inputs' dtype or fp32 (K-major operands; others take a K-major copy).
    Lowering("sm100a", "bf16", "bf16", "bf16", **_SM100,
             primary=(Variant(True, True, "bf16"), Variant(True, True, "fp32")), tuned=(Variant(True, True, "bf16"),)),
    Lowering("sm100a", "fp16", "fp16", "fp16", **_SM100,
             primary=(Variant(True, True, "fp16"), Variant(True, True, "fp32")), tuned=(Variant(True, True, "fp16"),)),
    # SM100 scaled_mm: e4m3 on tcgen05 (kind::f8f6f4, fp32 accumulation in TMEM), tensorwise or
    # rowwise scales in the epilogue (Sm100Gemm's Scale); the SM90 e4m3 variant policy.
    Lowering("sm100a", "e4m3", "e4m3", "e4m3", **_SM100,
             primary=_FP8_TUNED + (Variant(True, True, "fp32", "tensor"), Variant(True, True, "fp32", "row")),
             tuned=_FP8_TUNED),
    Lowering("sm100a", "mxfp8", "e4m3", "e4m3", **_SM100_MX),
    Lowering("sm100a", "e4m3xe2m1", "e4m3", "e2m1", **_SM100_MX),
)}


def lowering(arch: str, family: str) -> Optional[Lowering]:
    """The record for (arch, family), or None where no kernel is generated yet."""
    return LOWERINGS.get((arch, family))


def fit_variants(config, variants) -> list:
    """``variants`` as a config of the SM90 GEMM builder can take them (its static_asserts):
    a swap-AB kernel reads both operands K-major and writes its transposed D by predicated
    stores; a split-K kernel's partial units skip the epilogue, which the predicated one allows
    (stream-K kernels keep the TMA store: the roles step its states past a partial piece)."""
    low = lowering(config.arch, config.dtype)
    if low is None or low.tu != "gemm":
        return list(variants)
    out = []
    for v in variants:
        if config.swap_ab and not (v.a_k_major and v.b_k_major):
            continue
        if config.swap_ab or config.schedule.split_k > 1:
            v = replace(v, tma_store=False)
        if v not in out:
            out.append(v)
    return out
