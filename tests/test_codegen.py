"""The code generator: named placeholders, one file per variant named by the canonical name,
the build filter, and the kernel table it writes."""

from string import Template

import pytest

from persistent_gemm import catalogue, codegen
from persistent_gemm.catalogue import CATALOGUE, ConfigError
from persistent_gemm.library import SCALE_MODES
from support.kernel_table_rows import entry_rows


def test_templates_fail_on_missing_placeholder():
    cfg = CATALOGUE[0]
    args = cfg.template_args()
    del args["schedule_tag"]
    with pytest.raises(KeyError, match="schedule_tag"):
        codegen._SCHEDULE.substitute(args, ident="x")
    # Every template's placeholders are well formed ($name or ${name}: a stray $ would only
    # fail when that template is first filled), and every template has some.
    templates = {name: obj for name, obj in vars(codegen).items() if isinstance(obj, Template)}
    assert len(templates) >= 8
    for name, t in templates.items():
        assert t.is_valid(), name
        assert t.get_identifiers(), name


def test_lowering_to_template_parameters():
    cfg = catalogue.KernelConfig.from_name("sm90a_bf16_128x256x64_c2x1_sw8_row_coop")
    ta = cfg.template_args()
    assert ta["tile_shape"] == "cute::Shape<cute::_128, cute::_256, cute::_64>"
    assert ta["cluster_shape"] == "cute::Shape<cute::_2, cute::_1, cute::_1>"
    assert ta["schedule_tag"] == ("persistent_gemm::scheduler::PersistentSchedule<8, 2, 1, "
                                  "persistent_gemm::scheduler::Raster::Row>")
    assert ta["kernel_style"] == "persistent_gemm::kernel::Cooperative"
    col = catalogue.KernelConfig.from_name("sm90a_fp16_128x128x64_c1x2_sw3_column_pp_s5")
    assert col.template_args()["schedule_tag"].endswith("<3, 1, 2, persistent_gemm::scheduler::Raster::Column>")
    assert col.template_args()["stages"] == "5"


def test_generate_writes_named_files(tmp_path):
    out = codegen.generate(tmp_path, ["sm90a", "sm100a"], pattern="")
    names = {p.name for p in out["sm90a"]}
    for cfg in CATALOGUE:
        if cfg.arch != "sm90a":
            continue
        if cfg.kernel == "gemv":  # the decode GEMVs: one TU per family (and grouped), no tile-scheduler walk
            tu = f"sm90a_{cfg.dtype}_gemv{'_grouped' if cfg.schedule.grouped else ''}.cu"
            assert tu in names and f"{cfg.name}.cu" not in names
            text = (tmp_path / "sm90a" / tu).read_text()
            assert all(f"run_{codegen.ident(cfg.name)}__{v.suffix}(" in text for v in codegen.variants(cfg))
            continue
        # One TU per config: its scheduler walk and every variant (none in another config's TU).
        assert f"{cfg.name}.cu" in names
        text = (tmp_path / "sm90a" / f"{cfg.name}.cu").read_text()
        assert f"cudaError_t schedule_{codegen.ident(cfg.name)}(" in text
        assert all(f"run_{codegen.ident(cfg.name)}__{v.suffix}(" in text for v in codegen.variants(cfg))
    table = (tmp_path / "catalogue_table.cpp").read_text()
    for cfg in (*CATALOGUE, *codegen.PARITY_PROBES):
        assert f'"{cfg.name}"' in table
    kt = (tmp_path / "sm90a" / "kernel_table.cpp").read_text()
    assert '"sm90a", 9, 0' in kt


