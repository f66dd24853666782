"""CPU tests of ``python -m persistent_gemm schedule``: the printed grid, waves and footprint,
the PNG, argument errors, and that it runs without the compiled extension."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import PNG_MAGIC, REPO

def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["MPLBACKEND"] = "Agg"
    return env


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "persistent_gemm", *args],
        capture_output=True, text=True, env=_env(), cwd=cwd or REPO, timeout=120,
    )


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_cli_schedule_writes_png(tmp_path):
    out = tmp_path / "order.png"
    p = _cli(
        "schedule", "--m", "8192", "--n", "8192", "--k", "8192", "--swizzle", "8", "--cluster", "2x1",
        "--raster", "row", "--tile", "128x256x64", "--kernel", "cooperative", "--dtype", "bf16",
        "--arch", "sm90a", "--sms", "132", "--out", str(out),
    )
    assert "sm90a_bf16_128x256x64_c2x1_sw8_row_coop" in p.stdout
    assert "Mt x Nt = 64 x 32" in p.stdout and "Mc x Nc = 32 x 32" in p.stdout
    assert "ids = 1024" in p.stdout and "66 (132 SMs" in p.stdout and "waves = 16" in p.stdout
    assert "1168.0 MiB" in p.stdout
    if _has_matplotlib():
        assert p.returncode == 0, p.stderr
        assert out.read_bytes()[:8] == PNG_MAGIC
    else:
        assert p.returncode != 0 and "pip install matplotlib" in p.stderr


def _main(capsys, *args):
    """The CLI in-process (a fresh interpreter costs seconds once the package imports torch)."""
    from persistent_gemm.tools.cli import main

    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_schedule_with_config_name_and_workers(capsys):
    name = "sm90a_bf16_128x256x64_c2x1_sw1_row_coop"
    rc, out, err = _main(capsys, "schedule", "--m", "8192", "--n", "8192", "--config", name, "--workers", "66", "--per-wave")
    assert rc == 0, err
    assert name in out and "66 (given)" in out
    assert "2236.0 MiB" in out
    assert sum(1 for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()) == 16


def test_cli_schedule_defaults_and_kernel_aliases(capsys):
    # The CLI's defaults are KernelConfig()'s and TileSchedule()'s: one meaning in both places.
    import persistent_gemm as pg

    rc, out, _ = _main(capsys, "schedule", "--m", "4096", "--n", "4096")
    assert rc == 0 and f"config    {pg.KernelConfig().name}" in out
    assert pg.KernelConfig().name == "sm90a_bf16_128x256x64_c1x1_sw1_row_coop"
    rc, out, _ = _main(capsys, "schedule", "--m", "4096", "--n", "4096", "--kernel", "pp", "--tile", "64x128x64",
                       "--swizzle", "8")
    assert rc == 0 and "sm90a_bf16_64x128x64_c1x1_sw8_row_pp" in out and "workers   132 (132 SMs" in out
    rc, out, _ = _main(capsys, "schedule", "--m", "4096", "--n", "4096", "--arch", "sm100a", "--dtype", "e4m3xe2m1",
                       "--tile", "128x128x128", "--cluster", "2x1", "--swizzle", "8")
    assert rc == 0 and "sm100a_e4m3xe2m1_128x128x128_c2x1_sw8_row_1sm" in out and "B 0.5 B/elem" in out


@pytest.mark.parametrize(
    "args, match",
    [
        (["--config", "sm90a_bf16_128x256x64_c2x1_sw8_row_coop", "--swizzle", "4"], "drop --swizzle"),
        (["--config", "sm90a_bf16_128x256x64_c3x1_sw8_row_coop"], "cluster extents"),
        (["--tile", "64x256x64"], "tile_m must be 128 or 256"),
        (["--cluster", "2by1"], "--cluster must look like NxN"),
        (["--swizzle", "0"], r"swizzle must be in"),
        (["--workers", "0"], "--workers must be >= 1"),
    ],
)
def test_cli_schedule_errors(capsys, args, match):
    rc, _, err = _main(capsys, "schedule", "--m", "1024", "--n", "1024", *args)
    assert rc == 2
    assert re.search(match, err), err


def test_cli_requires_a_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        _main(capsys)
    assert e.value.code == 2 and "usage" in capsys.readouterr().err


def test_cli_schedule_does_not_import_the_extension():
    code = (
        "import sys, persistent_gemm; before = set(sys.modules)\n"
        "from persistent_gemm.__main__ import main\n"
        "rc = main(['schedule', '--m', '2048', '--n', '2048'])\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('persistent_gemm')))\n"
        "sys.exit(rc)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    loaded = eval(p.stdout.strip().splitlines()[-1])
    # picture_data: the report's build line (build_status, pure Python, no matplotlib)
    assert set(loaded) <= {"persistent_gemm.__main__", "persistent_gemm.tools", "persistent_gemm.tools.cli",
                           "persistent_gemm.footprint", "persistent_gemm.tools.picture_data"}, loaded


def test_cli_schedule_picture_options(tmp_path, capsys):
    out = tmp_path / "o.png"
    rc, _, err = _main(capsys, "schedule", "--m", "2000", "--n", "3000", "--config",
                       "sm90a_bf16_128x64x64_c1x2_sw3_column_pp", "--color-by", "worker", "--highlight", "3x5",
                       "--out", str(out))
    if not _has_matplotlib():
        return
    assert rc == 0 and out.read_bytes()[:8] == PNG_MAGIC, err
    rc, _, err = _main(capsys, "schedule", "--m", "2000", "--n", "3000", "--highlight", "99x0", "--out", str(out))
    assert rc == 2 and "outside the" in err


def test_cli_precompile_and_tune_errors(capsys):
    import persistent_gemm as pg

    rc, _, err = _main(capsys, "precompile", "sm90a_bf16_nope")
    if not pg.extension_available():
        assert rc == 1 and "compiled extension" in err
        return
    assert rc == 2 and "unknown config 'sm90a_bf16_nope'" in err
    rc, _, err = _main(capsys, "tune", "--m", "64", "--n", "64", "--k", "64", "--op", "mm", "--dtype", "e4m3")
    assert rc == 2 and "dtype must be bf16 or fp16" in err
    rc, _, err = _main(capsys, "tune", "--m", "64", "--n", "64", "--k", "64", "--reps", "0")
    assert rc == 2 and "--reps must be >= 1" in err


def test_version_list_and_explain():
    import persistent_gemm as pg

    p = _cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"persistent_gemm {pg.__version__}"
    p = _cli("list", "--arch", "sm90a")
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stdout.splitlines() if l.startswith(("built", "not built"))]
    assert len(lines) == sum(c.arch == "sm90a" for c in pg.CATALOGUE)
    for c in pg.built_configs("sm90a"):
        if c in {x.name for x in pg.CATALOGUE}:
            assert f"built      {c}" in p.stdout
    if pg.extension_available() and pg.built_configs("sm90a"):
        p = _cli("explain", "--m", "1", "--n", "8192", "--k", "8192")
        assert p.returncode == 0 and p.stdout.startswith("chosen: sm90a_bf16_"), p.stderr
        p = _cli("explain", "--m", "1", "--n", "8192", "--k", "8192", "--dtype", "e4m3")
        assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("error:")


def test_build_info_and_built_configs():
    import persistent_gemm as pg

    info = pg.build_info()
    assert info["version"] == pg.__version__ and info["extension"] == pg.extension_available()
    if pg.extension_available():
        assert info["registry_abi"] == pg._C.REGISTRY_ABI
        assert sum(info["archs"].values()) == len(pg.built_configs())
        assert pg.built_configs() == sorted(pg.built_configs())


def test_python_only_install_needs_no_cuda_toolkit(tmp_path):
    """PGEMM_PYTHON_ONLY=1 installs the schedule tools without building (or needing) the extension."""
    env = dict(os.environ, PGEMM_PYTHON_ONLY="1", CUDA_HOME=str(tmp_path / "no-cuda"), PATH="/usr/bin:/bin")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(tmp_path / "site"), str(REPO)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    files = {f.name for f in (tmp_path / "site" / "persistent_gemm").iterdir()}
    assert "py.typed" in files and not any(f.endswith(".so") for f in files)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    code = ("import persistent_gemm as pg; assert not pg.extension_available(); "
            "print(pg.KernelConfig().grid(4096, 4096).coord(5))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "(0, 5)", p.stderr


def test_cli_schedule_stream_k_says_how_the_tail_is_shared(capsys):
    rc, out, _ = _main(capsys, "schedule", "--m", "8192", "--n", "8192", "--k", "8192", "--cluster", "2x1",
                       "--stream-k")
    assert rc == 0 and "sm90a_bf16_128x256x64_c2x1_sw1_row_streamk_coop" in out
    # 1024 units on 66 workers: 14 whole waves, then the last 34 + 66 units in K-tiles
    assert "924 ids data-parallel, then 100 shared by 66 workers in K-tiles (12800 of them, 193-194 a worker)" in out
    assert "last wave 100 ids" in out and "per K range" in out
    # 257 rows on 128x128 tiles: 3 bands x 16 cluster columns, dealt in 3 lanes (one per band)
    rc, out, _ = _main(capsys, "schedule", "--m", "257", "--n", "4096", "--k", "4096",
                       "--config", "sm90a_bf16_128x128x64_c1x2_sw8_row_streamk_pp")
    assert rc == 0 and "48 shared by 66 workers in 3 lanes of 22 in K-tiles (3072 of them, 46-47 a worker)" in out
    rc, out, _ = _main(capsys, "schedule", "--m", "128", "--n", "256", "--k", "64", "--stream-k", "--workers", "1")
    assert rc == 0 and "whole waves only: every id data-parallel" in out


# -- newcomer 12-07 #3, #8, #10 ----------------------------------------------------------------------
def test_cli_docstring_shows_every_command_and_its_examples_parse():
    """The module docstring's examples: one per command the parser has, each one it accepts (the
    docstring once listed 4 of 7 commands)."""
    from persistent_gemm.tools import cli

    parser = cli._parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    examples = [line.split()[3:] for line in cli.__doc__.splitlines()
                if line.strip().startswith("python -m persistent_gemm ")]
    assert {e[0] for e in examples} == commands
    for e in examples:
        parser.parse_args(e)  # SystemExit (2) on a flag or value the command does not take


def test_cli_explain_takes_every_alias_python_takes():
    """`pg.explain(dtype="fp8_fp4")` worked while `explain --dtype fp8_fp4` was an invalid choice."""
    import persistent_gemm as pg
    from persistent_gemm.explain import DTYPES
    from persistent_gemm.library import FAMILY_ALIASES
    from persistent_gemm.tools.cli import _parser

    for name in DTYPES + tuple(FAMILY_ALIASES):
        assert _parser().parse_args(["explain", "--m", "1", "--n", "64", "--k", "64", "--dtype", name]).dtype == name
    if pg.extension_available() and pg.built_configs("sm90a"):
        p = _cli("explain", "--m", "128", "--n", "8192", "--k", "8192", "--dtype", "fp8_fp4")
        assert p.returncode == 0 and p.stdout.startswith("chosen: sm90a_e4m3xe2m1_"), p.stderr
        assert p.stdout == _cli("explain", "--m", "128", "--n", "8192", "--k", "8192", "--dtype", "e4m3xe2m1").stdout


def test_cli_schedule_says_whether_the_config_is_built(capsys, monkeypatch):
    """`schedule --m 4096 --n 4096` reported the defaults' config, which is not built, and said nothing."""
    import persistent_gemm as pg
    from persistent_gemm.tools import picture_data

    def build_line(*args):
        rc, out, err = _main(capsys, "schedule", "--m", "4096", "--n", "4096", *args)
        assert rc == 0, err
        return next(line for line in out.splitlines() if line.startswith("build "))

    here = picture_data.build_status(pg.KernelConfig())
    assert ("no extension built here" if here == picture_data.NO_EXTENSION_STATUS else here) in build_line()
    # Each answer, whatever this install holds: no extension, built, not built (defaults or --config).
    for status, given, want in [(picture_data.NO_EXTENSION_STATUS, False, "no extension built here"),
                                ("built", True, "built"),
                                (picture_data.JIT_STATUS, False, "python -m persistent_gemm list"),
                                (picture_data.JIT_STATUS, True, "JIT-compiles on first use")]:
        monkeypatch.setattr(picture_data, "build_status", lambda c, s=status: s)
        line = build_line(*(["--config", pg.KernelConfig().name] if given else []))
        assert want in line, line
        assert ("python -m persistent_gemm list" in line) == (not given and status == picture_data.JIT_STATUS)


def test_cli_output_into_a_closed_pipe_exits_quietly():
    """`python -m persistent_gemm list | head` ended in a BrokenPipeError traceback. The reader
    closes its end before the CLI writes: no traceback, SIGPIPE's exit status (141)."""
    from persistent_gemm.tools.cli import BROKEN_PIPE_STATUS

    # (--help needs nothing: argparse's own writer drops an OSError and exits 0.)
    for args in (["list"], ["schedule", "--m", "4096", "--n", "4096", "--per-wave"]):
        p = subprocess.Popen([sys.executable, "-m", "persistent_gemm", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=_env(), cwd=REPO)
        p.stdout.close()
        err = p.stderr.read().decode()
        rc = p.wait(timeout=120)
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        assert rc == BROKEN_PIPE_STATUS == 141, (args, rc, err)
