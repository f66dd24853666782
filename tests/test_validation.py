"""No argument may kill the process: every public entry point raises TypeError (wrong type; a
bool is not an int) or ValueError (out of range) naming the argument, and the CLI prints one
line and exits 2. CPU only; the argument checks run before the compiled extension is asked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import persistent_gemm as pg
from persistent_gemm import footprint as foot
from persistent_gemm import schedule as sch
from persistent_gemm.tools import picture as pic
from persistent_gemm.catalogue import CATALOGUE, KernelConfig, parse_name
from persistent_gemm.quant import dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp4, quantize_mxfp8
from persistent_gemm.schedule import ScheduleGrid, TileSchedule

REPO = Path(__file__).resolve().parents[1]
CFG = KernelConfig.from_name("sm90a_bf16_128x256x64_c2x1_sw8_row_coop")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["MPLBACKEND"] = "Agg"
    return env


def _raises(exc, names, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` and the message names ``names`` (and nothing else
    is raised: a ZeroDivisionError or an IndexError from the middle would fail here)."""
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert type(info.value) is exc or issubclass(type(info.value), exc)
    for name in [names] if isinstance(names, str) else names:
        assert re.search(name, str(info.value)), (name, str(info.value))
    return info.value


# ----------------------------------------------------------------------------------------------
# explain: checked in Python before the C++ cost model (which divides by the tile counts)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, exc, names",
    [
        ((0, 4096, 4096), {}, ValueError, [r"\bM\b", r"\b0\b"]),
        ((4096, 0, 4096), {}, ValueError, [r"\bN\b", r"\b0\b"]),
        ((4096, 4096, 0), {}, ValueError, [r"\bK\b", r"\b0\b"]),
        ((-1, 4096, 4096), {}, ValueError, [r"\bM\b", "-1"]),
        ((4096, -128, 4096), {}, ValueError, [r"\bN\b", "-128"]),
        ((2**31, 4096, 4096), {}, ValueError, [r"\bM\b", str(2**31)]),
        ((4096.0, 4096, 4096), {}, TypeError, [r"\bM\b", "4096.0"]),
        (("4096", 4096, 4096), {}, TypeError, [r"\bM\b", "'4096'"]),
        ((True, 4096, 4096), {}, TypeError, [r"\bM\b", "True"]),
        ((4096, None, 4096), {}, TypeError, [r"\bN\b", "None"]),
        ((64, 64, 64), dict(sm_count=0), ValueError, ["sm_count", r"\b0\b"]),
        ((64, 64, 64), dict(sm_count=-4), ValueError, ["sm_count", "-4"]),
        ((64, 64, 64), dict(sm_count=132.0), TypeError, ["sm_count", "132.0"]),
        ((64, 64, 64), dict(sm_count=False), TypeError, ["sm_count", "False"]),
        ((64, 64, 64), dict(dtype="int8"), ValueError, ["dtype", "int8"]),
        ((64, 64, 64), dict(dtype=torch.int8), TypeError, ["dtype", "int8"]),  # torch.bfloat16 is "bf16"
        ((64, 64, 64), dict(out_dtype="e4m3"), ValueError, ["out_dtype", "e4m3"]),
        ((64, 64, 64), dict(out_dtype=32), TypeError, ["out_dtype", "32"]),
        ((64, 64, 64), dict(layout="rx"), ValueError, ["layout", "rx"]),
        ((64, 64, 64), dict(layout="rcr"), ValueError, ["layout", "rcr"]),
        ((64, 64, 64), dict(layout=None), TypeError, ["layout", "None"]),
        ((64, 64, 64), dict(scale="col"), ValueError, ["scale", "col"]),
        ((64, 64, 64), dict(scale="tensor"), ValueError, ["scale", "tensor", "bf16"]),
        ((64, 64, 64), dict(dtype="fp16", scale="row"), ValueError, ["scale", "row", "fp16"]),
        ((64, 64, 64), dict(dtype="e4m3"), ValueError, ["scale", "none", "e4m3"]),
        ((64, 64, 64), dict(arch="sm80"), ValueError, ["arch", "no kernel module for arch 'sm80'"]),
        ((64, 64, 64), dict(arch=90), TypeError, ["arch", "90"]),
        ((64, 64, 64), dict(config=3), TypeError, ["config", r"\b3\b"]),
        ((64, 64, 64), dict(dtype="e4m3", scale="tensor", use_fast_accum=1), TypeError, ["use_fast_accum", r"\b1\b"]),
        ((64, 64, 64), dict(dtype="e4m3", scale="tensor", use_fast_accum="yes"), TypeError, ["use_fast_accum", "yes"]),
        ((64, 64, 64), dict(use_fast_accum=True), ValueError, ["use_fast_accum", "bf16"]),
    ],
)
def test_explain_rejects_bad_arguments(args, kwargs, exc, names):
    _raises(exc, names, pg.explain, *args, **kwargs)


