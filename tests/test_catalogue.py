"""CPU tests of the kernel catalogue (:mod:`persistent_gemm.catalogue`): canonical names
round-trip, every invalid config or name is rejected with a reason, lookups."""

from __future__ import annotations

import pytest
from conftest import CLUSTERS, schedules
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from persistent_gemm.catalogue import (
    ACCUMS,
    CATALOGUE,
    DTYPE_BYTES,
    FAST_ACCUM_DTYPES,
    KERNEL_STYLES,
    ConfigError,
    KernelConfig,
    lookup,
    parse_name,
)
from persistent_gemm.schedule import TileSchedule

@pytest.mark.parametrize("cfg", CATALOGUE, ids=lambda c: c.name)
def test_catalogue_name_round_trip(cfg):
    assert cfg.rejection() is None
    back = parse_name(cfg.name)  # name -> config -> name
    assert back == cfg == KernelConfig.from_name(cfg.name)
    assert back.name == cfg.name == str(cfg)
    assert lookup(cfg.name) is cfg
    assert cfg.template_args()["name"] == cfg.name


def test_the_name_grammar_reads_every_token_of_the_vocabulary():
    # The parser is built from the same tables the name is written from: every arch, dtype and
    # style token is read as itself (a config breaking a rule is refused by the rule, not the form).
    from persistent_gemm.catalogue import ARCHS, DTYPES, STYLE_TOKENS

    for arch in ARCHS:
        for dtype in DTYPES:
            for style, token in STYLE_TOKENS.items():
                name = f"{arch}_{dtype}_128x128x64_c1x1_sw1_row_{token}"
                try:
                    cfg = parse_name(name)
                except ConfigError as e:
                    assert "is not of the form" not in str(e), name
                else:
                    assert (cfg.arch, cfg.dtype, cfg.kernel) == (arch, dtype, style) and cfg.name == name


def test_a_malformed_name_shows_the_form():
    with pytest.raises(ConfigError) as e:
        parse_name("sm90a_bf16_128x256x64")
    assert str(e.value).endswith(
        "is not of the form <arch>_<dtype>_<tm>x<tn>x<tk>_c<cm>x<cn>_sw<S>_<row|column>[_sk<split_k>][_streamk][_nolanes][_grouped]"
        "_<coop|pp|gemv|1sm|2sm>[_swapab][_fastacc][_bf16route|_fold][_s<stages>]")


def test_catalogue_names_are_unique():
    names = [c.name for c in CATALOGUE]
    assert len(names) == len(set(names))


def test_fastacc_token_marks_fast_accumulation():
    # Tests and the dispatcher read the accumulation mode from the name's _fastacc token.
    for c in CATALOGUE:
        assert ("_fastacc" in c.name) == (c.accum == "fast"), c.name


@st.composite
def valid_configs(draw):
    arch = draw(st.sampled_from(["sm90a", "sm100a"]))
    kernel = draw(st.sampled_from(KERNEL_STYLES[arch]))
    if kernel == "gemv":  # the MX decode GEMV: its own fixed geometry (test_gemv.py has its rules)
        dtype = draw(st.sampled_from(["mxfp8", "e4m3xe2m1"]))
        return KernelConfig(tile=(128, draw(st.sampled_from([8, 16, 32, 64])), 256 if dtype == "mxfp8" else 512),
                            kernel="gemv", dtype=dtype, swap_ab=True)
    dtypes = ["bf16", "fp16", "e4m3"] if arch == "sm90a" else ["bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1"]
    dtype = draw(st.sampled_from(dtypes))
    tk = draw(st.sampled_from([64, 128])) // DTYPE_BYTES[dtype]
    sm100_mx = arch == "sm100a" and dtype in ("mxfp8", "e4m3xe2m1")
    tm = draw(st.sampled_from({"cooperative": [128, 256], "pingpong": [64, 128], "1sm": [64, 128], "2sm": [128, 256]}[kernel]))
    tn = 16 * draw(st.integers(1, 16))
    clusters = [c for c in CLUSTERS if kernel != "2sm" or c[0] % 2 == 0]
    schedule = TileSchedule(
        swizzle=draw(st.integers(1, 64)),
        cluster=draw(st.sampled_from(clusters)),
        raster=draw(st.sampled_from(["row", "column"])),
    )
    stages = draw(st.one_of(st.none(), st.integers(2, 12)))
    # fast accumulation is a wgmma (sm90a) mainloop; tcgen05 accumulates in fp32 (tested apart)
    accum = draw(st.sampled_from(ACCUMS)) if dtype in FAST_ACCUM_DTYPES and arch == "sm90a" else "promoted"
    try:
        return KernelConfig(tile=(tm, tn, tk), schedule=schedule, stages=stages, kernel=kernel, dtype=dtype,
                            arch=arch, accum=accum)
    except ConfigError as e:
        # The rules these draws can break: promoted FP8 holds a second fp32 accumulator, which
        # large tiles have no registers for; the SM100 block-scaled path's tile and stage rules.
        assert "accumulator" in str(e) or (sm100_mx and "sm100a MX" in str(e) or "stages=" in str(e)), e
        assume(False)


