"""FP8 accumulation modes on the CPU side: catalogue names, the register-budget rule, lowering,
the kernel table, the dispatcher's filter and the use_fast_accum argument of scaled_mm."""

import pytest
import torch

import persistent_gemm as pg
from persistent_gemm import archs, catalogue, codegen
from support.kernel_table_rows import entry_rows
from persistent_gemm.catalogue import CATALOGUE, MX_DTYPES, WEIGHT_ONLY_DTYPES, ConfigError, KernelConfig
from persistent_gemm.config_rules import promoted_slice_n, sliced_promotion_extra_registers


def _fp8(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) + 3.0).to(torch.float8_e4m3fn)


# -- catalogue ------------------------------------------------------------------------------------
def test_fast_accumulation_is_a_name_token_and_round_trips():
    fast = KernelConfig(tile=(128, 256, 128), dtype="e4m3", accum="fast",
                        schedule=pg.TileSchedule(swizzle=8, cluster=(2, 1)))
    assert fast.name == "sm90a_e4m3_128x256x128_c2x1_sw8_row_coop_fastacc"
    assert KernelConfig.from_name(fast.name) == fast
    staged = KernelConfig.from_name("sm90a_e4m3_128x128x128_c1x2_sw8_row_pp_fastacc_s4")
    assert staged.accum == "fast" and staged.stages == 4 and staged.name.endswith("_fastacc_s4")
    promoted = KernelConfig(tile=(128, 128, 128), dtype="e4m3")
    assert promoted.accum == "promoted" and "fastacc" not in promoted.name


def test_catalogue_has_both_fp8_modes_and_promoted_is_the_default_family():
    e4m3 = [c for c in CATALOGUE if c.dtype == "e4m3" and c.arch == "sm90a"]
    assert {c.accum for c in e4m3} == {"promoted", "fast"}
    # Every shape class the dispatcher serves (large, decode) has a promoted kernel.
    promoted = [c for c in e4m3 if c.accum == "promoted"]
    assert any(c.kernel == "cooperative" for c in promoted)
    assert any(c.cta_tile[1] == 64 for c in promoted)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fast_accumulation_is_refused_for_16_bit_operands(dtype):
    with pytest.raises(ConfigError, match="FP8 mainloop option"):
        KernelConfig(tile=(128, 256, 64), dtype=dtype, accum="fast")


def test_accum_must_be_known():
    with pytest.raises(ConfigError, match="accum must be one of"):
        KernelConfig(tile=(128, 128, 128), dtype="e4m3", accum="fp32")


@pytest.mark.parametrize("tile,kernel,slice_n", [
    ((128, 256, 128), "cooperative", 64),   # 128 + 2 x 32 (slice temporaries) + 16 (A) = 208
    ((128, 256, 64), "cooperative", 64),
    ((128, 192, 128), "cooperative", 32),   # 3 slices of 64 is odd: 6 of 32
    ((128, 224, 128), "cooperative", 16),   # 7 slices of 32 is odd: 14 of 16
    ((128, 128, 128), "pingpong", -1),      # one WG owns the tile: 3 x 128, and no sliced ping-pong
    ((256, 128, 128), "cooperative", -1),   # 3 x 128; sliced tiles are 128 rows
    ((128, 208, 128), "cooperative", -1),   # 208 = 13 x 16: no even slice count
    ((128, 128, 128), "cooperative", 0),    # 3 x 64: at the budget, whole-tile temporaries
    ((128, 64, 128), "pingpong", 0),
    ((64, 64, 128), "pingpong", 0),
])
def test_promoted_register_budget(tile, kernel, slice_n):
    make = lambda accum: KernelConfig(tile=tile, kernel=kernel, dtype="e4m3", accum=accum,
                                      schedule=pg.TileSchedule(swizzle=8, cluster=(1, 2)))
    if slice_n >= 0:
        assert promoted_slice_n(make("promoted")) == slice_n
    else:
        with pytest.raises(ConfigError, match="two in-flight temporaries.*N-slices"):
            make("promoted")
    make("fast")  # fast accumulation holds one accumulator: every tile fits