def test_explain_checks_before_it_needs_the_extension(monkeypatch):
    # A bad argument is reported as such even where the extension is not built.
    def missing():
        raise ImportError("not built")

    monkeypatch.setattr(pg._extension, "require_extension", missing)
    _raises(ValueError, "M", pg.explain, 0, 4096, 4096)
    with pytest.raises(ImportError, match="not built"):
        pg.explain(64, 64, 64)


class _FakeExtension:
    """Stands in for ``_C``: records what explain passes down, answers like the binding."""

    def __init__(self, answer_fast_accum=None):
        self.calls = []
        self.answer_fast_accum = answer_fast_accum

    def explain(self, arch, m, n, k, dtype, out_dtype, **kw):
        self.calls.append(dict(arch=arch, m=m, n=n, k=k, dtype=dtype, out_dtype=out_dtype, **kw))
        d = dict(config="cfg", tma_store=True, copy_a=False, copy_b=False, pad_d=False, pad_m=False,
                 estimate_us=1.0, log=["cfg: ..."])
        if self.answer_fast_accum is not None:
            d["fast_accum"] = self.answer_fast_accum
        return d


def test_explain_passes_use_fast_accum_down_and_reports_it(monkeypatch):
    fake = _FakeExtension(answer_fast_accum=True)
    monkeypatch.setattr(pg._extension, "require_extension", lambda: fake)
    d = pg.explain(256, 512, 1024, dtype="e4m3", scale="row", use_fast_accum=True)
    assert fake.calls[-1]["fast_accum"] is True and d.fast_accum is True
    assert fake.calls[-1]["out_dtype"] == "bf16" and fake.calls[-1]["scale"] == "row"
    pg.explain(256, 512, 1024)
    assert fake.calls[-1]["fast_accum"] is False
    # numpy-style integers are ints; they reach C++ as plain ints
    np = pytest.importorskip("numpy")
    pg.explain(np.int64(256), np.int32(512), 1024, sm_count=np.int64(66))
    assert [type(fake.calls[-1][k]) for k in ("m", "n", "k", "sm_count")] == [int] * 4


def test_decision_fast_accum_defaults_to_false_when_not_reported(monkeypatch):
    monkeypatch.setattr(pg._extension, "require_extension", lambda: _FakeExtension())
    assert pg.explain(64, 64, 64).fast_accum is False
    assert pg.Decision("c", True, False, False, False).fast_accum is False


