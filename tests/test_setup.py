"""CPU tests of setup.py's build experience: the isolated-build refusal and the build announcement."""

import importlib.util
import os
import sys
import tempfile
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


def test_build_announces_what_it_compiles(setup_py, capsys, monkeypatch):
    monkeypatch.delenv("NINJA_STATUS", raising=False)
    monkeypatch.setenv("MAX_JOBS", "3")
    sources = {"_C": [Path("g/catalogue_table.cpp")],
               "sm90a": [Path("g/sm90a/x.cu"), Path("g/sm90a/y.cu"), Path("g/sm90a/sm90a_mxfp8_gemv.cu"),
                         Path("g/sm90a/kernel_table.cpp"), Path("g/sm90a/scale_layout.cu"),
                         Path("g/sm90a/module.cpp")]}
    setup_py.announce_build(sources, core_count=7)
    err = capsys.readouterr().err
    assert "compiling 14 translation units (3 kernel TUs for sm90a)" in err
    assert "MAX_JOBS=3" in err and "PGEMM_KERNELS" in err and "pip install -v" in err
    assert os.environ["NINJA_STATUS"].startswith("[persistent_gemm %f/%t")
