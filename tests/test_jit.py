"""Configs that are not built: code generation for any valid spec, the JIT's three errors, its
cache (a real nvcc compile, a cache hit in a second process, the lock), the registry merge,
tune's candidates and the tuning cache the dispatcher consults (CPU: no kernel runs here)."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import persistent_gemm as pg
from persistent_gemm import codegen, jit
from persistent_gemm import tuning as tune
from persistent_gemm.catalogue import CATALOGUE, ConfigError, KernelConfig, parse_name
from persistent_gemm.library import Variant
from persistent_gemm.schedule import TileSchedule

from conftest import FAST, REPO
from support.build import cuobjdump

needs_ext = pytest.mark.skipif(not pg.extension_available(), reason="needs the built extension")
#: The CI compile: column raster, swizzle 5, cluster 1x2 -- in no catalogue, and not the spec the
#: GPU tests compile (a pytest run of both files shares one process) -- one variant.
JIT_SPEC = KernelConfig(tile=(128, 64, 64), schedule=TileSchedule(swizzle=5, cluster=(1, 2), raster="column"),
                        kernel="pingpong")
#: Compiled by no test.
NEVER_BUILT = KernelConfig(tile=(128, 64, 64), schedule=TileSchedule(swizzle=7, cluster=(1, 2), raster="column"),
                           kernel="pingpong")
JIT_VARIANTS = [Variant(True, True, "bf16")]


def _valid_specs():
    """Valid non-catalogue specs across arch, family, style, schedule."""
    return st.builds(
        lambda sw, cl, r, pick: pick(TileSchedule(swizzle=sw, cluster=cl, raster=r)),
        st.integers(1, 16), st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), st.sampled_from(["row", "column"]),
        st.sampled_from([
            lambda s: KernelConfig(tile=(128, 64, 64), schedule=s, kernel="pingpong"),
            lambda s: KernelConfig(tile=(128, 128, 64), schedule=s, dtype="fp16"),
            lambda s: KernelConfig(tile=(128, 128, 128), schedule=s, dtype="e4m3"),
            lambda s: KernelConfig(tile=(64, 32, 128), schedule=s, kernel="pingpong", dtype="mxfp8", swap_ab=True),
            lambda s: KernelConfig(tile=(64, 32, 128), schedule=s, kernel="pingpong", dtype="e4m3xe2m1",
                                   swap_ab=True),
        ]))


# -- codegen for any valid spec -----------------------------------------------------------------
@FAST
@given(cfg=_valid_specs())
def test_jit_sources_lower_any_valid_spec(cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    chosen = jit.variants_for(cfg)
    files = codegen.jit_sources(out, cfg, chosen)
    names = {p.name for p in files}
    assert {"kernel_table.cpp", "module.cpp", "scale_layout.cu", f"{cfg.name}.cu"} <= names
    assert len(files) == 4  # the config's one TU (walk and variants), table, scale relayout, entry
    s = cfg.schedule
    tag = (f"PersistentSchedule<{s.swizzle}, {s.cluster_m}, {s.cluster_n}, "
           f"persistent_gemm::scheduler::Raster::{'Row' if s.raster == 'row' else 'Column'}>")
    tu = (out / f"{cfg.name}.cu").read_text()
    assert tag in tu and f"cute::Shape<cute::_{cfg.tile[0]}, cute::_{cfg.tile[1]}, cute::_{cfg.tile[2]}>" in tu
    for v in chosen:
        assert f"run_{codegen.ident(cfg.name)}__{v.suffix}(" in tu
    table = (out / "kernel_table.cpp").read_text()
    assert table.count(f'{{.config = "{cfg.name}", ') == len(chosen)
    assert f'"{cfg.arch}"' in table


def test_variants_for_serves_the_usual_outputs():
    bf16 = jit.variants_for(JIT_SPEC)
    assert Variant(True, True, "bf16") in bf16 and Variant(True, True, "fp32") in bf16
    fp8 = jit.variants_for(KernelConfig(tile=(128, 128, 128), dtype="e4m3"))
    assert {(v.scale, v.out) for v in fp8} == {("tensor", "bf16"), ("row", "bf16"), ("tensor", "fp32"), ("row", "fp32")}
    assert all(v.a_k_major and v.b_k_major for v in bf16 + fp8)


# -- the three errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ("nope", r"unknown config 'nope'.*the catalogue has \d+ configs"),
    ("sm90a_bf16_128x64x64_c1x2_sw3_column_zz", "unknown config"),
    ("sm90a_bf16_96x64x64_c1x2_sw3_column_pp", "tile_m must be 64 or 128"),
    ("sm90a_e4m3xe2m1_64x64x128_c1x1_sw8_row_pp", "must be swap_ab"),
])
def test_invalid_spec_is_a_config_error(bad, match):
    with pytest.raises(ConfigError, match=f"(?s){match}"):
        jit.resolve(bad)
    with pytest.raises(TypeError, match="config must be"):
        jit.resolve(3)


@needs_ext
def test_valid_but_not_built_with_jit_off(monkeypatch):
    monkeypatch.setenv(jit.JIT_ENV, "0")
    with pytest.raises(jit.KernelNotBuiltError, match=f"{NEVER_BUILT.name} is valid but not built.*PGEMM_JIT=0"):
        jit.ensure(NEVER_BUILT)
    built = pg._C.built_kernels()[0]["config"]
    assert jit.ensure(built) == built  # a built config needs no compiler


@needs_ext
def test_compile_failure_carries_the_compiler_message(monkeypatch, tmp_path):
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path))

    def broken(out, config, chosen):  # one TU, so the failing build is quick
        p = Path(out) / "broken.cu"
        p.write_text('#error "injected failure for the test"\n')
        return [p]

    monkeypatch.setattr(codegen, "jit_sources", broken)
    spec = NEVER_BUILT.schedule.replace(swizzle=9)
    with pytest.raises(jit.JitCompileError, match="(?s)compiling .* failed.*injected failure for the test"):
        jit.ensure(KernelConfig(tile=(128, 64, 64), schedule=spec, kernel="pingpong"), quiet=True)
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob("build-*"))


# -- the lock -----------------------------------------------------------------------------------
def _build_once(root: str, log: str, barrier, results) -> None:
    def build(tmp: Path) -> Path:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # the other processes must find the lock taken
        p = tmp / "x.so"
        p.write_bytes(b"built")
        return p

    barrier.wait()
    path, built = jit.cached_build(Path(root), "key", build)
    results.put((str(path), built))


def test_cached_build_builds_once_across_processes(tmp_path):
    ctx = multiprocessing.get_context("fork")
    log = tmp_path / "log"
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_build_once, args=(str(tmp_path), str(log), barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert {path for path, _ in got} == {str(tmp_path / "key.so")}
    assert sorted(built for _, built in got) == [False, False, True]  # one builder; the others waited
    assert len(log.read_text().split()) == 1
    assert (tmp_path / "key.so").read_bytes() == b"built"
    assert not list(tmp_path.glob("build-*"))  # private build folders are removed


# -- a real compile, the registry merge, a cache hit in a second process ---------------------------
_SECOND = """
import sys, time
import persistent_gemm as pg
from persistent_gemm import jit
from persistent_gemm.library import Variant
t = time.perf_counter()
name = jit.ensure(sys.argv[1], variants=[Variant(True, True, "bf16")])
print("took", time.perf_counter() - t)
print("registered", name in {e["config"] for e in pg._C.built_kernels()})
print("explained", pg.explain(512, 512, 512, config=name).config == name)
"""


@needs_ext
@pytest.mark.skipif(jit.build_flags.find_cuda_home() is None, reason="needs nvcc")
def test_jit_compiles_registers_and_a_second_process_hits_the_cache(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path))
    assert JIT_SPEC.name not in {c.name for c in CATALOGUE}
    gen0 = pg._C.registry_generation()
    before = {e["config"] for e in pg._C.built_kernels()}
    t = time.perf_counter()
    assert jit.ensure(JIT_SPEC, variants=JIT_VARIANTS) == JIT_SPEC.name
    compile_s = time.perf_counter() - t
    err = capfd.readouterr().err
    assert f"compiling {JIT_SPEC.name}" in err and "compiled in" in err
    print(f"JIT compile of {JIT_SPEC.name}: {compile_s:.0f} s")
    (so,) = tmp_path.glob("pgemm_jit_*.so")
    # Merged into the arch's table beside the built kernels, once.
    after = {e["config"] for e in pg._C.built_kernels()}
    assert after == before | {JIT_SPEC.name} and pg._C.registry_generation() == gen0 + 1
    pg._C.register_arch(jit._loaded[so.stem].arch_export())
    assert pg._C.registry_generation() == gen0 + 1  # the same kernels again change nothing
    d = pg.explain(4096, 4096, 4096, config=JIT_SPEC)
    assert d.config == JIT_SPEC.name
    mtime = so.stat().st_mtime_ns
    p = subprocess.run([sys.executable, "-c", _SECOND, JIT_SPEC.name], capture_output=True, text=True,
                       env={**os.environ, jit.CACHE_ENV: str(tmp_path)}, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "registered True" in p.stdout and "explained True" in p.stdout
    assert "compiling" not in p.stderr  # a hit: loaded, not built
    assert so.stat().st_mtime_ns == mtime and len(list(tmp_path.glob("pgemm_jit_*.so"))) == 1
    # A hit is proven above (no compile, the .so untouched); its time is reported, not asserted.
    took = float(p.stdout.split("took")[1].split()[0])
    print(f"cache hit in a second process: {took:.1f} s against a {compile_s:.0f} s compile")


# -- ops: checks before anything is compiled -------------------------------------------------------
@needs_ext
def test_ops_refuse_a_wrong_family_before_compiling(monkeypatch):
    import torch

    monkeypatch.setattr(jit, "ensure", lambda *a, **k: pytest.fail("must not compile"))
    a, b = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, 8, dtype=torch.bfloat16)
    fp8 = KernelConfig(tile=(128, 128, 128), dtype="e4m3", schedule=TileSchedule(swizzle=5))
    with pytest.raises(ValueError, match="is a e4m3 kernel; these operands need a bf16 kernel"):
        pg.mm(a, b, config=fp8)
    # CPU tensors run the reference: a valid spec that is not built has nothing to compile.
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    unbuilt = KernelConfig(tile=(64, 64, 64), schedule=TileSchedule(swizzle=6, raster="column"), kernel="pingpong")
    assert torch.equal(pg.mm(a, b, config=unbuilt), ref)


# -- tune: candidates and the tuning cache ---------------------------------------------------------
def test_jit_candidates_are_valid_distinct_and_near_the_base():
    base = next(c for c in CATALOGUE if c.name == "sm90a_bf16_128x64x64_c1x2_sw8_row_pp")
    built = {c.name for c in CATALOGUE}
    cands = tune.jit_candidates(base, limit=50, exclude=built)
    names = [c.name for c in cands]
    assert len(names) == len(set(names)) and not set(names) & built and base.name not in names
    assert all(c.dtype == base.dtype and c.arch == base.arch for c in cands)
    only_sched = tune.jit_candidates(base, vary=("raster",), limit=50)
    assert [c.schedule.raster for c in only_sched] == ["column"] and only_sched[0].tile == base.tile
    assert len(tune.jit_candidates(base, limit=3)) == 3
    with pytest.raises(ValueError, match="vary must name knobs"):
        tune.jit_candidates(base, vary=("colour",))


def _entry(config: str, **kw) -> dict:
    e = dict(arch="sm90a", sm_count=132, device="test", M=1000, N=2000, K=3000, dtype="bf16", out_dtype="bf16",
             layout="rc", scale="none", use_fast_accum=False, config=config, us=1.0, when="now")
    e.update(kw)
    return e


@needs_ext
@pytest.mark.skipif("sm90a" not in (pg._C.registered_arches() if pg._C else []), reason="needs sm90a kernels")
def test_tuned_winner_decides_before_the_cost_model(tmp_path, monkeypatch):
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path))
    names = sorted({e["config"] for e in pg._C.built_kernels() if e["arch"] == "sm90a" and parse_name(e["config"]).dtype == "bf16"
                    and e["a_k_major"] and e["b_k_major"] and e["d_dtype"] == 0})
    default = pg.explain(1000, 2000, 3000)
    assert not default.tuned
    other = next((n for n in names if n != default.config), None)
    if other is None:
        pytest.skip("one bf16 config built: nothing else to tune to")
    try:
        tune._persist(_entry(other))
        tune._persist(_entry(other, M=7))  # another problem: stays apart
        tune._persist(_entry("sm90a_bf16_128x64x64_c1x2_sw11_column_pp"))  # neither built nor cached: skipped
        assert len(tune._read(tune.tuning_path())) == 2  # the third replaced the first (same problem)
        tune._persist(_entry(other))
        assert tune.load_tuning() == 2
        d = pg.explain(1000, 2000, 3000)
        assert d.tuned and d.config == other and d.log[0].startswith("tuned: " + other)
        assert not pg.explain(1000, 2000, 3001).tuned  # another problem
        assert not pg.explain(1000, 2000, 3000, sm_count=100).tuned  # another GPU size
        assert pg.explain(1000, 2000, 3000, config=default.config).config == default.config  # forcing wins
    finally:
        pg.clear_tuning()
    assert not pg.explain(1000, 2000, 3000).tuned and tune._read(tune.tuning_path()) == []


def test_tune_argument_errors():
    if not pg.extension_available():
        pytest.skip("needs the built extension")
    with pytest.raises(ValueError, match="op must be one of"):
        pg.tune(8, 8, 8, op="bmm")
    with pytest.raises(ValueError, match="dtype must be bf16 or fp16 for op 'mm'"):
        pg.tune(8, 8, 8, dtype="e4m3")


@needs_ext
@pytest.mark.skipif("sm90a" not in (pg._C.registered_arches() if pg._C else []), reason="needs sm90a kernels")
def test_explain_renders_what_it_chose(tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "chosen.png"
    d = pg.explain(3000, 5000, 4096, render=p)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and d.problem == (3000, 5000, 4096)


def test_ensure_many_compiles_concurrently_and_collects_failures(monkeypatch):
    import threading

    seen, lock = [], threading.Lock()
    bad = NEVER_BUILT.schedule.replace(swizzle=13)
    # Side by side, proven without a clock: the three builds must all be in flight at once to
    # pass the barrier (one at a time, the first waits out the timeout and breaks it).
    together = threading.Barrier(3, timeout=60)

    def fake_ensure(cfg, quiet=False):
        with lock:
            seen.append((threading.get_ident(), os.environ.get("MAX_JOBS")))
        if together is not None:
            together.wait()
        if cfg.schedule == bad:
            raise jit.JitCompileError("injected")
        return cfg.name

    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(jit, "ensure", fake_ensure)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    specs = [KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=NEVER_BUILT.schedule.replace(swizzle=s))
             for s in (10, 11, 12)]
    out = jit.ensure_many(specs + [specs[0].name], jobs=3)  # the name repeats a spec: compiled once
    assert out == [s.name for s in specs] and len(seen) == 3
    together = None  # the calls below run fewer builds than the barrier's three
    assert len({tid for tid, _ in seen}) == 3 and {mj for _, mj in seen} == {"5"}  # 16 cores / 3 builds
    assert "MAX_JOBS" not in os.environ
    failing = KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=bad)
    res = jit.ensure_many([specs[0], failing], jobs=2)
    assert res[0] == specs[0].name and isinstance(res[1], jit.JitCompileError)
    with pytest.raises(jit.JitCompileError, match="injected"):
        pg.precompile([failing])
    with pytest.raises(ConfigError):  # a bad spec fails before anything compiles
        jit.ensure_many([specs[0], "sm90a_bf16_nope"])
    with pytest.raises(ValueError, match="jobs must be a positive int"):
        jit.ensure_many(specs, jobs=0)


# -- a registered user tile and the dispatcher's swap-AB bound (issue 27) ---------------------------
_WIDE_SWAP = """
import sys
import persistent_gemm as pg
from persistent_gemm import jit
from persistent_gemm.library import Variant
name = jit.ensure(sys.argv[1], variants=[Variant(True, True, "bf16", tma_store=False)])  # swap-AB: D transposed
for m in (128, 257, 1000):
    d = pg.explain(m, 4096, 4096)
    reasons = [line for line in d.log if line.startswith("rejected " + name)]
    print(m, d.config, reasons[0] if reasons else "eligible")