def test_sliced_promotion_takes_the_widest_slice_its_budget_allows():
    # 128x256: the accumulator (128) + two 64-wide temporaries (2 x 32) + one A fragment of a
    # 128-deep K-tile (16) = 208, the budget; two fragments (224) are not, 32-wide slices are
    # narrower than needed. At K = 64 the fragments halve: two fit.
    budget = archs.ARCHS["sm90a"].limits.sliced_promotion_register_budget
    assert 128 + sliced_promotion_extra_registers(64, 128) == 208 <= budget
    assert 128 + sliced_promotion_extra_registers(64, 128, double_a=True) == 224 > budget
    assert 128 + sliced_promotion_extra_registers(64, 64, double_a=True) == 208


def test_slice_rule_mirrors_the_cpp_header():
    from pathlib import Path
    root = Path(catalogue.__file__).parents[2] / "include" / "persistent_gemm" / "kernel"
    rule = (root / "promotion_rule.hpp").read_text()
    # The same candidates, in the same order, the same register sum, the same budgets.
    assert "constexpr int kWidths[] = {64, 32, 16};" in rule
    assert "(tile_n / slice) % 2 == 0" in rule and "if (!coop || tile_m != 128) return -1;" in rule
    assert "return 2 * (64 * slice_n / 128) + (double_a ? 2 : 1) * (64 * tile_k / 128 / 4);" in rule
    builder = (root / "sm90_gemm_builder.hpp").read_text()
    assert "kAccumulatorRegisterBudget, arch_limits::sm90a::kSlicedPromotionRegisterBudget);" in builder


def test_register_budget_mirrors_the_cpp_static_assert():
    from pathlib import Path
    hpp = (Path(catalogue.__file__).parents[2] / "include" / "persistent_gemm" / "kernel" /
           "sm90_gemm_builder.hpp").read_text()
    # The builder reads archs.py's limit from the generated header (test_archs checks its values).
    assert "kAccumulatorRegisterBudget = arch_limits::sm90a::kAccumulatorRegisterBudget;" in hpp
    assert catalogue.SM90_ACCUMULATOR_REGISTER_BUDGET == archs.ARCHS["sm90a"].limits.accumulator_register_budget


# -- lowering -------------------------------------------------------------------------------------
def test_lowering_names_the_accumulation_tag():
    # The MX builder has no accumulation choice (it promotes every 32-K block), nor has the
    # weight-only GEMV (fp32 over the whole K): not their TUs.
    for c in (c for c in CATALOGUE if c.arch == "sm90a" and c.dtype not in MX_DTYPES + WEIGHT_ONLY_DTYPES):
        for v in codegen.variants(c):
            tu = codegen.kernel_tu(c, v)
            tag = "AccumFast" if c.accum == "fast" else "AccumPromoted"
            assert f"using Accumulation = persistent_gemm::kernel::{tag};" in tu, c.name
            assert "using ElementA = " in tu and "using Gemm = persistent_gemm::kernel::Sm90Gemm<Spec>;" in tu


def test_kernel_table_marks_fast_entries(tmp_path):
    codegen.generate(tmp_path, ["sm90a"], pattern="")
    kt = (tmp_path / "sm90a" / "kernel_table.cpp").read_text()
    for c in (c for c in CATALOGUE if c.arch == "sm90a"):
        rows = [r for r in entry_rows(kt) if r["config"] == c.name]
        assert rows, c.name
        want = "true" if c.accum == "fast" else "false"
        for r in rows:
            assert r["fast_accum"] == want, (c.name, r)


def test_each_accumulation_mode_has_its_own_primary():
    # The first config of each (arch, dtype, accum) carries the fp32-output variants, so either
    # mode serves every out dtype without borrowing the other mode's kernels.
    for accum in ("promoted", "fast"):
        first = next(c for c in CATALOGUE if (c.arch, c.dtype, c.accum) == ("sm90a", "e4m3", accum))
        assert {v.out for v in codegen.variants(first)} == {"bf16", "fp32"}


# -- the op and the dispatcher --------------------------------------------------------------------
needs_ext = pytest.mark.skipif(not pg.extension_available(), reason="needs the compiled extension")


@needs_ext
def test_scaled_mm_schema_has_use_fast_accum_with_torchs_default():
    schema = torch.ops.persistent_gemm.scaled_mm.default._schema
    arg = next(a for a in schema.arguments if a.name == "use_fast_accum")
    assert str(arg.type) == "bool" and arg.default_value is False


