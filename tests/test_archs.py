"""One description per arch (persistent_gemm/archs.py), read by everything that spells one."""

import importlib
import re
from pathlib import Path

import pytest

import persistent_gemm as pg
from persistent_gemm import archs, catalogue, codegen
from persistent_gemm.catalogue import parse_name

explain = importlib.import_module("persistent_gemm.explain")  # the package exports the function
ROOT = Path(__file__).resolve().parents[1]


def test_table_is_the_one_spelling():
    assert tuple(archs.ARCHS) == catalogue.ARCHS == explain.ARCHS == pg.ARCH_MODULES
    for a in archs.ARCHS.values():
        assert catalogue.KERNEL_STYLES[a.name] == a.styles and a.default_style in a.styles
        assert a.gencode == f"-gencode=arch=compute_{a.sm[0]}{a.sm[1]}a,code=sm_{a.sm[0]}{a.sm[1]}a"
        assert a.torch_arch == f"{a.sm[0]}.{a.sm[1]}a"
        assert (ROOT / "include" / "persistent_gemm" / "kernel" / f"{a.builder_header}.hpp").is_file()
        assert archs.by_capability(*a.sm) is a and archs.by_torch_arch(a.torch_arch) is a
    assert archs.by_capability(8, 0) is None
    with pytest.raises(ValueError, match="arch must be one of"):
        archs.arch("sm80")


def test_no_other_file_spells_the_arch_list():
    """The places that used to spell the archs themselves now read the table."""
    for rel in ("setup.py", "python/persistent_gemm/__init__.py", "python/persistent_gemm/demo.py",
                "python/persistent_gemm/explain.py", "python/persistent_gemm/codegen.py", "csrc/dispatch.cpp"):
        text = (ROOT / rel).read_text()
        assert not re.search(r"compute_\d+a|\"9\.0a\"|\"10\.0a\"|\(9, 0\): \"sm90a\"|9\.0a or 10\.0a", text), rel


def test_sm100_cost_model_is_marked_unmeasured():
    b200, h200 = archs.ARCHS["sm100a"].cost, archs.ARCHS["sm90a"].cost
    assert h200.measured and not b200.measured and "unmeasured" in b200.source
    assert not b200.mx_scales_in_alu and h200.mx_scales_in_alu
    assert not archs.ARCHS["sm100a"].validated_on_hardware and archs.ARCHS["sm90a"].validated_on_hardware


def test_codegen_writes_the_table_into_each_kernel_module(tmp_path):
    codegen.generate(tmp_path, list(archs.ARCHS), pattern="")
    for a in archs.ARCHS.values():
        kt = (tmp_path / a.name / "kernel_table.cpp").read_text()
        assert f'"{a.name}", {a.sm[0]}, {a.sm[1]}' in kt
        assert f"{a.sm_count}, {str(a.validated_on_hardware).lower()}}};" in kt
        assert "&gen::quantize_mxfp8" in kt
        if "KernelStyle::" in kt.split("kEntries[] = {", 1)[1].split("{.config = nullptr", 1)[0]:  # a built entry
            assert f".fused_bias = {str(a.fused_bias).lower()}, .route = MxRoute::" in kt
        assert f"{float(a.cost.dram_bytes_per_us)!r}" in kt and a.cost.source in kt
    ct = (tmp_path / "catalogue_table.cpp").read_text()
    for a in archs.ARCHS.values():
        assert f'{{"{a.name}", "{a.torch_arch}", {a.sm[0]}, {a.sm[1]}}}' in ct


def test_fused_bias_is_an_arch_property():
    # SM90 fuses the bias into its epilogues; SM100's kernels (compiled, not run) leave it to the
    # dispatcher, and their builders refuse a bias outright (can_implement).
    assert archs.ARCHS["sm90a"].fused_bias and not archs.ARCHS["sm100a"].fused_bias
    for path in ("sm100_gemm_builder.hpp", "sm100_mx_gemm_builder.hpp"):
        text = (Path(__file__).resolve().parents[1] / "include/persistent_gemm/kernel" / path).read_text()
        assert "bias != nullptr || " in text, path


