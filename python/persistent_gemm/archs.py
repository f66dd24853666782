"""The one description of each GPU architecture persistent_gemm builds for.

Everything that used to spell an arch itself reads :data:`ARCHS`: ``setup.py`` (the
``TORCH_CUDA_ARCH_LIST`` spelling, the nvcc ``-gencode`` and the minimum nvcc), the catalogue
(names, kernel styles), the code generator (compute capability, cost-model constants and the
hardware-validation flag written into each arch module's kernel table), the package's module
loader, the demo, ``explain``/the CLI and the tests. Its :class:`ArchLimits` are the one home of
the hardware limits: the config rules read them here, the builders' static_asserts from the
header codegen writes.

Importable without torch (``setup.py`` loads it before torch's build machinery).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

__all__ = ["ArchLimits", "CostModel", "ArchSpec", "ARCHS", "ARCH_NAMES", "arch", "by_capability", "by_torch_arch"]


@dataclass(frozen=True)
class CostModel:
    """Constants of the dispatcher's cost model (``csrc/cost_model.cpp``), per arch.

    ``measured`` says whether they were fitted on that hardware by this project; ``source``
    says where they come from."""

    clock_ghz: float               # sustained SM clock under GEMM load
    flops_per_clk_16bit: float     # dense bf16/fp16 MMA flops per SM per clock (fp8: 2x)
    mma_eff_max: float             # power/clock derating of the ideal MMA rate
    stage_overhead_clk: float      # per K-tile: barrier waits, issue, release
    sm_load_bytes_per_us: float    # one SM's sustained TMA inflow
    dram_bytes_per_us: float       # device memory, read + write, as GEMMs stream it
    l2_bytes_per_us: float         # L2 -> SMs, all SMs together
    launch_us: float               # grid start-up and the first tile's prologue
    #: MX block scales cost ALU work per 32-K block (SM90: FMUL + FFMA per accumulator element in
    #: the mainloop); False where the tensor core applies them (SM100 block_scale MMAs).
    mx_scales_in_alu: bool
    measured: bool
    source: str


def _limit(doc: str):
    return field(metadata={"doc": doc})


@dataclass(frozen=True)
class ArchLimits:
    """The hardware and kernel limits the config rules check, written only here: codegen emits
    them as ``constexpr`` members of ``persistent_gemm::arch_limits::<arch>``
    (include/persistent_gemm/generated/arch_limits.hpp, :func:`codegen.arch_limits_header`),
    which the builders' static_asserts read; ``config_rules`` reads them from here. 0: no such
    rule on that arch."""

    smem_bytes: int = _limit("opt-in dynamic shared memory per CTA (227 KB)")
    accumulator_register_budget: int = _limit(
        "accumulator registers a consumer thread may hold (of its 232), the rest being addressing and pipeline state")
    sliced_promotion_register_budget: int = _limit(
        "registers a consumer of the N-sliced promoting FP8 mainloop may hold in its accumulator, slice "
        "temporaries and A fragment together")
    mx_tile_k: int = _limit("K tile of the MX mainloop: one blocked-layout scale atom column (four 1x32 blocks)")
    mx_tile_n: int = _limit("N tile of the block-scaled UMMA per CTA")
    mx_epilogue_smem_bytes: int = _limit("the MX TMA-store epilogue's staging + barriers (an estimate)")

    def cpp(self) -> dict[str, int]:
        """``{constexpr name: value}``: smem_bytes -> kSmemBytes."""
        return {"k" + "".join(w.title() for w in f.name.split("_")): getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ArchSpec:
    name: str                       # arch module suffix and catalogue-name prefix: _C_<name>
    sm: tuple[int, int]             # compute capability
    torch_arch: str                 # its TORCH_CUDA_ARCH_LIST spelling
    gencode: str                    # nvcc target
    min_nvcc: tuple[int, int]       # first CUDA toolkit with this target
    styles: tuple[str, ...]         # kernel styles (catalogue.KernelConfig.kernel)
    default_style: str
    builder_header: str             # include/persistent_gemm/kernel/<header>.hpp (16-bit mm)
    sm_count: int                   # multiprocessors of the reference part (explain's default)
    part: str                       # the reference part the constants describe
    cost: CostModel
    #: The epilogue adds the ops' bias and alpha / beta in-kernel (KernelEntry::fused_bias); else
    #: the dispatcher applies them after the kernel, rounding twice. Grouped kernels fuse on every
    #: arch (an expert's bias row: nothing after the kernel knows a row's expert).
    fused_bias: bool
    #: False: this project has compiled the kernels but never run them on such a GPU. The
    #: dispatcher then self-checks each kernel on its first use in a process (csrc/self_check.cpp).
    validated_on_hardware: bool
    limits: ArchLimits
    #: MMA N extents CUTLASS's collective builder offers for this arch as its headers ship. A tile
    #: whose N is outside gets, from CuTe, the largest offered extent dividing it (a 64x144 SM90
    #: tile issued nine 64x16 wgmmas per K-step), unless its TU defines
    #: CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED: codegen does, in that TU only (the macro costs every
    #: TU about 70% more compile time: 104 s against 62 s for a bf16 kernel on 2 cores).
    #: Empty: no such rule (SM100 tiles take their UMMA N as they are).
    plain_mma_n: tuple[int, ...] = ()

    @property
    def family(self) -> str:
        return f"sm{self.sm[0]}{self.sm[1]}"


_H200 = CostModel(
    clock_ghz=1.755, flops_per_clk_16bit=4096, mma_eff_max=0.89, stage_overhead_clk=100,
    sm_load_bytes_per_us=80e3, dram_bytes_per_us=3.26e6, l2_bytes_per_us=7.6e6, launch_us=4.0,
    mx_scales_in_alu=True, measured=True,
    source="fitted on an H200 (benchmarks/results/h200_sweep.csv, in git at 7d1ac21)")

# Published B200 figures (not measured by this project): 148 SMs, 2.25 PFLOP/s dense bf16
# (8192 flops/SM/clk at ~1.85 GHz), 8 TB/s HBM3e. GEMM-visible fractions (DRAM, L2, per-SM TMA
# inflow, MMA derating) are the H200's, scaled by the peak ratios: a guess until measured.
_B200 = CostModel(
    clock_ghz=1.85, flops_per_clk_16bit=8192, mma_eff_max=0.89, stage_overhead_clk=100,
    sm_load_bytes_per_us=120e3, dram_bytes_per_us=6.2e6, l2_bytes_per_us=12e6, launch_us=4.0,
    mx_scales_in_alu=False, measured=False,
    source="published B200 peaks (148 SMs, 2.25 PFLOP/s bf16, 8 TB/s), unmeasured")

ARCHS: dict[str, ArchSpec] = {a.name: a for a in (
    ArchSpec(name="sm90a", sm=(9, 0), torch_arch="9.0a", gencode="-gencode=arch=compute_90a,code=sm_90a",
             min_nvcc=(12, 0), styles=("cooperative", "pingpong", "gemv"), default_style="cooperative",
             builder_header="sm90_gemm_builder", sm_count=132, part="H200", cost=_H200,
             fused_bias=True, validated_on_hardware=True,
             limits=ArchLimits(smem_bytes=232448, accumulator_register_budget=192, sliced_promotion_register_budget=208,
                               mx_tile_k=128, mx_tile_n=0,
                               mx_epilogue_smem_bytes=0),
             plain_mma_n=(8, 16, 32, 64, 96, 128, 192, 256)),
    ArchSpec(name="sm100a", sm=(10, 0), torch_arch="10.0a", gencode="-gencode=arch=compute_100a,code=sm_100a",
             min_nvcc=(12, 8), styles=("1sm", "2sm"), default_style="1sm",
             builder_header="sm100_gemm_builder", sm_count=148, part="B200", cost=_B200,
             fused_bias=False, validated_on_hardware=False,
             limits=ArchLimits(smem_bytes=232448, accumulator_register_budget=0, sliced_promotion_register_budget=0,
                               mx_tile_k=128, mx_tile_n=128,
                               mx_epilogue_smem_bytes=17408)),
)}

ARCH_NAMES: tuple[str, ...] = tuple(ARCHS)


def arch(name: str) -> ArchSpec:
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"arch must be one of {ARCH_NAMES}, got {name!r}") from None


def by_capability(major: int, minor: int) -> Optional[ArchSpec]:
    """The arch whose kernels run on a device of compute capability (major, minor), if any."""
    return next((a for a in ARCHS.values() if a.sm == (major, minor)), None)


def by_torch_arch(spelling: str) -> Optional[ArchSpec]:
    return next((a for a in ARCHS.values() if a.torch_arch == spelling), None)
