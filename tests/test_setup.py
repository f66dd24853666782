"""CPU tests of setup.py's build experience: the isolated-build refusal, the build plan and the
progress lines (counted over the whole build, read by scripts/install.sh)."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("pgemm_setup", REPO / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # main() runs only as __main__
    return mod


def test_importing_setup_leaves_the_package_modules_alone(setup_py):
    """setup.py loads archs/codegen from the source tree; the package's modules imported before
    must be the same objects after (a second copy of a class breaks isinstance elsewhere)."""
    import persistent_gemm.catalogue as before

    setup_py.load_module("codegen")
    import persistent_gemm.catalogue as after

    assert after is before and sys.modules["persistent_gemm.catalogue"] is before


def test_isolated_build_paths_are_recognised(setup_py):
    tmp = tempfile.gettempdir()
    assert setup_py._isolated([os.path.join(tmp, "pip-build-env-abc123", "overlay", "lib")])
    assert setup_py._isolated([os.path.join(tmp, "build-env-x1", "lib", "torch", "__init__.py")])
    assert setup_py._isolated(["/home/u/.cache/uv/builds-v0/.tmpX/lib/python3.12/site-packages"])
    assert not setup_py._isolated(["/usr/lib/python3/site-packages/torch/__init__.py"])


def test_plan_says_what_compiles(setup_py):
    sources = {"_C": [Path("g/catalogue_table.cpp")],
               "sm90a": [Path("g/sm90a/x.cu"), Path("g/sm90a/y.cu"), Path("g/sm90a/sm90a_mxfp8_gemv.cu"),
                         Path("g/sm90a/kernel_table.cpp"), Path("g/sm90a/scale_layout.cu"),
                         Path("g/sm90a/module.cpp")]}
    kernels = {arch: len(files) for arch, files in setup_py.kernel_sources(sources).items()}
    assert kernels == {"sm90a": 3}  # the .cu files but the scale relayout

    full = setup_py.plan_text(14, 14, kernels, 3, jobs=3)
    assert full.startswith("persistent_gemm: compiling 14 of 14 translation units (3 kernel TUs for sm90a); ")
    assert "3 of them CUTLASS kernel TUs, each ~60-120 s" in full and "3 at a time (MAX_JOBS)" in full
    assert "PGEMM_KERNELS" in full and "pip install -v" in full
    # An incremental build counts what is out of date; the kernel TU cost only where one compiles.
    some = setup_py.plan_text(14, 2, kernels, 0, jobs=3)
    assert some.startswith("persistent_gemm: compiling 2 of 14 translation units")
    assert "none of them a CUTLASS kernel TU" in some and "60-120" not in some
    none = setup_py.plan_text(14, 0, kernels, 0, jobs=3)
    assert none == "persistent_gemm: compiling 0 of 14 translation units (3 kernel TUs for sm90a): all are up to date."
    narrowed = setup_py.plan_text(12, 12, {"sm90a": 0}, 0, jobs=2)  # PGEMM_KERNELS='^none$'
    assert "(0 kernel TUs for sm90a)" in narrowed and "60-120" not in narrowed
    assert setup_py.plan_text(14, None, kernels, 3, jobs=3).startswith("persistent_gemm: compiling up to 14 ")


def test_max_jobs(setup_py, monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "3")
    assert setup_py.max_jobs() == 3
    monkeypatch.setenv("MAX_JOBS", "many")
    assert setup_py.max_jobs() == (os.cpu_count() or 1)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_progress_counts_over_modules_with_an_eta_per_kind(setup_py):
    clock = Clock()
    p = setup_py.Progress(total=5, kernels=3, clock=clock)
    p.run_started()  # module 1: two small TUs
    clock.t += 4
    assert p.finished(False) == "[persistent_gemm 1/5 done, 4.0s]"  # no kernel TU measured yet
    clock.t += 2
    assert p.finished(False) == "[persistent_gemm 2/5 done, 6.0s]"
    clock.t += 5  # linking module 1: charged to no TU
    p.run_started()  # module 2: the count and the clock go on
    clock.t += 30
    # Three kernel TUs, one done in 30 s: two left, ~60 s.
    assert p.finished(True) == "[persistent_gemm 3/5 done, 41.0s, ~60s left]"
    clock.t += 10
    assert p.finished(True) == "[persistent_gemm 4/5 done, 51.0s, ~20s left]"  # mean (30 + 10) / 2
    clock.t += 20
    assert p.finished(True) == "[persistent_gemm 5/5 done, 71.0s]"


STATUS = re.compile(r"\[persistent_gemm (\d+)/(\d+) done, \d+\.\ds(, ~\d+s left)?\] ")


def _ninja_module(folder: Path, names) -> list:
    """A ninja file shaped like torch's: one compile edge per source, ``-c $in -o $out``."""
    folder.mkdir()
    (folder / "cc.sh").write_text('cp "$2" "$4"\n')
    rules = "rule cc\n  command = sh cc.sh -c $in -o $out\n"
    sources = []
    for n in names:
        (folder / f"{n}.cu").write_text(n)
        sources.append(folder / f"{n}.cu")
        rules += f"build {folder / n}.o: cc {folder / n}.cu\n"
    (folder / "build.ninja").write_text(rules)
    return sources


