"""Build persistent_gemm: one dispatch module (_C) and one kernel module per GPU arch.

    scripts/setup_and_demo.sh    # installs everything, builds, runs the demo
    scripts/setup_and_test.sh    # installs everything, builds, runs the tests

Both end in ``pip install --no-build-isolation --no-deps -e .`` against the torch they installed;
a plain ``pip install .`` (build isolation) stops at once with a message saying so.

Environment (docs/environment.md): TORCH_CUDA_ARCH_LIST, PGEMM_KERNELS,
PGEMM_CUTLASS_PATH (or CUTLASS_PATH), MAX_JOBS.
"""

import os
import re
import sys
import types
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def fail(msg: str) -> None:
    sys.exit(f"persistent_gemm build error: {msg}")


USE_THE_TWO_COMMANDS = (
    "install and build with one of the README's two commands instead:\n"
    "    scripts/setup_and_demo.sh    # installs everything, builds, runs the demo\n"
    "    scripts/setup_and_test.sh    # installs everything, builds, runs the tests\n"
    "(or, with torch already installed: pip install --no-build-isolation -e .)"
)
def _isolated(paths) -> bool:
    """Whether any of ``paths`` lies in a front-end's temporary build environment: pip's
    ``<tmp>/pip-build-env-*``, pypa/build's ``<tmp>/build-env-*``, uv's ``.../builds-v0/``.
    A torch found there is not the torch the package will run with."""
    import tempfile

    tmp = os.path.join(os.path.realpath(tempfile.gettempdir()), "")
    for p in map(str, paths):
        real = os.path.realpath(p) if p else p
        if "pip-build-env-" in p or f"builds-v0{os.sep}" in p or (real.startswith(tmp) and f"{os.sep}build-env-" in real):
            return True
    return False


def require_host_torch() -> None:
    """Stop at once unless this build sees the torch the package will run with.

    The extension links against torch's C++ ABI, so it must be compiled against the installed
    torch. pyproject.toml therefore lists no torch among its build requirements, and under
    build isolation (plain ``pip install .``) the isolated environment hides the installed
    one: ``import torch`` fails here, before pip has downloaded gigabytes or nvcc has run for
    12 minutes. A torch that does import but lives in a temporary build environment (a
    front-end that adds it anyway) is refused the same way."""
    try:
        import torch
    except ImportError:
        if _isolated(sys.path):
            fail("this is an isolated build (plain `pip install .`): it cannot see your torch, and the "
                 "extension must be compiled against the torch it will run with.\n" + USE_THE_TWO_COMMANDS)
        fail("torch is not installed in this Python environment; the extension compiles against it.\n"
             + USE_THE_TWO_COMMANDS)
    if _isolated([torch.__file__]):
        fail(f"the torch this build sees ({torch.__file__}) lives in a temporary build environment, not "
             "the one the package will run with (plain `pip install .` uses build isolation).\n"
             + USE_THE_TWO_COMMANDS)