def test_explain_zero_size_raises_instead_of_killing_the_interpreter():
    # The C++ cost model divides by the tile counts; M = 0 used to end the process with SIGFPE.
    code = (
        "import persistent_gemm as pg\n"
        "try:\n"
        "    pg.explain(0, 4096, 4096)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
        "    raise SystemExit(0)\n"
        "raise SystemExit(1)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=300)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {p.stderr}"
    assert p.returncode == 0, p.stdout + p.stderr
    assert "M" in p.stdout


@pytest.mark.skipif(not pg.extension_available(), reason="needs the compiled extension")
def test_explain_use_fast_accum_with_the_extension():
    if not any(e["arch"] == "sm90a" and parse_name(e["config"]).dtype == "e4m3" for e in pg._C.built_kernels()):
        pytest.skip("needs sm90a e4m3 kernels built")
    d = pg.explain(4096, 4096, 4096, dtype="e4m3", scale="tensor")
    assert d.fast_accum is False
    d = pg.explain(4096, 4096, 4096, dtype="e4m3", scale="tensor", use_fast_accum=True)
    assert isinstance(d.fast_accum, bool)


@pytest.mark.parametrize("kwargs, match", [
    (dict(dtype="mxfp8", scale="row"), r"scale must be 'none' for dtype 'mxfp8' \(the MX ops carry"),
    (dict(dtype="e4m3xe2m1", layout="rr"), r"layout must be 'rc' for dtype 'e4m3xe2m1'"),
    (dict(dtype="mxfp8", use_fast_accum=True), r"use_fast_accum=True applies to dtype 'e4m3'"),
])
def test_explain_mx_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pg.explain(16, 8192, 8192, **kwargs)


@pytest.mark.skipif(not pg.extension_available(), reason="needs the compiled extension")
@pytest.mark.parametrize("dtype", ["mxfp8", "e4m3xe2m1"])
def test_explain_mx_picks_a_built_mx_kernel(dtype):
    built = [e for e in pg._C.built_kernels() if e["arch"] == "sm90a" and parse_name(e["config"]).dtype == dtype]
    if not built:
        pytest.skip(f"no sm90a {dtype} kernel built")
    d = pg.explain(1, 8192, 8192, dtype=dtype)
    cfg = parse_name(d.config)
    assert (cfg.arch, cfg.dtype) == ("sm90a", dtype)
    assert d.swap_ab == cfg.swap_ab
    assert "MX scales applied per 32-K block" in str(d)
    if dtype == "e4m3xe2m1":
        assert d.swap_ab  # the e2m1 weight is the register-sourced A operand


# ----------------------------------------------------------------------------------------------
# schedule
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, names",
    [
        (dict(cluster=2), TypeError, ["cluster", r"\b2\b"]),
        (dict(cluster=None), TypeError, ["cluster", "None"]),
        (dict(raster=None), ValueError, ["raster", "None"]),
        (dict(raster=0), ValueError, ["raster", r"\b0\b"]),
        (dict(swizzle=None), TypeError, ["swizzle", "None"]),
    ],
)
def test_tile_schedule_rejects_bad_arguments(kwargs, exc, names):
    _raises(exc, names, TileSchedule, **kwargs)


@pytest.mark.parametrize(
    "M, N, tile, batch, exc, names",
    [
        (0, 256, (128, 128), 1, ValueError, [r"\bM\b", r"\b0\b"]),
        (256, 0, (128, 128), 1, ValueError, [r"\bN\b", r"\b0\b"]),
        (-256, 256, (128, 128), 1, ValueError, [r"\bM\b", "-256"]),
        (256, -1, (128, 128), 1, ValueError, [r"\bN\b", "-1"]),
        (256, 256, (128, 128), 0, ValueError, ["batch", r"\b0\b"]),
        (256, 256, (0, 128), 1, ValueError, ["tile_m", r"\b0\b"]),
        (256, 256, (128, -64), 1, ValueError, ["tile_n", "-64"]),
        (256.0, 256, (128, 128), 1, TypeError, [r"\bM\b", "256.0"]),
        (256, True, (128, 128), 1, TypeError, [r"\bN\b", "True"]),
        (256, "256", (128, 128), 1, TypeError, [r"\bN\b", "'256'"]),
        (256, 256, (128.5, 128), 1, TypeError, ["tile_m", "128.5"]),
        (256, 256, (128, 128), 1.0, TypeError, ["batch", "1.0"]),
        (256, 256, 128, 1, TypeError, ["tile", "128"]),
        (256, 256, "128x128", 1, TypeError, ["tile", "128x128"]),
        (256, 256, (128,), 1, ValueError, ["tile", r"\(128,\)"]),
    ],
)
def test_over_rejects_bad_arguments(M, N, tile, batch, exc, names):
    _raises(exc, names, TileSchedule().over, M, N, tile, batch=batch)