@pytest.mark.skipif(not pg.extension_available(), reason="extension not built")
def test_built_kernels_say_whether_they_fuse_the_bias():
    # The arch's property, but for grouped kernels: they add each expert's bias row themselves.
    for e in pg._C.built_kernels():
        grouped = parse_name(e["config"]).schedule.grouped
        assert e["fused_bias"] == (archs.ARCHS[e["arch"]].fused_bias or grouped), e["config"]


@pytest.mark.skipif(not pg.extension_available(), reason="extension not built")
def test_built_modules_carry_the_table():
    info = pg._C.arch_info()
    assert info, "no arch module registered"
    for name, d in info.items():
        spec = archs.ARCHS[name]
        assert tuple(d["sm"]) == spec.sm
        assert d["validated_on_hardware"] == spec.validated_on_hardware
        assert d["reference_sm_count"] == spec.sm_count
        for field in ("clock_ghz", "flops_per_clk_16bit", "dram_bytes_per_us", "l2_bytes_per_us", "measured",
                      "mx_scales_in_alu"):
            assert d["cost"][field] == getattr(spec.cost, field), (name, field)


@pytest.mark.skipif(not pg.extension_available() or "sm100a" not in pg.built_archs(), reason="sm100a not built")
def test_explain_sm100_uses_its_own_constants():
    """The same problem priced for an H200 and for a B200: the B200's published peaks (and its
    SM count) make the estimate smaller; the decision says the constants are unmeasured."""
    fams = {arch: {parse_name(e["config"]).dtype for e in pg._C.built_kernels() if e["arch"] == arch}
            for arch in ("sm90a", "sm100a")}
    common = sorted(fams["sm90a"] & fams["sm100a"] & {"bf16", "mxfp8", "e4m3xe2m1"})
    if not common:
        pytest.skip("no dtype family built for both archs")
    d100 = pg.explain(4096, 4096, 4096, arch="sm100a", dtype=common[0])
    assert d100.sm_count == 148 and not d100.cost_model_measured
    assert any("not measured" in line for line in d100.log)
    d90 = pg.explain(4096, 4096, 4096, dtype=common[0])
    assert d90.sm_count == 132 and d90.cost_model_measured
    assert d100.estimate_us < d90.estimate_us


# -- hardware limits: one home (archs.ArchLimits), a generated header for the static_asserts -----
def _header_values(text):
    values, arch = {}, None
    for line in text.splitlines():
        if m := re.match(r"struct (\w+) \{", line):
            arch = m[1]
        elif m := re.match(r"\s*static constexpr int (\w+) = (-?\d+);", line):
            values[(arch, m[1])] = int(m[2])
    return values


def test_arch_limits_header_is_archs_table():
    want = {(a.name, k): v for a in archs.ARCHS.values() for k, v in a.limits.cpp().items()}
    assert _header_values(codegen.arch_limits_header()) == want
    written = codegen.write_arch_limits(codegen.ARCH_LIMITS_HEADER)  # what the builds include
    assert _header_values(written.read_text()) == want


def test_static_asserts_read_the_limits_not_literals():
    kernel = ROOT / "include" / "persistent_gemm" / "kernel"
    sites = {"sm90_gemm_persistent.hpp": "arch_limits::sm90a::kSmemBytes",
             "sm90_gemm_builder.hpp": "arch_limits::sm90a::kAccumulatorRegisterBudget",
             "sm90_mx_gemm_builder.hpp": "arch_limits::sm90a::kAccumulatorRegisterBudget",
             "builder_common.hpp": "arch_limits::sm90a::kSmemBytes",  # the SM90 MX builders' auto stages
             "sm100_gemm_persistent.hpp": "arch_limits::sm100a::kSmemBytes",
             "sm100_mx_gemm_builder.hpp": "arch_limits::sm100a"}
    for name, use in sites.items():
        text = (kernel / name).read_text()
        assert use in text and '#include "persistent_gemm/generated/arch_limits.hpp"' in text, name
    literals = {str(v) for a in archs.ARCHS.values() for v in (a.limits.smem_bytes, a.limits.accumulator_register_budget)
                if v}
    for path in [*kernel.glob("*builder*.hpp"), kernel / "sm90_gemm_persistent.hpp", kernel / "sm100_gemm_persistent.hpp"]:
        code = re.sub(r"//.*|\"[^\"\n]*\"", "", path.read_text())  # code only: no comments, no messages
        assert not [v for v in literals if re.search(rf"\b{v}\b", code)], f"{path.name} spells a limit itself"
