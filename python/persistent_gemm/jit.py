"""Run any valid schedule: configs that were not built are compiled at first use.

A :class:`~persistent_gemm.catalogue.KernelConfig` (or its canonical name) passed as ``config=``
to an op, or to :func:`precompile`, is lowered by the same code generator as the build
(:func:`persistent_gemm.codegen.jit_sources`), compiled once with the build's flags
(:mod:`persistent_gemm.build_flags`) into a small arch module, loaded, and merged into that
arch's kernel table beside the built kernels (the dispatcher and ``explain`` then see it).

Cache: ``$PGEMM_CACHE_DIR`` (default ``~/.cache/persistent_gemm``), one shared object per key;
the key hashes the generated sources, the flags, our headers and the nvcc, torch and CUTLASS
versions. Concurrent processes take a file lock, build in a private temporary folder and
rename the result into place, so a second process (or a later run) only loads it.

Errors, one class each: an invalid spec is a :class:`~persistent_gemm.catalogue.ConfigError`;
a valid spec that is not built while ``PGEMM_JIT=0`` is a :class:`KernelNotBuiltError`; a
failed compile is a :class:`JitCompileError` carrying nvcc's message.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

from . import build_flags, codegen
from .archs import ARCHS
from .kernel_config import ConfigError, KernelConfig, as_config
from .library import Variant, fit_variants, lowering

__all__ = ["KernelNotBuiltError", "JitCompileError", "JIT_ENV", "CACHE_ENV", "cache_dir", "enabled", "ensure",
           "precompile", "ensure_many", "resolve", "runnable", "variants_for", "registered_configs", "cached_build"]

JIT_ENV = "PGEMM_JIT"
CACHE_ENV = "PGEMM_CACHE_DIR"
_ROOT = Path(__file__).resolve().parents[2]  # the source checkout (pip install -e)
_loaded: dict[str, object] = {}  # module name -> module: kept alive, and loaded once per process
_registered: set[str] = set()
_by_id: dict = {}  # id(KernelConfig) -> (that object, its canonical name): the op path's memo
_generation = -1
_register_lock = threading.Lock()


class KernelNotBuiltError(ValueError):
    """A valid config that is not built into this install, with the JIT turned off."""


class JitCompileError(RuntimeError):
    """Compiling a config failed; the message ends with the compiler's output."""


def enabled() -> bool:
    return os.environ.get(JIT_ENV, "1") != "0"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "persistent_gemm")


def resolve(config: Union[str, KernelConfig]) -> KernelConfig:
    """A config from its spec or canonical name; ConfigError names what is wrong."""
    try:
        return as_config(config)
    except ConfigError as e:
        from .catalogue import CATALOGUE, did_you_mean

        raise ConfigError(f"unknown config {config!r}: {e}{did_you_mean(config)}; the catalogue has "
                          f"{len(CATALOGUE)} configs (persistent_gemm.CATALOGUE, or python -m persistent_gemm "
                          "list)") from None


def registered_configs() -> set[str]:
    """Names of every config the dispatcher can run in this process (built or JIT-compiled)."""
    global _generation
    from ._extension import require_extension

    ext = require_extension()
    gen = ext.registry_generation()
    if gen != _generation:
        _registered.update(e["config"] for e in ext.built_kernels())  # only ever grows
        _generation = gen
    return _registered


_warned_cpu_config = False


def runnable(config: Union[str, KernelConfig, None], *, op: str, family: str, device=None) -> Optional[str]:
    """The op path's question: ``config`` as the canonical name the dispatcher knows, making it
    runnable first if it is not (:func:`ensure`). Before anything is compiled, the config must
    be of the op's dtype ``family`` and of the device's arch (C++ checks both again for names
    already registered). A registered name, or a spec object seen before, costs a set or dict
    lookup: registered kernels stay registered for the life of the process."""
    if config is None:
        return None
    global _warned_cpu_config
    if device is not None and getattr(device, "type", None) != "cuda" and not _warned_cpu_config:
        _warned_cpu_config = True
        import warnings

        warnings.warn(f"persistent_gemm.{op}: config= selects a GPU kernel; these operands are on {device}, "
                      "where the reference implementation runs (the config is checked; nothing is forced). "
                      "Said once per process.", stacklevel=4)
    if type(config) is str:
        if config in _registered:
            return config
    else:
        hit = _by_id.get(id(config))
        if hit is not None and hit[0] is config:
            return hit[1]
    registered_configs()  # refresh after registrations elsewhere
    if type(config) is str and config in _registered:
        return config
    cfg = resolve(config)
    if cfg.dtype != family:
        raise ValueError(f"{op}: config {cfg.name} is a {cfg.dtype} kernel; these operands need a {family} kernel")
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        cc = torch.cuda.get_device_capability(device)
        arch = next((a.name for a in ARCHS.values() if a.sm == cc), None)
        if arch != cfg.arch:
            raise ValueError(f"{op}: config {cfg.name} is an {cfg.arch} kernel; {device} is compute capability "
                             f"{cc[0]}.{cc[1]}" + (f" ({arch})" if arch else ", which no kernel family targets"))
    elif device is not None:
        # CPU tensors run the reference implementation: nothing to compile. A name C++ knows is
        # passed on (it checks the accumulation mode); another valid spec has nothing to force.
        from .catalogue import by_name


        return cfg.name if cfg.name in by_name() or cfg.name in registered_configs() else None
    name = ensure(cfg)
    if isinstance(config, KernelConfig):
        _by_id[id(config)] = (config, name)  # holds the object, so its id is not reused
    return name


