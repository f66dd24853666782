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
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Callable, Iterable, Optional
from unittest import mock

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
            "csrc/cost_model.cpp", "csrc/module.cpp", "csrc/self_check.cpp", "csrc/quantize.cpp", "csrc/grouped.cpp",
            "csrc/moe_routing.cpp"]
    exts = [CUDAExtension("persistent_gemm._C", core + rel(sources["_C"]), include_dirs=includes,
                          extra_compile_args={"cxx": cxx})]
    for spec in archs:
        name = spec.name
        nvcc = FLAGS.nvcc_flags(spec.gencode)
        exts.append(CUDAExtension(f"persistent_gemm._C_{name}", rel(sources[name]), include_dirs=includes,
                                  extra_compile_args={"cxx": cxx, "nvcc": nvcc}))
    return exts, kernel_sources(sources)


def kernel_sources(sources: dict) -> dict:
    """{arch: its CUTLASS kernel TUs}: the generated .cu files but the scale relayout."""
    return {arch: [Path(p) for p in files if str(p).endswith(".cu") and Path(p).name != "scale_layout.cu"]
            for arch, files in sources.items() if arch != "_C"}


def max_jobs() -> int:
    """Compile jobs at a time: MAX_JOBS, else one per core (ninja's own default, cores + 2, would
    overcommit the memory of ~4 GB per kernel TU)."""
    raw = os.environ.get("MAX_JOBS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else os.cpu_count() or 1


def plan_text(total: int, to_compile: Optional[int], kernels: dict, kernels_to_compile: int, jobs: int) -> str:
    """The build's plan, said once before compiling: ``to_compile`` of the ``total`` translation
    units are out of date (None: not known beforehand), ``kernels_to_compile`` of them CUTLASS
    kernel TUs; ``kernels`` = {arch: kernel TUs in the build}."""
    in_build = ", ".join(f"{n} kernel TUs for {arch}" for arch, n in kernels.items()) or "no kernel TUs"
    if to_compile == 0:
        return f"persistent_gemm: compiling 0 of {total} translation units ({in_build}): all are up to date."
    count = f"up to {total}" if to_compile is None else f"{to_compile} of {total}"
    text = f"persistent_gemm: compiling {count} translation units ({in_build}); "
    if kernels_to_compile:
        # The cost of a kernel TU is said only where one compiles: the others take seconds.
        text += (f"{kernels_to_compile} of them CUTLASS kernel TUs, each ~60-120 s and ~4 GB on one core; "
                 f"{jobs} at a time (MAX_JOBS). PGEMM_KERNELS=<regex> narrows the kernels; ")
    else:
        text += f"none of them a CUTLASS kernel TU; {jobs} at a time (MAX_JOBS); "
    return text + "pip install -v shows per-file progress."


class Progress:
    """The status of each compiled object over the whole build, not per module:
    ``[persistent_gemm 12/97 done, 431.2s, ~1350s left]`` (scripts/install.sh parses it). The
    estimate charges each kind of TU (CUTLASS kernel or other: a kernel TU takes several times
    as long) the time between finishes, so it measures throughput at the jobs running; it is
    left out until every kind still to compile has a measured mean."""

    def __init__(self, total: int, kernels: int, clock: Callable[[], float] = time.monotonic):
        self.total, self.done, self.clock = total, 0, clock
        self.left = {True: kernels, False: total - kernels}
        self.spent = {True: 0.0, False: 0.0}
        self.count = {True: 0, False: 0}
        self.start: Optional[float] = None
        self.last = 0.0

    def run_started(self) -> None:
        """A module's ninja run begins: its first finish is charged from here, not from the
        previous module's last one (linking is nobody's TU)."""
        self.last = self.clock()
        if self.start is None:
            self.start = self.last

    def finished(self, kernel: bool) -> str:
        now = self.clock()
        self.done += 1
        self.spent[kernel] += now - self.last
        self.count[kernel] += 1
        self.left[kernel] = max(0, self.left[kernel] - 1)
        self.last = now
        eta = self.eta()
        tail = f", ~{eta:.0f}s left" if eta else ""
        return f"[persistent_gemm {self.done}/{self.total} done, {now - self.start:.1f}s{tail}]"

    def eta(self) -> Optional[float]:
        if any(self.left[k] and not self.count[k] for k in self.left):
            return None
        return sum(self.left[k] * self.spent[k] / self.count[k] for k in self.left if self.left[k])


class Ninja:
    """Runs the ninja files torch writes per extension module: first ``dry`` (``ninja -n``, what
    is out of date, nothing written), then ``run``, whose status lines Progress rewrites."""

    #: ninja's status prefix, for setup.py to find its lines among the compilers' output.
    MARK = "@@persistent_gemm@@ "
    #: The source of a compile command, ``-c $in`` in torch's rules (its cflags may end in a bare -c).
    _SOURCE = re.compile(r"\s-c\s+([^-\s]\S*)")

    def __init__(self, kernels: Iterable, jobs: int):
        self.kernels = {str(Path(p).resolve()) for p in kernels}
        self.jobs = jobs
        self.pending: list[str] = []  # sources the dry runs found out of date
        self.progress: Optional[Progress] = None

    def _env(self) -> dict:
        return {**os.environ, "NINJA_STATUS": self.MARK}

    def is_kernel(self, status_line: str) -> bool:
        m = self._SOURCE.search(status_line)
        return bool(m) and str(Path(m.group(1)).resolve()) in self.kernels

    def dry(self, build_directory: str) -> None:
        out = subprocess.run(["ninja", "-n", "-v"], cwd=build_directory, env=self._env(), capture_output=True,
                             text=True, errors="replace", check=True).stdout
        self.pending += [line for line in out.splitlines() if line.startswith(self.MARK)]

    def plan(self) -> tuple[int, int]:
        """(TUs to compile, kernel TUs among them), once the dry runs are done."""
        kernels = sum(map(self.is_kernel, self.pending))
        self.progress = Progress(len(self.pending), kernels)
        return len(self.pending), kernels

    def run(self, build_directory: str, error_prefix: str = "Error compiling objects") -> None:
        self.progress.run_started()
        proc = subprocess.Popen(["ninja", "-v", "-j", str(self.jobs)], cwd=build_directory, env=self._env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        for line in proc.stdout:
            if line.startswith(self.MARK):
                line = f"{self.progress.finished(self.is_kernel(line))} {line[len(self.MARK):]}"
            sys.stdout.write(line)
            sys.stdout.flush()
        if proc.wait():
            raise RuntimeError(f"{error_prefix}: ninja exited with {proc.returncode} (its output is above)")


#: Environment variable: "1" installs the pure-Python package only (schedule tools, catalogue,
#: codegen, quantizer references; no extension, no CUDA toolkit, no nvcc time).
PYTHON_ONLY_ENV = "PGEMM_PYTHON_ONLY"


def _build_ext(base, kernels: dict, build_temp: Path = ROOT / "build" / "temp"):
    """build_ext with one fixed object folder (build/temp in the repository), and the build's plan
    and progress over all extension modules.

    Object folder: an editable install otherwise compiles into a fresh temporary folder every
    time, so the README's second command rebuilt every kernel; with a fixed folder ninja
    recompiles only what changed (codegen rewrites a generated source only when its text changes).

    Plan and progress: torch writes and runs one ninja file per module, each counting from 1 with
    its own clock. Here each module is first compiled dry (its ninja file written, ``ninja -n``,
    nothing linked), so the plan says how many TUs of the whole build are out of date, and then
    for real, through :class:`Ninja`, whose status lines count over the whole build."""
    counts = {arch: len(files) for arch, files in kernels.items()}

    class Build(base):
        def finalize_options(self):
            super().finalize_options()
            self.build_temp = str(build_temp)

        def build_extensions(self):
            import torch.utils.cpp_extension as cpp

            self._ninja = Ninja([p for files in kernels.values() for p in files], max_jobs())
            self._planned = not callable(getattr(cpp, "_run_ninja_build", None))
            if self._planned:  # a torch without the hook: its own ninja runs, counted per module
                total = sum(len(ext.sources) for ext in self.extensions)
                print(plan_text(total, None, counts, sum(counts.values()), self._ninja.jobs), file=sys.stderr,
                      flush=True)
                os.environ.setdefault("NINJA_STATUS", "[persistent_gemm %f/%t done, %es] ")
                return super().build_extensions()

            def run_ninja(build_directory, verbose=True, error_prefix="Error compiling objects"):
                if self._planned:
                    self._ninja.run(build_directory, error_prefix)
                else:
                    self._ninja.dry(build_directory)

            with mock.patch.object(cpp, "_run_ninja_build", run_ninja):
                super().build_extensions()

        def build_extension(self, ext):
            if not self._planned:
                self._plan()
            super().build_extension(ext)

        def _plan(self):
            link = self.compiler.link_shared_object
            self.compiler.link_shared_object = lambda *a, **k: None  # the dry pass has no objects to link
            try:
                for ext in self.extensions:
                    super().build_extension(ext)
            finally:
                self.compiler.link_shared_object = link
            self._planned = True
            total = sum(len(ext.sources) for ext in self.extensions)
            to_compile, kernel_tus = self._ninja.plan()
            print(plan_text(total, to_compile, counts, kernel_tus, self._ninja.jobs), file=sys.stderr, flush=True)

    return Build


def main():
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "python/persistent_gemm/_version.py").read_text()).group(1)
    if os.environ.get(PYTHON_ONLY_ENV) == "1":
        ext_modules, cmdclass = [], {}
    else:
        require_host_torch()
        locate_cuda()
        from torch.utils.cpp_extension import BuildExtension
        ext_modules, kernels = extensions()
        cmdclass = {"build_ext": _build_ext(BuildExtension.with_options(use_ninja=True), kernels)}
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
        # models: transformers, whose MoE experts pg.nn.quantize_ swaps (persistent_gemm.moe; tests/test_moe.py)
        extras_require={"plot": ["matplotlib"], "test": ["pytest", "hypothesis"], "models": ["transformers"]},
    )


if __name__ == "__main__":
    main()
