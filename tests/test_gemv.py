"""The MX decode GEMV (kernel style "gemv"): its schedule (stream-K over weight strips) as the
Python twin and the C++ header walk it, its catalogue rules, its generated code, its dispatch
rules. CPU only; the kernel's results are tests/test_gpu_gemv.py."""

import random
import subprocess

import pytest

from persistent_gemm import codegen
from persistent_gemm.catalogue import CATALOGUE, ConfigError, GEMV_TOKENS, KernelConfig
from persistent_gemm.schedule import TileSchedule
from persistent_gemm.strip_schedule import ROLES, StripStreamK
from support.kernel_table_rows import entry_rows

from support.host_build import ROOT, build_host_program

GEMV = [c for c in CATALOGUE if c.kernel == "gemv"]


def _schedules():
    rng = random.Random(7)
    out = [StripStreamK(64, 16, 132), StripStreamK(64, 32, 132), StripStreamK(224, 16, 132), StripStreamK(1, 1, 1),
           StripStreamK(3, 5, 15), StripStreamK(2, 64, 128), StripStreamK(8, 2, 16), StripStreamK(5, 7, 3)]
    for _ in range(40):
        strips, chunks = rng.randint(1, 40), rng.randint(1, 40)
        out.append(StripStreamK(strips, chunks, rng.randint(1, min(strips * chunks, 140))))
    return out


@pytest.mark.parametrize("s", _schedules(), ids=lambda s: f"{s.strips}x{s.chunks}w{s.workers}")
def test_strip_stream_k_covers_every_unit_once_and_each_strip_has_one_writer(s):
    seen = [0] * s.units
    writers, partials = {}, {}
    lengths = set()
    for w in range(s.workers):
        pieces = s.pieces(w)
        assert pieces, "every worker owns a unit"
        lengths.add(sum(p.chunk_end - p.chunk_begin for p in pieces))
        for i, p in enumerate(pieces):
            assert p.role in ROLES and 0 <= p.chunk_begin < p.chunk_end <= s.chunks
            for c in range(p.chunk_begin, p.chunk_end):
                seen[p.strip * s.chunks + c] += 1
            if p.role == "partial":
                assert i == 0 and p.chunk_begin > 0, "only a worker's first strip starts mid-strip"
                partials.setdefault(p.strip, []).append(w)
            else:
                assert p.chunk_begin == 0
                assert p.strip not in writers
                writers[p.strip] = (w, p.role)
            if p.role == "reducer":
                assert i == len(pieces) - 1, "a reducer's piece is its worker's last"
            if p.role == "whole":
                assert p.chunk_end == s.chunks
    assert seen == [1] * s.units
    assert max(lengths) - min(lengths) <= 1, "ranges differ by at most one unit"
    assert sorted(writers) == list(range(s.strips))
    for strip, (w, role) in writers.items():
        got = partials.get(strip, [])
        if role == "whole":
            assert got == []
        else:
            # the reducer adds exactly the partial pieces' workers, in worker (= K) order
            assert got == list(range(w + 1, s.last_partner(strip) + 1)) and got


def test_strip_stream_k_owner_inverts_begin():
    for s in _schedules():
        for w in range(s.workers):
            for u in range(s.begin(w), s.begin(w + 1)):
                assert s.owner(u) == w


def test_strip_stream_k_for_problem_matches_the_kernels_units():
    fp4 = StripStreamK.for_problem(8192, 8192, "e4m3xe2m1", 132)
    fp8 = StripStreamK.for_problem(8192, 8192, "mxfp8", 132)
    assert (fp4.strips, fp4.chunks, fp4.workers) == (64, 16, 132)
    assert (fp8.strips, fp8.chunks, fp8.workers) == (64, 32, 132)
    small = StripStreamK.for_problem(129, 32, "mxfp8", 132)  # 2 strips x 1 unit: 2 workers
    assert (small.strips, small.chunks, small.workers) == (2, 1, 2)
    assert "stream-K over 64 strips" in fp4.summary()
    with pytest.raises(ValueError, match="dtype"):
        StripStreamK.for_problem(8, 32, "bf16", 132)
    with pytest.raises(ValueError, match="workers"):
        StripStreamK(2, 2, 5)


def test_strip_stream_k_cpp_walk_matches_python(tmp_path):
    """scheduler/strip_stream_k.hpp (the kernel's walk, compiled for the host) == strip_schedule.py."""
    exe = build_host_program([ROOT / "tests" / "host" / "strip_stream_k.cu"], tmp_path / "strip_stream_k",
                             flags=("-std=c++17",))
    scheds = _schedules()
    args = [str(v) for s in scheds for v in (s.strips, s.chunks, s.workers)]
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    want = []
    for s in scheds:
        want.append(f"schedule {s.strips} {s.chunks} {s.workers}")
        for w in range(s.workers):
            line = f"{w} {s.begin(w)} {s.begin(w + 1)} |"
            for p in s.pieces(w):
                line += f" {p.strip}:{ROLES.index(p.role)}" + (f">{s.last_partner(p.strip)}" if p.role == "reducer" else "")
            want.append(line + f" | owner {w}")
    assert out.stdout.splitlines() == want