def test_schedule_grid_rejects_a_non_schedule():
    _raises(TypeError, "schedule", ScheduleGrid, "row", 256, 256, 128, 128)


def test_schedule_accepts_integer_like_values_as_plain_ints():
    np = pytest.importorskip("numpy")
    g = TileSchedule(swizzle=2).over(np.int64(512), np.int32(384), (np.int64(128), 128))
    assert (g.M, g.N, g.tile_m) == (512, 384, 128) and type(g.M) is int
    assert g.coord(np.int64(1)) == g.coord(1)
    assert list(g.tiles_of(np.int64(0), workers=np.int64(4))) == list(g.tiles_of(0, workers=4))


def test_grid_methods_reject_bad_arguments():
    g = TileSchedule(swizzle=2).over(1024, 1024, (128, 128))
    _raises(TypeError, [r"\bt\b", "1.0"], g.coord, 1.0)
    _raises(TypeError, [r"\bt\b", "'3'"], g.coord, "3")
    _raises(TypeError, [r"\bt\b", "True"], g.coord_batched, True)
    _raises(IndexError, [r"\bt\b", "-1"], g.coord, -1)
    _raises(ValueError, ["workers", r"\b0\b"], g.tiles_of, 0, workers=0)
    _raises(ValueError, ["workers", "-2"], g.tiles_of, 0, workers=-2)
    _raises(TypeError, ["workers", "2.0"], g.tiles_of, 0, workers=2.0)
    _raises(TypeError, ["worker", "None"], g.tiles_of, None, workers=2)
    _raises(TypeError, ["worker", "True"], g.tiles_of, True, workers=2)
    _raises(ValueError, ["worker 2", r"\[0, 2\)"], g.tiles_of, 2, workers=2)  # raised at the call
    _raises(ValueError, ["workers", r"\b0\b"], g.order, 0)
    _raises(TypeError, ["workers", "None"], g.order, None)
    _raises(ValueError, ["workers", r"\b0\b"], g.waves, 0)
    _raises(TypeError, ["workers", "1.5"], g.waves, 1.5)
    _raises(IndexError, ["cluster_row", "-1"], g.cta_tiles, -1, 0)  # an index: like coord(-1)
    _raises(TypeError, ["cluster_col", "0.0"], g.cta_tiles, 0, 0.0)
    _raises(IndexError, [r"\(8, 0\)", "8 x 8"], g.cta_tiles, 8, 0)


def test_default_workers_rejects_bad_arguments():
    _raises(ValueError, ["sm_count", r"\b0\b"], sch.default_workers, 0, TileSchedule())
    _raises(ValueError, ["sm_count", "-132"], sch.default_workers, -132, TileSchedule())
    _raises(TypeError, ["sm_count", "132.0"], sch.default_workers, 132.0, TileSchedule())
    _raises(TypeError, ["schedule"], sch.default_workers, 132, "sw8")


@pytest.mark.parametrize(
    "args, kwargs, exc, names",
    [
        ((CFG, 0, 128, 64, 1), {}, ValueError, [r"\bM\b", r"\b0\b"]),
        ((CFG, 128, 0, 64, 1), {}, ValueError, [r"\bN\b", r"\b0\b"]),
        ((CFG, 128, -5, 64, 1), {}, ValueError, [r"\bN\b", "-5"]),
        ((CFG, 128, 128, True, 1), {}, TypeError, [r"\bK\b", "True"]),
        ((CFG, 128, 128, 64.0, 1), {}, TypeError, [r"\bK\b", "64.0"]),
        ((CFG, 128, 128, 64, 1.5), {}, TypeError, ["workers", "1.5"]),
        ((CFG, 128, 128, 64, -1), {}, ValueError, ["workers", "-1"]),
        ((CFG, 128, 128, 64, 1), dict(batch=0), ValueError, ["batch", r"\b0\b"]),
        ((42, 128, 128, 64, 1), {}, TypeError, ["config", "int"]),
    ],
)
def test_wave_footprint_rejects_bad_arguments(args, kwargs, exc, names):
    _raises(exc, names, foot.wave_footprint, *args, **kwargs)