def load_module(name: str):
    """Import persistent_gemm.<name> from the source tree without running the package's
    __init__ (which loads the extension this build is about to produce)."""
    ours = lambda k: k == "persistent_gemm" or k.startswith("persistent_gemm.")  # noqa: E731
    # Whatever of the package was imported before (a test importing this file) comes back whole:
    # re-imported submodules would carry second copies of its classes.
    saved = {k: m for k, m in sys.modules.items() if ours(k)}
    pkg = types.ModuleType("persistent_gemm")
    pkg.__path__ = [str(ROOT / "python" / "persistent_gemm")]
    for k in saved:
        del sys.modules[k]
    sys.modules["persistent_gemm"] = pkg
    try:
        import importlib
        return importlib.import_module(f"persistent_gemm.{name}")
    finally:
        for k in [k for k in sys.modules if ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


# The arch table (python/persistent_gemm/archs.py) and the compile flags (build_flags.py) are read
# from the package, not spelled here.
ARCHS = load_module("archs").ARCHS
FLAGS = load_module("build_flags")
DEFAULT_ARCH_LIST = ";".join(a.torch_arch for a in ARCHS.values())


def locate_cuda() -> None:
    """Point torch at the real toolkit before it guesses: with no CUDA_HOME set it takes the
    folder above `which nvcc`, which is wrong when nvcc is a wrapper script in /usr/local/bin."""
    home = FLAGS.find_cuda_home()
    if home and not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        os.environ["CUDA_HOME"] = str(home)


def cuda_home(min_cuda: tuple[int, int]) -> Path:
    from torch.utils.cpp_extension import CUDA_HOME
    if not CUDA_HOME:
        fail("no CUDA toolkit found (set CUDA_HOME); CUDA 12.8 or newer is required")
    home = Path(CUDA_HOME)
    found = FLAGS.nvcc_version(home)
    if found is None:
        fail(f"cannot run {home / 'bin' / 'nvcc'} --version; CUDA 12.8 or newer is required")
    if found < min_cuda:
        fail(f"nvcc at {home} is release {found[0]}.{found[1]}; CUDA {min_cuda[0]}.{min_cuda[1]} or newer is "
             f"required for the archs built (TORCH_CUDA_ARCH_LIST)")
    return home


def cutlass_include() -> Path:
    root, why = FLAGS.find_cutlass()
    if root is None:
        fail(why)
    return root


def arch_list() -> list:
    """The ArchSpecs TORCH_CUDA_ARCH_LIST selects (default: every arch of the table)."""
    raw = os.environ.get("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST)
    wanted = [a for a in re.split(r"[;\s,]+", raw.strip()) if a]
    spellings = {a.torch_arch: a for a in ARCHS.values()}
    unknown = [a for a in wanted if a not in spellings]
    if unknown:
        fail(f"TORCH_CUDA_ARCH_LIST={raw!r}: unsupported {unknown}; persistent_gemm builds {sorted(spellings)}")
    return [spellings[a] for a in dict.fromkeys(wanted)]


def extensions():
    from torch.utils.cpp_extension import CUDAExtension
    archs = arch_list()
    home = cuda_home(max(a.min_nvcc for a in archs))
    cutlass = cutlass_include()
    codegen = load_module("codegen")
    gen_dir = ROOT / "csrc" / "generated"
    sources = codegen.generate(gen_dir, [a.name for a in archs])
    includes = FLAGS.include_dirs(ROOT, cutlass, home)
    cxx = list(FLAGS.CXX_FLAGS)
    rel = lambda paths: [os.path.relpath(p, ROOT) for p in paths]
    core = ["csrc/ops.cpp", "csrc/checks.cpp", "csrc/dispatch.cpp", "csrc/arch_registry.cpp", "csrc/heuristics.cpp",
            "csrc/cost_model.cpp", "csrc/module.cpp", "csrc/self_check.cpp", "csrc/quantize.cpp"]
    exts = [CUDAExtension("persistent_gemm._C", core + rel(sources["_C"]), include_dirs=includes,
                          extra_compile_args={"cxx": cxx})]
    for spec in archs:
        name = spec.name
        nvcc = FLAGS.nvcc_flags(spec.gencode)
        exts.append(CUDAExtension(f"persistent_gemm._C_{name}", rel(sources[name]), include_dirs=includes,
                                  extra_compile_args={"cxx": cxx, "nvcc": nvcc}))
    announce_build(sources, len(core))
    return exts


def announce_build(sources: dict, core_count: int) -> None:
    """Say up front what the build compiles and how long it takes, and make ninja's per-file
    progress lines name the count and the elapsed time (shown by ``pip install -v``; a quiet pip
    keeps them until the end or an error)."""
    kernels = {arch: sum(1 for p in files if str(p).endswith(".cu") and Path(p).name != "scale_layout.cu")
               for arch, files in sources.items() if arch != "_C"}
    jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
    units = sum(len(files) for files in sources.values()) + core_count
    per_arch = ", ".join(f"{n} kernel TUs for {arch}" for arch, n in kernels.items())
    print(f"persistent_gemm: compiling {units} translation units ({per_arch}); each CUTLASS kernel TU "
          f"takes ~60-120 s and ~4 GB on one core, MAX_JOBS={jobs} at a time. PGEMM_KERNELS=<regex> "
          "narrows the kernels; pip install -v shows per-file progress.", file=sys.stderr, flush=True)
    os.environ.setdefault("NINJA_STATUS", "[persistent_gemm %f/%t done, %es] ")


#: Environment variable: "1" installs the pure-Python package only (schedule tools, catalogue,
#: codegen, quantizer references; no extension, no CUDA toolkit, no nvcc time).
PYTHON_ONLY_ENV = "PGEMM_PYTHON_ONLY"


def _persistent_build_dir(base):
    """build_ext with one fixed object folder (build/temp in the repository). An editable install
    otherwise compiles into a fresh temporary folder every time, so the README's second command
    rebuilt every kernel; with a fixed folder ninja recompiles only what changed (codegen rewrites
    a generated source only when its text changes)."""

    class Build(base):
        def finalize_options(self):
            super().finalize_options()
            self.build_temp = str(ROOT / "build" / "temp")

    return Build


def main():
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "python/persistent_gemm/_version.py").read_text()).group(1)
    if os.environ.get(PYTHON_ONLY_ENV) == "1":
        ext_modules, cmdclass = [], {}
    else:
        require_host_torch()
        locate_cuda()
        from torch.utils.cpp_extension import BuildExtension
        ext_modules = extensions()
        cmdclass = {"build_ext": _persistent_build_dir(BuildExtension.with_options(use_ninja=True))}
    setup(
        name="persistent_gemm",
        version=version,
        description="Persistent warp-specialized GEMMs with a user-visible tile scheduler (SM90/SM100)",
        long_description=(ROOT / "README.md").read_text(),
        long_description_content_type="text/markdown",
        classifiers=[
            "Programming Language :: Python :: 3",
            "Programming Language :: C++",
            "Environment :: GPU :: NVIDIA CUDA :: 12",
            "Topic :: Scientific/Engineering :: Artificial Intelligence",
            "Typing :: Typed",
        ],
        package_dir={"": "python"},
        packages=["persistent_gemm", "persistent_gemm.tools"],
        package_data={"persistent_gemm": ["py.typed"]},
        ext_modules=ext_modules,
        cmdclass=cmdclass,
        python_requires=">=3.10",
        install_requires=["torch>=2.8"],
        extras_require={"plot": ["matplotlib"], "test": ["pytest", "hypothesis"]},
    )


if __name__ == "__main__":
    main()