@settings(deadline=None, max_examples=300)
@given(cfg=valid_configs())
def test_generated_config_name_round_trip(cfg):
    name = cfg.name
    back = KernelConfig.from_name(name)
    assert back == cfg
    assert back.name == name


@settings(deadline=None, max_examples=300)
@given(
    arch=st.sampled_from(["sm90a", "sm100a"]),
    kernel=st.sampled_from(["cooperative", "pingpong", "1sm", "2sm"]),
    dtype=st.sampled_from(["bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1"]),
    tile=st.tuples(st.sampled_from([32, 64, 128, 256]), st.integers(1, 20).map(lambda k: 16 * k - 8 * (k % 3 == 0)), st.sampled_from([32, 64, 128, 256])),
    schedule=schedules,
    stages=st.one_of(st.none(), st.integers(0, 14)),
    accum=st.sampled_from(ACCUMS),
)
def test_any_config_is_valid_and_round_trips_or_raises_config_error_with_a_reason(arch, kernel, dtype, tile, schedule,
                                                                                   stages, accum):
    try:
        cfg = KernelConfig(tile=tile, schedule=schedule, stages=stages, kernel=kernel, dtype=dtype, arch=arch,
                           accum=accum)
    except ConfigError as e:
        msg = str(e)
        assert msg.startswith("invalid kernel config: ") and len(msg) > len("invalid kernel config: ") + 10
        # spelled as a name, the same config is rejected for the same reason
        token = {"cooperative": "coop", "pingpong": "pp", "1sm": "1sm", "2sm": "2sm"}[kernel]
        name = (
            f"{arch}_{dtype}_{tile[0]}x{tile[1]}x{tile[2]}_c{schedule.cluster_m}x{schedule.cluster_n}"
            f"_sw{schedule.swizzle}_{schedule.raster}_{token}" + ("_fastacc" if accum == "fast" else "")
            + ("" if stages is None else f"_s{stages}")
        )
        with pytest.raises(ConfigError) as again:
            KernelConfig.from_name(name)
        assert str(again.value) == msg
        return
    assert cfg.rejection() is None
    assert KernelConfig.from_name(cfg.name) == cfg