@pytest.mark.skipif(not shutil.which("ninja"), reason="no ninja")
def test_ninja_counts_the_whole_build_and_install_sh_reads_it(setup_py, tmp_path, capsys):
    one = _ninja_module(tmp_path / "m1", ["table", "module"])
    two = _ninja_module(tmp_path / "m2", ["k1", "k2", "scale_layout"])
    ninja = setup_py.Ninja(kernels=two[:2], jobs=1)
    ninja.dry(str(tmp_path / "m1"))
    ninja.dry(str(tmp_path / "m2"))
    assert ninja.plan() == (5, 2)
    assert not list(tmp_path.glob("m*/*.o")), "the dry run compiled"
    ninja.run(str(tmp_path / "m1"))
    ninja.run(str(tmp_path / "m2"))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if STATUS.match(line)]
    assert [STATUS.match(line).group(1, 2) for line in lines] == [(str(i), "5") for i in range(1, 6)]
    assert len(list(tmp_path.glob("m*/*.o"))) == 5

    # scripts/install.sh's filter (pip -v indents the build's output) keeps each status and object.
    script = (REPO / "scripts" / "install.sh").read_text()
    program = re.search(r"\| awk '(.*?)'\n", script, re.S).group(1)
    shown = subprocess.run(["awk", program], input="".join(f"  {line}\n" for line in lines), capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert len(shown) == 5 and all(re.fullmatch(r"   \[persistent_gemm \d/5 done, [^]]*\] \w+\.o", s) for s in shown), shown

    # Nothing out of date, then one source changed: the next plan counts what ninja would run.
    again = setup_py.Ninja(kernels=two[:2], jobs=1)
    again.dry(str(tmp_path / "m1"))
    again.dry(str(tmp_path / "m2"))
    assert again.plan() == (0, 0)
    os.utime(two[0], (time.time() + 5, time.time() + 5))
    again.dry(str(tmp_path / "m2"))
    assert again.plan() == (1, 1)


_TINY = """
import importlib.util, sys
from pathlib import Path
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
spec = importlib.util.spec_from_file_location("pgemm_setup", sys.argv[1])
ours = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ours)
build = ours._build_ext(BuildExtension.with_options(use_ninja=True), {"x": [Path("k.cpp").resolve()]},
                        build_temp=Path("temp").resolve())
setup(name="tiny", ext_modules=[CppExtension("tiny_a", ["a.cpp"]), CppExtension("tiny_b", ["k.cpp", "b.cpp"])],
      cmdclass={"build_ext": build}, script_args=["build_ext", "--inplace"])
"""


@pytest.mark.skipif(not shutil.which("ninja"), reason="no ninja")
def test_build_ext_plans_then_counts_over_modules(tmp_path):
    # torch's own BuildExtension on two tiny C++ modules (no torch headers, so seconds): the hook
    # into its ninja runs (a private torch function) plans once and counts over both modules.
    for name in ("a", "b", "k"):
        (tmp_path / f"{name}.cpp").write_text(f"int {name}() {{ return 1; }}\n")
    (tmp_path / "tiny.py").write_text(_TINY)

    def build():
        run = subprocess.run([sys.executable, "tiny.py", str(REPO / "setup.py")], cwd=tmp_path, capture_output=True,
                             text=True, env={**os.environ, "MAX_JOBS": "1"}, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run.stderr.count("persistent_gemm: compiling"), run.stderr, STATUS.findall(run.stdout), run.stdout

    plans, err, _, out = build()
    assert plans == 1 and "compiling 3 of 3 translation units (1 kernel TUs for x); 1 of them CUTLASS" in err, err
    assert [m.group(1, 2) for m in STATUS.finditer(out)] == [("1", "3"), ("2", "3"), ("3", "3")], out
    assert len(list(tmp_path.glob("tiny_*.so"))) == 2
    (tmp_path / "b.cpp").write_text("int b() { return 2; }\n")
    plans, err, _, out = build()
    assert plans == 1 and "compiling 1 of 3 translation units" in err and "60-120" not in err, err
    assert [m.group(1, 2) for m in STATUS.finditer(out)] == [("1", "1")], out