print("forced", pg.explain(257, 4096, 4096, config=name).config == name)
"""


@pytest.fixture(scope="module")
def wide_swap_ab(tmp_path_factory):
    """A user's 144-token swap-AB tile (not in the catalogue), JIT-compiled and registered in a
    subprocess (the registration would otherwise stay in this process and compete in later
    tests): (its name, the subprocess's stdout lines by key, its JIT cache folder)."""
    if not pg.extension_available():
        pytest.skip("needs the built extension")
    if jit.build_flags.find_cuda_home() is None:
        pytest.skip("needs nvcc")
    wide = KernelConfig(tile=(64, 144, 64), kernel="pingpong", swap_ab=True, schedule=TileSchedule(swizzle=1))
    assert wide.name not in {c.name for c in CATALOGUE}
    cache = tmp_path_factory.mktemp("jit_wide_swap_ab")
    p = subprocess.run([sys.executable, "-c", _WIDE_SWAP, wide.name], capture_output=True, text=True,
                       env={**os.environ, jit.CACHE_ENV: str(cache)}, cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr
    return wide.name, dict(line.split(" ", 1) for line in p.stdout.splitlines()), cache


def test_a_registered_wide_swap_ab_tile_is_eligible_past_decode_up_to_four_bands(wide_swap_ab):
    # A 144-token swap-AB tile is the model's call past 128 tokens (where the 64-column ping-pong
    # tiles take over) up to 4 bands (576 tokens), refused (with the reason) on either side unless
    # forced; config= runs it.
    name, lines, _ = wide_swap_ab
    assert lines["257"].endswith("eligible"), lines["257"]
    assert lines["128"].endswith("swap-AB ragged-M kernel: M = 128 is outside (128, 576] tokens"), lines["128"]
    assert lines["1000"].endswith("swap-AB ragged-M kernel: M = 1000 is outside (128, 576] tokens"), lines["1000"]
    assert not lines["128"].startswith(name) and not lines["1000"].startswith(name)
    assert lines["forced"] == "True"


def test_wgmma_n_extents_outside_powers_of_two_issue_full_width(wide_swap_ab):
    """The same tile's module issues one 64x144 wgmma per K-step, not nine 64x16 ones. CuTe
    offers the N extents outside {8, 16, 32, 64, 96, 128, 192, 256} only under
    CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, which codegen defines in such a tile's TU
    (archs.ArchSpec.plain_mma_n); without it CUTLASS's builder falls back to the largest offered
    divisor of the tile's N (measured on an H100 at 257x4096^2: 34.5 us, where cuBLAS's 64x136
    tile took 21.7)."""
    _, _, cache = wide_swap_ab
    modules = sorted(cache.rglob("pgemm_jit_*.so"))
    assert len(modules) == 1, modules
    out = subprocess.run([cuobjdump(), "-sass", str(modules[0])], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    extents = set(re.findall(r"\bHGMMA\.64x(\d+)x16\.F32\.BF16", out.stdout))
    assert extents == {"144"}, f"wgmma N extents issued: {sorted(extents)}"