def test_config_tus_split_at_the_memory_cap(monkeypatch):
    # A config with more variants than MAX_KERNELS_PER_TU spreads them over several TUs, each
    # kernel exactly once, the walk only in the first; each TU includes a header once.
    cfg = next(c for c in CATALOGUE if c.name == "sm90a_e4m3_128x128x128_c2x1_sw8_row_coop")
    chosen = codegen.variants(cfg)
    assert len(chosen) == 4
    monkeypatch.setattr(codegen, "MAX_KERNELS_PER_TU", 3)
    tus = codegen.config_tus(cfg, chosen)
    assert len(tus) == 2
    walk = f"cudaError_t schedule_{codegen.ident(cfg.name)}("
    assert [walk in t for t in tus] == [True, False]
    for v in chosen:
        assert sum(f"run_{codegen.ident(cfg.name)}__{v.suffix}(" in t for t in tus) == 1
    for t in tus:
        includes = [line for line in t.splitlines() if line.startswith("#include")]
        assert len(includes) == len(set(includes)) and '#include "persistent_gemm/kernel/sm90_gemm_builder.hpp"' in includes
    assert [t.count("namespace k_") // 2 for t in tus] == [3, 1]
    # One kernel alone (the contract and SASS tests' TU): no walk.
    assert walk not in codegen.kernel_tu(cfg, chosen[0])


def test_kernel_table_carries_each_configs_geometry(tmp_path):
    # The dispatcher's cost model reads tile, cluster, style and split from the entry, never the name;
    # 2-SM UMMA entries carry the per-CTA tile (half the MMA tile's M) that the scheduler counts.
    codegen.generate(tmp_path, ["sm90a", "sm100a"], pattern="")
    for arch in ("sm90a", "sm100a"):
        kt = (tmp_path / arch / "kernel_table.cpp").read_text()
        for cfg in (c for c in CATALOGUE if c.arch == arch):
            (tm, tn), tk = cfg.cta_tile, cfg.tile[2]
            cm, cn = cfg.schedule.cluster
            style = codegen._STYLE_ENUM[cfg.kernel]
            rows = [r for r in entry_rows(kt) if r["config"] == cfg.name]
            assert rows, cfg.name
            for row in rows:
                sk = cfg.schedule.split_k
                geometry = tuple(row[f] for f in ("tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "style", "split_k", "stream_k"))
                assert geometry == (*map(str, (tm, tn, tk, cm, cn)), f"KernelStyle::{style}", str(sk),
                                    str(cfg.schedule.stream_k).lower()), (cfg.name, row)
                assert row["workspace"].startswith(f"&gen::workspace_{codegen.ident(cfg.name)}__"), (cfg.name, row)
    two_sm = next(c for c in CATALOGUE if c.kernel == "2sm")
    assert two_sm.cta_tile[0] == two_sm.tile[0] // 2


def test_generate_filter_and_stale_removal(tmp_path):
    codegen.generate(tmp_path, ["sm90a"], pattern="")
    before = {p.name for p in (tmp_path / "sm90a").iterdir()}
    out = codegen.generate(tmp_path, ["sm90a"], pattern="_fp16_")
    after = {p.name for p in (tmp_path / "sm90a").iterdir()}
    assert all("_bf16_" not in n for n in after) and any("_bf16_" in n for n in before)
    assert after == {p.name for p in out["sm90a"]}  # stale files are gone


def test_selected_rejects_bad_regex(monkeypatch):
    monkeypatch.setenv(catalogue.KERNELS_ENV, "([")
    with pytest.raises(ConfigError, match="PGEMM_KERNELS"):
        catalogue.selected()


def test_variant_suffixes_unique():
    for cfg in CATALOGUE:
        sfx = [v.suffix for v in codegen.variants(cfg)]
        assert len(sfx) == len(set(sfx)), cfg.name


# -- the lowering tables ----------------------------------------------------------------------------
def test_element_spellings_exist_in_cpp_and_torch():
    import torch
    from pathlib import Path

    from persistent_gemm.library import ELEMENTS

    registry = (Path(codegen.__file__).parents[2] / "include" / "persistent_gemm" / "registry.h").read_text()
    enum = registry.split("enum class DType")[1].split("};")[0]
    for e in ELEMENTS.values():
        assert f"{e.registry} =" in enum, e.name
        assert isinstance(getattr(torch, e.torch), torch.dtype), e.name


def test_every_config_lowers_through_its_family_record():
    from persistent_gemm.library import ELEMENTS, LOWERINGS

    for cfg in CATALOGUE:
        low = LOWERINGS.get((cfg.arch, cfg.dtype))
        if low is None:  # a family with schedules but no kernel yet: nothing generated
            assert codegen.variants(cfg) == []
            with pytest.raises(ValueError, match="no lowering"):
                codegen.kernel_tu(cfg, codegen.Variant(True, True, "bf16"))
            continue
        for v in codegen.variants(cfg):
            tu = codegen.kernel_tu(cfg, v)
            if cfg.kernel == "gemv":  # the MX decode GEMV: its header, the weight's tag, the token tile
                assert '#include "persistent_gemm/kernel/gemv_builder.hpp"' in tu
                assert f"using OperandW = {low.gemv_weight};" in tu and f"constexpr int kTokens = {cfg.tile[1]};" in tu
                assert "using Gemm = persistent_gemm::kernel::Sm90MxGemvBuilder<Spec>;" in tu
                continue
            if cfg.route == "bf16":  # the MX bf16 route: its own builder, the weight's tag, no promotion
                from persistent_gemm.library import BF16_ROUTE_BUILDER, BF16_ROUTE_HEADER

                assert f'#include "persistent_gemm/kernel/{BF16_ROUTE_HEADER}.hpp"' in tu
                assert f"using OperandX = {low.operand_x};" in tu and f"using Gemm = {BF16_ROUTE_BUILDER}<Spec>;" in tu
                assert f"using ElementD = {ELEMENTS[v.out].cpp};" in tu
                assert v.scale == "block" and not v.tma_store and cfg.swap_ab and cfg.tile[2] == 64
                continue
            assert f"#include \"persistent_gemm/kernel/{low.header}.hpp\"" in tu
            assert f"using ElementD = {ELEMENTS[v.out].cpp};" in tu
            # Lowering by named spec: one Spec struct, the builder reads its members by name.
            assert f"using Gemm = {low.builder}<Spec>;" in tu and "struct Spec {" in tu
            if cfg.route == "fold":  # the fold route: the promotion builder, the folding weight tag
                from persistent_gemm.library import FOLD_OPERAND_X

                assert f"using OperandX = {FOLD_OPERAND_X};" in tu and "constexpr bool kSwapAB = true;" in tu
                assert cfg.dtype == "e4m3xe2m1" and cfg.tile[2] == 128 and v.scale == "block" and not v.tma_store
                continue
            if low.tu == "sm100_mx":  # SM100 MX: the weight's element, the MMA tile, TMA store
                assert f"using ElementB = {ELEMENTS[low.b].cpp};" in tu
                assert f"using TileShape = cute::Shape<cute::_{cfg.tile[0]}, cute::_{cfg.tile[1]}, cute::_128>;" in tu
                assert v.scale == "block" and v.tma_store
                continue
            if low.operand_x is not None:  # MX: the X operand's tag, the swap flag
                assert f"using OperandX = {low.operand_x};" in tu
                assert f"constexpr bool kSwapAB = {str(cfg.swap_ab).lower()};" in tu
                assert v.scale == "block" and not v.tma_store
                continue
            assert f"using ElementA = {ELEMENTS[low.a].cpp};" in tu
            assert f"using ElementB = {ELEMENTS[low.b].cpp};" in tu
            assert f"static constexpr auto kScale = persistent_gemm::ScaleMode::{SCALE_MODES[v.scale]};" in tu
            # Sm90Gemm's epilogue members (Sm100Gemm has a scale mode only)
            assert ("static constexpr bool kTmaStore = " in tu) == low.epilogue_args
            assert ("using Accumulation = " in tu) == low.epilogue_args
            if low.epilogue_args:  # swap-AB and split-K kernels write D by predicated stores
                assert f"constexpr bool kSwapAB = {str(cfg.swap_ab).lower()};" in tu
                assert not v.tma_store or not (cfg.swap_ab or cfg.schedule.split_k > 1)


def test_mx_lowerings():
    # SM90: our own mainloop (Sm90MxGemm); SM100: CUTLASS's block-scaled collective in our kernel.
    from persistent_gemm.library import lowering

    for family, x, b in (("mxfp8", "MxOperandE4m3", "e4m3"), ("e4m3xe2m1", "MxOperandE2m1", "e2m1")):
        low = lowering("sm90a", family)
        assert low is not None and low.block_scale == "e8m0" and low.operand_x.endswith(x) and low.tu == "sm90_mx"
        low = lowering("sm100a", family)
        assert low.tu == "sm100_mx" and low.builder.endswith("Sm100MxGemm") and (low.a, low.b) == ("e4m3", b)
        assert all(v.tma_store and v.scale == "block" for v in low.primary)


def test_mx_entries_carry_swap_ab_and_block_scales():
    from persistent_gemm.catalogue import selected

    table = codegen.kernel_table("sm90a", selected("mxfp8|e4m3xe2m1", archs=("sm90a",)))
    assert "&gen::scale_to_blocked" in table
    for cfg in selected("mxfp8|e4m3xe2m1", archs=("sm90a",)):
        for v in codegen.variants(cfg):
            kid = codegen.ident(f"{cfg.name}__{v.suffix}")
            row = next(r for r in entry_rows(table) if r["run"] == f"&gen::run_{kid}")
            assert row["config"] == cfg.name and row["workspace"] == f"&gen::workspace_{kid}"
            assert row["scale_mode"] == "ScaleMode::Block32"
            assert (row["tma_store"], row["fast_accum"], row["swap_ab"]) == ("false", "false", str(cfg.swap_ab).lower())


def test_sm100_scaled_mm_lowering():
    """SM100 scaled_mm: Sm100Gemm with e4m3 operands and the scale mode as its last parameter;
    the SM90 e4m3 variant policy (bf16 and fp32 out x tensorwise and rowwise, K-major, TMA store)
    in one TU with the config's walk; table entries neither fast nor fusing the bias (sm100a)."""
    from persistent_gemm.library import lowering

    low = lowering("sm100a", "e4m3")
    assert low is not None and low.builder.endswith("::Sm100Gemm") and (low.a, low.b) == ("e4m3", "e4m3")
    assert low.tu == "gemm" and not low.epilogue_args and low.block_scale is None
    cfg = catalogue.lookup("sm100a_e4m3_256x256x128_c2x1_sw8_row_2sm")
    vs = codegen.variants(cfg)
    assert {(v.out, v.scale) for v in vs} == {(o, s) for o in ("bf16", "fp32") for s in ("tensor", "row")}
    assert all(v.a_k_major and v.b_k_major and v.tma_store for v in vs)
    tus = codegen.config_tus(cfg, vs)
    assert len(tus) == 1, "one new sm100a translation unit"
    for v in vs:
        mode = {"tensor": "Tensorwise", "row": "Rowwise"}[v.scale]
        body = tus[0].split(f"namespace k_{codegen.ident(cfg.name)}__{v.suffix} {{")[1].split("}  // namespace")[0]
        assert "using ElementA = cutlass::float_e4m3_t;" in body
        assert f"constexpr auto kScale = persistent_gemm::ScaleMode::{mode};" in body
        assert "};\nusing Gemm = persistent_gemm::kernel::Sm100Gemm<Spec>;" in body
    table = codegen.kernel_table("sm100a", [cfg])
    rows = [r for r in entry_rows(table) if r["config"] == cfg.name]
    assert len(rows) == 4
    for r in rows:
        assert r["scale_mode"] in ("ScaleMode::Tensorwise", "ScaleMode::Rowwise")
        assert (r["tma_store"], r["fast_accum"], r["swap_ab"], r["fused_bias"]) == ("true", "false", "false", "false")
        # the per-CTA tile
        assert [r[f] for f in ("tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n")] == ["128", "256", "128", "2", "1"]
        assert (r["style"], r["split_k"], r["stream_k"]) == ("KernelStyle::Umma2Sm", "1", "false")


def test_every_builder_takes_one_named_spec(tmp_path):
    """Lowering by named spec: each kernel's namespace holds one ``struct Spec`` and instantiates
    ``<builder><Spec>``; no positional builder call is left, and each builder header checks the
    members it reads (PGEMM_SPEC_REQUIRE, kernel/builder_spec.hpp)."""
    import re
    from pathlib import Path

    files = codegen.generate(tmp_path, ["sm90a", "sm100a"])
    builders = set()
    for arch in ("sm90a", "sm100a"):
        for p in files[arch]:
            if p.suffix != ".cu" or p.name == "scale_layout.cu":
                continue
            text = p.read_text()
            gemms = re.findall(r"using Gemm = ([\w:]+)<([^>]*)>;", text)
            assert gemms and all(arg == "Spec" for _, arg in gemms), p.name
            assert text.count("struct Spec {") == len(gemms), p.name
            builders |= {b.split("::")[-1] for b, _ in gemms}
    assert builders == {"Sm90Gemm", "Sm90MxGemm", "Sm90MxBf16Gemm", "Sm90MxGemvBuilder", "Sm100Gemm", "Sm100MxGemm"}
    kernel = Path(codegen.__file__).resolve().parents[2] / "include" / "persistent_gemm" / "kernel"
    for header in kernel.glob("*_builder.hpp"):
        text = header.read_text()
        assert "template <class Spec" in text and "PGEMM_SPEC_" in text, header


def test_extended_mma_shapes_macro_only_in_the_tus_that_need_it():
    """A tile whose N CUTLASS offers only under CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED gets the
    macro at the top of its own TU (before any header); the other catalogue TUs do not define
    it, because it makes a TU compile about 70% longer (archs.ArchSpec.plain_mma_n)."""
    macro = "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"
    extended = {c.name for c in CATALOGUE if codegen.needs_extended_mma_shapes(c)}
    assert extended == {"sm90a_bf16_128x144x64_c1x2_sw1_row_sk2_coop_swapab",
                        "sm90a_e4m3_128x144x128_c1x2_sw1_row_sk2_coop_swapab_fastacc",
                        "sm90a_bf16_128x208x64_c4x1_sw8_row_coop"}
    for cfg in CATALOGUE:
        tus = codegen.config_tus(cfg, codegen.variants(cfg))
        assert all((macro in tu) == (cfg.name in extended) for tu in tus), cfg.name
    for name, needs in [("sm90a_bf16_64x144x64_c1x1_sw1_row_pp_swapab", True),
                        ("sm90a_e4m3_128x208x128_c2x1_sw8_row_coop_fastacc", True),
                        ("sm90a_bf16_128x192x64_c2x1_sw8_row_coop", False),
                        ("sm100a_bf16_256x144x64_c2x1_sw8_row_2sm", False)]:
        cfg = catalogue.KernelConfig.from_name(name)
        assert codegen.needs_extended_mma_shapes(cfg) == needs, name
        if cfg.rejection() or cfg.kernel_rejection():
            continue
        for tu in codegen.config_tus(cfg, codegen.variants(cfg)):
            assert (macro in tu) == needs, name
            if needs:
                assert tu.index(macro) < tu.index("#include"), "the macro must precede CUTLASS's headers"