@pytest.mark.parametrize(
    "name, match",
    [
        ("", r"is not of the form"),
        ("sm80_bf16_128x256x64_c2x1_sw8_row_coop", r"is not of the form"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_coop_extra", r"is not of the form"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_diag_coop", r"is not of the form"),
        ("sm90a_int8_128x256x64_c2x1_sw8_row_coop", r"is not of the form"),
        ("SM90A_BF16_128X256X64_C2X1_SW8_ROW_COOP", r"is not of the form"),
        ("sm90a_bf16_128x256x64_c3x1_sw8_row_coop", r"cluster extents must each be one of"),
        ("sm90a_bf16_128x256x64_c4x4_sw8_row_coop", r"exceeds the portable maximum"),
        ("sm90a_bf16_128x256x64_c2x1_sw0_row_coop", r"swizzle must be in \[1, 64\]"),
        ("sm90a_bf16_128x256x64_c2x1_sw65_row_coop", r"swizzle must be in \[1, 64\]"),
        ("sm90a_bf16_128x256x256_c2x1_sw8_row_coop", r"tile_k=256 x 2 B is not one 64 B or 128 B"),
        ("sm90a_mxfp8_64x16x256_c1x1_sw8_row_pp_swapab", r"tile_k=256 x 1 B is not one 64 B or 128 B"),
        ("sm90a_bf16_64x256x64_c2x1_sw8_row_coop", r"tile_m must be 128 or 256"),
        ("sm90a_bf16_256x256x64_c2x1_sw8_row_pp", r"tile_m must be 64 or 128"),
        ("sm90a_bf16_128x250x64_c2x1_sw8_row_coop", r"multiple of 16"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_1sm", r"does not exist on sm90a"),
        ("sm100a_bf16_128x256x64_c2x1_sw8_row_coop", r"does not exist on sm100a"),
        ("sm90a_mxfp8_128x256x128_c2x1_sw8_row_coop", r"MX promotion keeps an fp32 accumulator"),
        ("sm90a_mxfp8_128x128x64_c2x1_sw8_row_coop", r"MX kernels need tile_k = 128"),
        ("sm90a_mxfp8_64x48x128_c1x1_sw8_row_pp_swapab", r"tile_n dividing 128"),
        ("sm90a_e4m3xe2m1_128x128x128_c1x2_sw8_row_coop", r"FP8 x FP4 kernels must be swap_ab"),
        ("sm100a_bf16_256x256x64_c2x1_sw8_row_2sm_swapab", r"swap_ab is an sm90a option"),
        ("sm100a_bf16_128x256x64_c1x1_sw8_row_2sm", r"cluster_m must be even"),
        ("sm100a_bf16_256x256x64_c2x1_sw8_row_1sm", r"1sm UMMA needs tile_m in"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_coop_s1", r"stages must be None"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_coop_s13", r"stages must be None"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_coop_fastacc", r"accum='fast' is an FP8 mainloop option"),
        ("sm90a_e4m3_256x128x128_c2x1_sw8_row_coop", r"promoted FP8 accumulation keeps"),
        ("sm90a_e4m3_128x128x128_c1x2_sw8_row_pp", r"only 128-row cooperative tiles may promote in N-slices"),
        ("sm90a_e4m3_128x256x128_c2x1_sw8_row_coop_s4_fastacc", r"is not of the form"),
        # the MX bf16 route's rules (collective/sm90_mx_bf16_mma.hpp)
        ("sm90a_mxfp8_128x256x64_c1x1_sw8_row_coop_bf16route", r"route='bf16' kernels are swap_ab"),
        ("sm90a_mxfp8_128x256x128_c1x1_sw8_row_coop_swapab_bf16route", r"route='bf16' needs tile_k = 64"),
        ("sm90a_e4m3xe2m1_256x128x64_c1x1_sw8_row_coop_swapab_bf16route", r"tile_m must be 128 \(cooperative\)"),
        ("sm90a_mxfp8_128x256x64_c1x1_sw8_row_sk2_coop_swapab_bf16route", r"route='bf16' has no split-K"),
        ("sm90a_e4m3xe2m1_128x256x64_c2x1_sw8_row_coop_swapab_bf16route", r"runs on 1x1 clusters only"),
        ("sm90a_mxfp8_128x256x64_c1x2_sw8_row_coop_swapab_bf16route", r"runs on 1x1 clusters only"),
        ("sm90a_bf16_128x256x64_c1x1_sw8_row_coop_swapab_bf16route", r"route='bf16' is an MX mainloop option"),
        ("sm100a_mxfp8_128x128x128_c1x1_sw8_row_1sm_bf16route", r"route='bf16' is an sm90a mainloop"),
        # the fold route's (FP8 x FP4 only; the promotion mainloop's tile rules)
        ("sm90a_mxfp8_128x128x128_c1x1_sw8_row_coop_swapab_fold", r"route='fold' folds e2m1 weights into e4m3"),
        ("sm90a_e4m3xe2m1_128x128x128_c1x1_sw8_row_coop_fold", r"FP8 x FP4 kernels must be swap_ab"),
        ("sm90a_e4m3xe2m1_128x128x64_c1x1_sw8_row_coop_swapab_fold", r"MX kernels need tile_k = 128"),
        ("sm100a_e4m3xe2m1_128x128x128_c1x1_sw8_row_1sm_fold", r"route='fold' is an sm90a mainloop"),
        # SM100 scaled_mm: tcgen05 accumulates FP8 in fp32 (no fast mode); e4m3 rows are one 128 B atom
        ("sm100a_e4m3_256x256x128_c2x1_sw8_row_2sm_fastacc", r"accum='fast' is an sm90a \(wgmma\) mainloop option"),
        ("sm100a_e4m3_128x256x128_c1x1_sw8_row_1sm_fastacc", r"promoted kernels also serve use_fast_accum=True"),
        ("sm100a_e4m3_256x256x256_c2x1_sw8_row_2sm", r"tile_k=256 x 1 B is not one 64 B or 128 B"),
        ("sm100a_e4m3_256x256x128_c1x1_sw8_row_2sm", r"cluster_m must be even"),
    ],
)
def test_invalid_names_raise_config_error_with_reason(name, match):
    with pytest.raises(ConfigError, match=match):
        KernelConfig.from_name(name)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(arch="sm80"), r"arch must be one of"),
        (dict(dtype="int8"), r"dtype must be one of"),
        (dict(kernel="2sm"), r"kernel style '2sm' does not exist on sm90a"),
        (dict(tile=(128, 256)), r"tile must be \(tile_m, tile_n, tile_k\)"),
        (dict(schedule=(8, (2, 1), "row")), r"schedule must be a TileSchedule"),
        (dict(tile=(128, 256, 32), dtype="e4m3"), r"tile_k=32 x 1 B"),
        (dict(dtype="e4m3xe2m1", tile=(128, 128, 128)), r"FP8 x FP4 kernels must be swap_ab"),
        (dict(dtype="mxfp8", tile=(128, 128, 128), swap_ab=True, kernel="pingpong"), r"MX promotion keeps"),
        (dict(accum="slow"), r"accum must be one of"),
        (dict(dtype="mxfp8", route="fp4"), r"route must be one of"),
    ],
)
def test_invalid_configs_raise_config_error_with_reason(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        KernelConfig(**kwargs)
    assert issubclass(ConfigError, ValueError)


def test_lookup_unknown_name_counts_the_catalogue():
    with pytest.raises(ConfigError, match=r"unknown config 'nope'; the catalogue has \d+ configs"):
        lookup("nope")


def test_style_tokens_are_accepted_spellings():
    pp = KernelConfig(tile=(128, 64, 64), kernel="pp")
    assert pp.kernel == "pingpong" and pp == KernelConfig(tile=(128, 64, 64), kernel="pingpong")
    assert pp.name.endswith("_pp") and KernelConfig(kernel="coop").kernel == "cooperative"
    with pytest.raises(ConfigError, match="kernel style 'ping' does not exist"):
        KernelConfig(kernel="ping")
    with pytest.raises(TypeError):
        pp.grid(1024, 1024, 2)  # batch is keyword-only


def test_bf16_route_configs_name_their_route():
    # route="bf16" is a name token (``_bf16route``): round trip, and distinct from the promoting
    # kernel of the same tile.
    routed = [c for c in CATALOGUE if c.route == "bf16"]
    assert {c.dtype for c in routed} == {"mxfp8", "e4m3xe2m1", "bf16xe4m3", "bf16xe2m1"}
    for c in routed:
        assert c.name.endswith("_swapab_bf16route") and KernelConfig.from_name(c.name) == c
        assert c.tile[2] == 64 and c.swap_ab
    plain = KernelConfig(tile=(128, 256, 64), dtype="mxfp8", swap_ab=True, route="bf16")
    assert KernelConfig.from_name(plain.name).route == "bf16"


def test_the_fold_route_config_names_its_route():
    # route="fold" is the ``_fold`` token; the fold config refines the promoting FP8 x FP4 tile.
    folded = [c for c in CATALOGUE if c.route == "fold"]
    assert [c.dtype for c in folded] == ["e4m3xe2m1"]
    for c in folded:
        assert c.name.endswith("_swapab_fold") and KernelConfig.from_name(c.name) == c
        promote = KernelConfig.from_name(c.name.removesuffix("_fold"))
        assert promote in CATALOGUE and promote.route == "promote"


def test_an_unknown_name_says_which_are_closest():
    # newcomer report #12: a did-you-mean, not the whole catalogue
    from persistent_gemm.catalogue import lookup
    from persistent_gemm.jit import resolve

    typo = "sm90a_bf16_128x256x64_c2x1_sw8_row_cooperative"
    for f in (lookup, resolve):
        with pytest.raises(ConfigError, match=r"did you mean 'sm90a_bf16_128x256x64_c2x1_sw8_row_coop'") as e:
            f(typo)
        assert str(e.value).count("sm90a_") < 6, "the whole catalogue is listed again"


def test_weight_only_routes_take_clusters():
    # Measured on an H100 (benchmarks/results/issue22/ at 7d1ac21): the weight-only route ran 2x1 and 1x2
    # clusters correctly (no faster); only the e4m3-activation route is held to 1x1.
    for c in ("c2x1", "c1x2"):
        cfg = KernelConfig.from_name(f"sm90a_bf16xe2m1_128x256x64_{c}_sw8_row_coop_swapab_bf16route")
        assert cfg.kernel_rejection() is None


def test_sm100_scaled_mm_config_is_one_promoted_2sm_tile():
    # One e4m3 config on sm100a (one kernel TU: CI time), named like the other 2-SM configs, no
    # _fastacc token (tcgen05 accumulates in fp32), a 128-row CTA tile under the 256-row MMA.
    e4m3 = [c for c in CATALOGUE if c.arch == "sm100a" and c.dtype == "e4m3"]
    assert [c.name for c in e4m3] == ["sm100a_e4m3_256x256x128_c2x1_sw8_row_2sm"]
    c = e4m3[0]
    assert c.accum == "promoted" and c.kernel == "2sm" and c.cta_tile == (128, 256)
    assert KernelConfig.from_name(c.name) == c and c.kernel_rejection() is None