@needs_ext
@pytest.mark.parametrize("fast", [False, True])
def test_cpu_reference_is_exact_in_either_mode(fast):
    a, b = _fp8(33, 96, 0), _fp8(17, 96, 1).t()
    out = pg.scaled_mm(a, b, torch.tensor(0.5), torch.tensor(2.0), out_dtype=torch.float32, use_fast_accum=fast)
    ref = a.double() @ b.double()
    # fp32 accumulation of small-integer-valued e4m3 products is exact here; only the final
    # rounding to fp32 remains.
    assert ((out.double() - ref).abs() <= ref.abs() * 2 ** -23).all()


@needs_ext
def test_forced_fast_config_needs_use_fast_accum():
    a, b = _fp8(8, 64, 0), _fp8(8, 64, 1).t()
    one = torch.ones(())
    fast = next(c.name for c in CATALOGUE if c.accum == "fast")
    with pytest.raises(ValueError, match="use_fast_accum"):
        pg.scaled_mm(a, b, one, one, config=fast)
    pg.scaled_mm(a, b, one, one, config=fast, use_fast_accum=True)  # allowed
    promoted = next(c.name for c in CATALOGUE if c.dtype == "e4m3" and c.accum == "promoted")
    pg.scaled_mm(a, b, one, one, config=promoted, use_fast_accum=True)  # more accurate: allowed


def _sm90_e4m3_built(fast):
    if not pg.extension_available() or "sm90a" not in pg.built_archs():
        return []
    return [k for k in pg._C.built_kernels()
            if k["arch"] == "sm90a" and "_e4m3_" in k["config"] and k["fast_accum"] == fast]


@pytest.mark.skipif(not _sm90_e4m3_built(False), reason="needs a promoted e4m3 sm90a kernel built")
@pytest.mark.parametrize("m", [1, 128, 8192])
def test_dispatcher_never_picks_fast_accumulation_unless_allowed(m):
    d = pg.explain(m, 8192, 8192, dtype="e4m3", scale="tensor")
    assert not d.fast_accum and "_fastacc" not in d.config
    assert "promoted fp32 accumulation" in d.log[0]
    if _sm90_e4m3_built(True):
        assert any("use_fast_accum=False" in line for line in d.log if line.startswith("rejected"))


@pytest.mark.skipif(not (_sm90_e4m3_built(False) and _sm90_e4m3_built(True)),
                    reason="needs both e4m3 accumulation modes built")
def test_fast_accumulation_wins_where_compute_bound():
    # Compute-bound: the promoted kernels pay a drain of the tensor core every k-tile.
    assert pg.explain(8192, 8192, 8192, dtype="e4m3", scale="tensor", use_fast_accum=True).fast_accum
    forced = [pg.explain(8192, 8192, 8192, dtype="e4m3", scale="tensor", use_fast_accum=True, config=k["config"])
              for k in _sm90_e4m3_built(True) + _sm90_e4m3_built(False)]
    assert min(forced, key=lambda d: d.estimate_us).fast_accum


def _sm100_e4m3_built():
    if not pg.extension_available() or "sm100a" not in pg.built_archs():
        return []
    return [k for k in pg._C.built_kernels() if k["arch"] == "sm100a" and "_e4m3_" in k["config"]]


@pytest.mark.skipif(not _sm100_e4m3_built(), reason="needs an sm100a e4m3 kernel built")
@pytest.mark.parametrize("scale", ["tensor", "row"])
def test_sm100_scaled_mm_serves_both_accumulation_modes_with_one_kernel(scale):
    # tcgen05 accumulates in fp32: no _fastacc kernel, the same pick and estimate either way, no
    # promotion charged; the log says what the kernel does.
    assert not any(k["fast_accum"] for k in _sm100_e4m3_built())
    for m in (1, 4096):
        slow, fast = (pg.explain(m, 8192, 8192, dtype="e4m3", scale=scale, arch="sm100a", use_fast_accum=f)
                      for f in (False, True))
        assert slow.config == fast.config and slow.config.startswith("sm100a_e4m3_")
        assert slow.estimate_us == fast.estimate_us and not fast.fast_accum
        assert "fp32 accumulation in TMEM" in slow.log[0] and "promoted" not in slow.log[0]