def test_footprint_summary_checks_its_arguments_even_with_footprints_given():
    fps = foot.wave_footprint(CFG, 1024, 1024, 64, 4)
    _raises(ValueError, ["workers", r"\b0\b"], foot.footprint_summary, CFG, 1024, 1024, 64, 0, footprints=fps)
    _raises(ValueError, [r"\bK\b", r"\b0\b"], foot.footprint_summary, CFG, 1024, 1024, 0, 4, footprints=fps)
    _raises(ValueError, [r"\bM\b", r"\b0\b"], foot.footprint_summary, CFG, 0, 1024, 64, 4, footprints=fps)
    _raises(ValueError, ["footprints"], foot.footprint_summary, CFG, 1024, 1024, 64, 4, footprints=[])
    _raises(ValueError, ["max_rows", r"\b0\b"], foot.format_footprint, fps, max_rows=0)
    _raises(TypeError, ["max_rows", "2.0"], foot.format_footprint, fps, max_rows=2.0)
    _raises(ValueError, ["dtype", "int8"], foot.operand_bytes, "int8")


def test_visit_grid_and_plot_reject_bad_arguments(tmp_path):
    # plot checks its arguments before it needs matplotlib
    png = tmp_path / "x.png"
    _raises(ValueError, ["workers", r"\b0\b"], pic.visit_grid, CFG, 1024, 1024, 0)
    _raises(ValueError, [r"\bM\b", r"\b0\b"], pic.visit_grid, CFG, 0, 1024, 4)
    _raises(ValueError, ["workers", r"\b0\b"], pic.plot, CFG, 1024, 1024, png, workers=0)
    _raises(ValueError, ["sm_count", r"\b0\b"], pic.plot, CFG, 1024, 1024, png, sm_count=0)
    _raises(TypeError, ["sm_count", "132.0"], pic.plot, CFG, 1024, 1024, png, sm_count=132.0)
    _raises(ValueError, [r"\bN\b", "-1"], pic.plot, CFG, 1024, -1, png)
    _raises(TypeError, ["config"], pic.plot, None, 1024, 1024, png)
    assert not png.exists()


def test_kernel_config_grid_rejects_zero_extents():
    _raises(ValueError, [r"\bM\b", r"\b0\b"], CATALOGUE[0].grid, 0, 1024)
    _raises(ValueError, [r"\bN\b", r"\b0\b"], CATALOGUE[0].grid, 1024, 0)


# ----------------------------------------------------------------------------------------------
# CLI: one line on stderr, exit status 2, never a traceback
# ----------------------------------------------------------------------------------------------


def _main(capsys, *args):
    from persistent_gemm.tools.cli import main

    try:
        rc = main(list(args))
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "args, names",
    [
        (["--m", "0", "--n", "1024"], ["--m", r"\b0\b"]),
        (["--m", "1024", "--n", "0"], ["--n", r"\b0\b"]),
        (["--m", "-5", "--n", "1024"], ["--m", "-5"]),
        (["--m", "1024", "--n", "1024", "--k", "0"], ["--k", r"\b0\b"]),
        (["--m", "1024", "--n", "1024", "--sms", "0"], ["--sms", r"\b0\b"]),
        (["--m", "1024", "--n", "1024", "--workers", "-3"], ["--workers", "-3"]),
        (["--m", "abc", "--n", "1024"], ["--m", "abc"]),
        (["--m", "1.5", "--n", "1024"], ["--m", "1.5"]),
        (["--n", "1024"], ["--m"]),
        (["--m", "1024", "--n", "1024", "--stages", "0"], ["stages", r"\b0\b"]),
        (["--m", "1024", "--n", "1024", "--cluster", "0x1"], ["cluster", r"\(0, 1\)"]),
        (["--m", "1024", "--n", "1024", "--tile", "128x256"], ["--tile", "128x256"]),
        (["--m", "1024", "--n", "1024", "--raster", "diag"], ["--raster", "diag"]),
        (["--m", "1024", "--n", "1024", "--config", "nope"], ["nope"]),
        (["--m", "10000000", "--n", "10000000"], ["--m 10000000", "ids"]),
        (["--m", "1024", "--n", "1024", "--out", "/nonexistent-dir/x.png"], ["--out", "nonexistent-dir"]),
    ],
)
def test_cli_bad_values_print_one_line_and_exit_2(capsys, args, names):
    rc, out, err = _main(capsys, "schedule", *args)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for name in names:
        assert re.search(name, lines[0]), (name, lines[0])