# -- catalogue ----------------------------------------------------------------------------------
def test_catalogue_has_a_gemv_per_family_and_token_tile():
    got = {(c.dtype, c.tile[1]) for c in GEMV}
    assert got == {(d, t) for d in ("mxfp8", "e4m3xe2m1", "bf16xe4m3", "bf16xe2m1") for t in GEMV_TOKENS}
    for c in GEMV:
        assert KernelConfig.from_name(c.name) == c
        assert c.name.endswith("_gemv_swapab")


@pytest.mark.parametrize("change, match", [
    (dict(dtype="bf16", tile=(128, 16, 128)), "MX decode kernel"),
    (dict(swap_ab=False), "swap_ab"),
    (dict(tile=(64, 16, 256)), "tile_m must be 128"),
    (dict(tile=(128, 24, 256)), "tile_n must be one of"),
    (dict(tile=(128, 16, 128)), "tile_k must be 256"),
    (dict(dtype="e4m3xe2m1"), "tile_k must be 512"),
    (dict(schedule=TileSchedule(cluster=(2, 1))), "stream-K over weight strips"),
    (dict(schedule=TileSchedule(split_k=2)), "stream-K over weight strips"),
    (dict(stages=4), "stages must be None"),
    (dict(arch="sm100a"), "does not exist on sm100a"),
])
def test_gemv_rules_name_the_field(change, match):
    base = dict(tile=(128, 16, 256), kernel="gemv", dtype="mxfp8", swap_ab=True)
    base.update(change)
    with pytest.raises(ConfigError, match=match):
        KernelConfig(**base)


# -- code generation ----------------------------------------------------------------------------
def test_gemv_configs_share_one_tu_per_family_and_have_no_device_walk(tmp_path):
    files = codegen.generate(tmp_path, ["sm90a"], pattern="gemv")["sm90a"]
    names = sorted(p.name for p in files)
    families = ["mxfp8", "e4m3xe2m1", "bf16xe4m3", "bf16xe2m1"]
    assert names == sorted([*(f"sm90a_{f}_gemv{g}.cu" for f in families for g in ("", "_grouped")),
                            "kernel_table.cpp", "scale_layout.cu", "module.cpp"])
    grouped = (tmp_path / "sm90a" / "sm90a_e4m3xe2m1_gemv_grouped.cu").read_text()
    assert grouped.count("static constexpr bool kGrouped = true;") == 4 * 3
    tu = (tmp_path / "sm90a" / "sm90a_e4m3xe2m1_gemv.cu").read_text()
    assert tu.count("using Gemm = persistent_gemm::kernel::Sm90MxGemvBuilder<Spec>;") == 4 * 3
    assert "using OperandW = persistent_gemm::kernel::GemvWeightE2m1;" in tu
    assert tu.count("using OperandX = persistent_gemm::kernel::ActivationsE4m3;") == 4 * 3
    # weight-only: bf16 activations, D in bf16 or fp32 (fp16 activations run the reference)
    wo = (tmp_path / "sm90a" / "sm90a_bf16xe2m1_gemv.cu").read_text()
    assert wo.count("using OperandX = persistent_gemm::kernel::ActivationsBf16;") == 4 * 2
    assert "using OperandW = persistent_gemm::kernel::GemvWeightE2m1;" in wo
    table = (tmp_path / "sm90a" / "kernel_table.cpp").read_text()
    assert "KernelStyle::Gemv" in table and "schedule_sm90a_mxfp8" not in table
    # every output dtype is a kernel (fp16 included: no fp32 round trip)
    dtypes = {(r["a_dtype"], r["b_dtype"], r["d_dtype"]) for r in entry_rows(table)}
    for d in ("BF16", "FP16", "FP32"):
        assert ("DType::E4M3", "DType::E2M1", f"DType::{d}") in dtypes
    for w in ("E4M3", "E2M1"):
        assert ("DType::BF16", f"DType::{w}", "DType::BF16") in dtypes
        assert ("DType::BF16", f"DType::{w}", "DType::FP16") not in dtypes


def test_gemv_static_asserts_mirror_the_python_rules():
    hdr = (ROOT / "include" / "persistent_gemm" / "kernel" / "sm90_mx_gemv.hpp").read_text()
    assert "Tokens == 8 || Tokens == 16 || Tokens == 32 || Tokens == 64" in hdr
    assert "kStripRows = 128" in hdr and "kChunkBytes = 256" in hdr


def test_every_kernel_style_tag_names_a_declared_type():
    """KernelConfig.template_args' kernel_style is a C++ tag some kernel header declares."""
    headers = "\n".join(p.read_text() for p in (ROOT / "include" / "persistent_gemm" / "kernel").glob("*.hpp"))
    styles = {c.template_args()["kernel_style"] for c in CATALOGUE}
    assert any("gemv" in c.name for c in CATALOGUE)
    for tag in styles:
        assert f"struct {tag.rsplit('::', 1)[1]} {{}};" in headers, tag