def variants_for(config: KernelConfig) -> list[Variant]:
    """What a JIT module of ``config`` builds: its family's common fast paths (K-major operands,
    the usual output, each scale mode) and their fp32-output twins (the dispatcher casts fp32
    down once, e.g. to fp16). Other layouts run on K-major copies, as with built kernels."""
    low = lowering(config.arch, config.dtype)
    if low is None:
        raise ConfigError(f"{config.name}: no kernel lowering exists for {config.arch} {config.dtype}")
    chosen = list(low.tuned)
    for v in low.primary:
        if v.out == "fp32" and v not in chosen and any(v.scale == t.scale and v.tma_store == t.tma_store
                                                       for t in low.tuned):
            chosen.append(v)
    return fit_variants(config, chosen)


@functools.lru_cache(maxsize=None)  # runs nvcc: once per process, not once per config
def _versions() -> str:
    import torch

    home = build_flags.find_cuda_home()
    nvcc = build_flags.nvcc_version(home) if home else None
    try:
        from importlib.metadata import version

        cutlass = version("nvidia-cutlass")
    except Exception:  # a CUTLASS checkout: its headers are hashed below
        cutlass = "checkout"
    return f"nvcc={nvcc} torch={torch.__version__} cutlass={cutlass}"


@functools.lru_cache(maxsize=None)  # reads every header: once per process
def _headers_digest() -> str:
    h = hashlib.sha256()
    for base in (_ROOT / "include", _ROOT / "csrc"):
        for p in sorted(base.rglob("*")):
            if p.is_file() and p.suffix in (".h", ".hpp", ".cuh") and "generated" not in p.parts:
                h.update(str(p.relative_to(_ROOT)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def _module_name(config: KernelConfig, sources: Sequence[Path], cutlass: Path) -> str:
    h = hashlib.sha256()
    # The generated arch_limits.hpp is outside _headers_digest (it skips generated/): hash its text.
    for part in (config.name, _versions(), _headers_digest(), codegen.arch_limits_header(), str(cutlass),
                 *build_flags.NVCC_FLAGS, *build_flags.CXX_FLAGS, ARCHS[config.arch].gencode):
        h.update(part.encode())
    for p in sources:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return f"pgemm_jit_{codegen.ident(config.name)}_{h.hexdigest()[:16]}"


def _load(name: str, path: Path):
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _register(name: str, mod) -> None:
    from ._extension import require_extension

    with _register_lock:  # precompile's threads
        _loaded[name] = mod
        require_extension().register_arch(mod.arch_export())


def _compile(name: str, config: KernelConfig, sources: list[Path], build_dir: Path, cutlass: Path, home: Path):
    """Build and import the module in ``build_dir`` (torch's ninja build, our flags)."""
    load = build_flags.torch_cpp_extension(home).load
    try:
        return load(name=name, sources=[str(p) for p in sources], build_directory=str(build_dir),
                    extra_include_paths=build_flags.include_dirs(_ROOT, cutlass, home),
                    extra_cflags=list(build_flags.CXX_FLAGS),
                    extra_cuda_cflags=build_flags.nvcc_flags(ARCHS[config.arch].gencode), verbose=False)
    except Exception as e:  # torch raises RuntimeError with ninja's output (nvcc's messages)
        text = str(e)
        lines = [l for l in text.splitlines() if "error" in l.lower()]
        raise JitCompileError(f"compiling {config.name} failed:\n" + "\n".join(lines[:20]) +
                              f"\n--- compiler output (tail) ---\n{text[-4000:]}") from None


def cached_build(root: Path, name: str, build: Callable[[Path], Path]) -> tuple[Path, bool]:
    """``root/<name>.so``, built by ``build(tmp_dir) -> built .so`` if absent. One builder per
    name across processes (an exclusive ``flock`` on ``root/<name>.lock``; the others wait and
    then find it), each in its own temporary folder, published by an atomic rename: a reader
    sees the whole file or none. Returns (path, whether this call built it)."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}.so"
    if target.is_file():
        return target, False
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # built by another process while this one waited
            return target, False
        tmp = Path(tempfile.mkdtemp(prefix=f"build-{name[:40]}-", dir=root))
        try:
            built = build(tmp)
            os.replace(built, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target, True


def ensure(config: Union[str, KernelConfig], *, quiet: bool = False, allow_compile: bool = True,
           variants: Optional[Sequence[Variant]] = None) -> Optional[str]:
    """Make ``config`` runnable in this process and return its canonical name: nothing to do if
    it is built or already loaded; else load it from the cache, or compile it into the cache.
    ``allow_compile=False`` returns None instead of compiling. ``variants`` narrows what a new
    module builds (default :func:`variants_for`; it is part of the cache key)."""
    cfg = resolve(config)
    if cfg.name in registered_configs():
        return cfg.name
    why = cfg.kernel_rejection()
    if why:
        raise ConfigError(f"config {cfg.name} is a valid schedule but cannot be compiled: {why}")
    if not enabled():
        raise KernelNotBuiltError(
            f"config {cfg.name} is valid but not built into this install, and {JIT_ENV}=0 turns off compiling it "
            f"at first use (unset {JIT_ENV}, build it with PGEMM_KERNELS, or persistent_gemm.precompile([...]))")
    chosen = list(variants) if variants is not None else variants_for(cfg)
    home = build_flags.find_cuda_home()
    cutlass, why = build_flags.find_cutlass()
    if home is None:
        raise JitCompileError(f"compiling {cfg.name} needs a CUDA toolkit (nvcc); none found (set CUDA_HOME)")
    if cutlass is None:
        raise JitCompileError(f"compiling {cfg.name}: {why}")
    if not (_ROOT / "include" / "persistent_gemm").is_dir():
        raise JitCompileError(f"compiling {cfg.name} needs persistent_gemm's headers, which an editable install "
                              f"(pip install -e) has under {_ROOT / 'include'}; they are not there")
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="src-", dir=root))
    try:
        sources = codegen.jit_sources(staging, cfg, chosen)
        name = _module_name(cfg, sources, cutlass)
        if name not in _loaded:
            target = root / f"{name}.so"
            if not target.is_file() and not allow_compile:
                return None
            t0 = time.perf_counter()
            fresh = []  # the module this process built (already imported from its build folder)

            def build(tmp: Path) -> Path:
                if not quiet:
                    print(f"persistent_gemm: compiling {cfg.name} for {cfg.arch} ({len(chosen)} kernel variant(s)); "
                          f"about 1-3 minutes, once: cached in {root}", file=sys.stderr, flush=True)
                fresh.append(_compile(name, cfg, sources, tmp, cutlass, home))
                return tmp / f"{name}.so"

            target, built = cached_build(root, name, build)
            if built and not quiet:
                print(f"persistent_gemm: {cfg.name} compiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                      flush=True)
            _register(name, fresh[0] if fresh else _load(name, target))
        return cfg.name
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_many(configs: Iterable[Union[str, KernelConfig]], *, jobs: Optional[int] = None,
                quiet: bool = False) -> list[Union[str, Exception]]:
    """:func:`ensure` for several configs, ``jobs`` compiling at once (default: one per 8 cores);
    each result is the config's name or the exception it raised. Every spec is resolved first,
    so a bad one fails before anything compiles."""
    cfgs = list(dict.fromkeys(resolve(c) for c in configs))  # one compile per distinct spec
    cores = os.cpu_count() or 1
    jobs = max(1, cores // 8) if jobs is None else jobs
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")

    def one(cfg: KernelConfig):
        try:
            return ensure(cfg, quiet=quiet)
        except (ConfigError, KernelNotBuiltError, JitCompileError) as e:
            return e

    if jobs == 1 or len(cfgs) < 2:
        return [one(c) for c in cfgs]
    saved = os.environ.get("MAX_JOBS")
    if saved is None:  # share the cores between the concurrent ninja builds
        os.environ["MAX_JOBS"] = str(max(1, cores // min(jobs, len(cfgs))))
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, cfgs))
    finally:
        if saved is None:
            os.environ.pop("MAX_JOBS", None)


def precompile(configs: Iterable[Union[str, KernelConfig]], *, jobs: Optional[int] = None) -> list[str]:
    """Compile (or load from the cache) each config ahead of its first use, ``jobs`` at once
    (default: one per 8 cores); returns their names, or raises the first failure."""
    out = ensure_many(configs, jobs=jobs)
    for r in out:
        if isinstance(r, Exception):
            raise r
    return out