def test_cli_unknown_subcommand_is_one_line(capsys):
    rc, _, err = _main(capsys, "frobnicate")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "frobnicate" in err


def test_cli_bad_value_in_a_fresh_interpreter_has_no_traceback():
    for args in (["--m", "0", "--n", "4096"], ["--m", "x", "--n", "4096"], ["--m", "64", "--n", "64", "--sms", "0"]):
        p = subprocess.run([sys.executable, "-m", "persistent_gemm", "schedule", *args], capture_output=True,
                           text=True, env=_env(), cwd=REPO, timeout=300)
        assert p.returncode == 2, (args, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


# ----------------------------------------------------------------------------------------------
# quant
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [quantize_mxfp8, quantize_mxfp4])
def test_quantizers_reject_bad_arguments(fn):
    x = torch.randn(2, 64)
    _raises(TypeError, ["block", "32.0"], fn, x, block=32.0)
    _raises(TypeError, ["block", "True"], fn, x, block=True)
    _raises(TypeError, ["block", "None"], fn, x, block=None)
    _raises(ValueError, ["block", r"\b0\b"], fn, x, block=0)
    _raises(ValueError, ["block", "-32"], fn, x, block=-32)
    _raises(TypeError, [r"\bx\b", "ndarray|list"], fn, x.tolist())
    _raises(TypeError, [r"\bx\b", "int64"], fn, torch.ones(2, 64, dtype=torch.int64))
    _raises(TypeError, [r"\bx\b", "bool"], fn, torch.ones(2, 64, dtype=torch.bool))
    _raises(TypeError, [r"\bx\b", "float4_e2m1fn_x2"], fn, torch.zeros(2, 32, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
    _raises(ValueError, [r"\bx\b", r"\(128,\)"], fn, torch.randn(128))
    _raises(ValueError, [r"\bx\b", r"\(\)"], fn, torch.tensor(1.0))  # (..., K) is taken; a scalar is not
    _raises(ValueError, ["block", "16"], fn, x, block=16)  # no op takes 1x16 blocks
    _raises(ValueError, ["rule", "'up'"], fn, x, rule="up")


def test_dequantizers_reject_bad_arguments():
    x = torch.randn(2, 64)
    d8, s8 = quantize_mxfp8(x)
    d4, s4 = quantize_mxfp4(x)
    _raises(TypeError, ["scale", "str"], dequantize_mxfp8, d8, "scale")
    _raises(TypeError, ["data", "NoneType"], dequantize_mxfp8, None, s8)
    _raises(TypeError, ["data", "float32"], dequantize_mxfp8, x, s8)
    _raises(TypeError, ["block", "32.0"], dequantize_mxfp8, d8, s8, block=32.0)
    _raises(ValueError, ["block", r"\b0\b"], dequantize_mxfp8, d8, s8, block=0)
    _raises(ValueError, ["scale", r"\(2, 2\)", r"\(2, 1\)"], dequantize_mxfp8, d8, s8[:, :1])
    _raises(TypeError, ["scale", "uint8"], dequantize_mxfp4, d4, s4.view(torch.uint8))
    _raises(TypeError, ["packed", "uint8"], dequantize_mxfp4, d4.view(torch.uint8), s4)
    _raises(ValueError, ["packed", r"\(32,\)"], dequantize_mxfp4, d4[0], s4)
    _raises(TypeError, ["block", "True"], dequantize_mxfp4, d4, s4, block=True)
