"""The first-use self-check of kernels this project could not run on their hardware (sm100a
today), out of process: a hang or a fault while checking a kernel fails that kernel, not the
caller's process.

The dispatcher (``csrc/self_check.cpp``) guards an arch module whose table is not validated on
hardware. On the first use of one of its kernels in a process it asks the runner registered
here (:func:`install`) for a verdict; the runner answers from the cache or runs
:func:`check_in_child`: ``python -m persistent_gemm.selfcheck --child`` with a timeout, which
checks the kernel in that process and prints its verdict. A child that times out or dies fails
the kernel it was checking (given several, a new child goes on with the rest). Verdicts are
cached per (GPU, driver, build) in the JIT cache folder (``<cache>/selfcheck/<key>.json``,
written by atomic rename).

``python -m persistent_gemm selfcheck`` runs the same check on demand and prints the verdicts.

Environment: ``PGEMM_SELF_CHECK`` (``auto`` | ``all`` | ``off``, csrc/self_check.h),
``PGEMM_SELF_CHECK_TIMEOUT`` (seconds per child, default 600), ``PGEMM_SELF_CHECK_CACHE=0``
(neither read nor write the cache). Inside the child, ``PGEMM_SELF_CHECK_CHILD=1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

TIMEOUT_ENV = "PGEMM_SELF_CHECK_TIMEOUT"
CACHE_ENV = "PGEMM_SELF_CHECK_CACHE"
CHILD_ENV = "PGEMM_SELF_CHECK_CHILD"
DEFAULT_TIMEOUT_S = 600.0
#: A verdict: (config, passed, report); the report says why it failed ("" when it passed).
Verdict = tuple

_START, _VERDICT = "selfcheck-start ", "selfcheck-verdict "


def timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be > 0 seconds, got {raw!r}")
    return value


def _child_command(arch: str, device: int, configs: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "persistent_gemm.selfcheck", "--child", "--arch", arch, "--device", str(device),
            *configs]


def check_in_child(arch: str, device: int, configs: Sequence[str], *, timeout: Optional[float] = None,
                   command: Callable[[str, int, Sequence[str]], list] = _child_command) -> list[Verdict]:
    """Verdicts for ``configs`` of ``arch`` on ``device``, each checked in a child process: a child
    that exceeds ``timeout`` seconds or dies fails the config it was checking, and the rest go
    to a new child. ``command`` builds a child's argv (tests substitute their own)."""
    timeout = timeout_s() if timeout is None else timeout
    env = dict(os.environ, **{CHILD_ENV: "1"})
    left, out = list(configs), []
    while left:
        got: dict[str, Verdict] = {}
        current = None
        try:
            run = subprocess.run(command(arch, device, left), capture_output=True, text=True, timeout=timeout, env=env)
            stdout, why = run.stdout, (f"the self-check child process exited with code {run.returncode}"
                                       if run.returncode else "")
            tail = run.stderr.strip().splitlines()[-1:] if run.returncode else []
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            why, tail = f"the self-check child process did not finish within {timeout:g} s (a hang?)", []
        for line in stdout.splitlines():
            if line.startswith(_START):
                current = line[len(_START):].strip()
            elif line.startswith(_VERDICT):
                config, passed, report = json.loads(line[len(_VERDICT):])
                got[config] = (config, bool(passed), report)
                current = None
        out += [got[c] for c in left if c in got]
        left = [c for c in left if c not in got]
        if not left:
            break
        if not why:  # a clean exit that skipped configs: say so rather than loop
            why = "the self-check child process exited without a verdict"
        culprit = current if current in left else left[0]
        detail = f" ({tail[0]})" if tail else ""
        out.append((culprit, False, f"the self-check of kernel {culprit} on {arch} failed: {why}{detail}. "
                                    f"Set PGEMM_FALLBACK=torch to run persistent_gemm's ops with their reference "
                                    f"implementations on this GPU, or pass config= to force another kernel; please "
                                    f"report this failure."))
        left.remove(culprit)
    return out


def _driver_version() -> str:
    """The NVIDIA driver's version: torch's private getter where it exists, else the kernel
    module's banner, else "unknown" (the key then changes with the build only)."""
    import torch

    getter = getattr(torch._C, "_cuda_getDriverVersion", None)
    if getter is not None:
        try:
            return str(getter())
        except Exception:
            pass
    try:
        return Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def cache_key(arch: str, device: int) -> str:
    """(GPU name, compute capability, driver, CUDA, the extension's and the arch module's builds)
    as a file stem."""
    import torch

    from . import _C

    prop = torch.cuda.get_device_properties(device)
    parts = [prop.name, f"{prop.major}.{prop.minor}", _driver_version(), torch.version.cuda or ""]
    for mod in (_C, sys.modules.get(f"{__package__}._C_{arch}")):
        path = Path(getattr(mod, "__file__", "") or "")
        if path.is_file():
            st = path.stat()
            parts.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    return f"{arch}-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _cache_path(key: str) -> Path:
    from .jit import cache_dir

    return Path(cache_dir()) / "selfcheck" / f"{key}.json"


def _read_cache(key: str) -> dict:
    """{config: (passed, report)} cached under ``key``; empty when absent or unreadable."""
    try:
        raw = json.loads(_cache_path(key).read_text())["verdicts"]
        return {c: (bool(ok), str(report)) for c, ok, report in raw}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_cache(key: str, verdicts: list[Verdict]) -> None:
    """Merge ``verdicts`` into the cache under ``key`` (a concurrent writer may win the rename:
    then a verdict is checked again later, nothing worse)."""
    path = _cache_path(key)
    merged = _read_cache(key)
    merged.update({c: (ok, report) for c, ok, report in verdicts})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"verdicts": [[c, ok, report] for c, (ok, report) in sorted(merged.items())]}, f)
        os.replace(tmp, path)  # readers see the old file or the whole new one
    except OSError:
        pass  # an unwritable cache costs a re-check next time, nothing else


def _caching(use_cache: Optional[bool]) -> bool:
    if use_cache is not None:
        return use_cache
    injected = any(os.environ.get(v) == "1" for v in ("PGEMM_SELF_CHECK_INJECT_FAULT", "PGEMM_SELF_CHECK_INJECT_HANG"))
    return os.environ.get(CACHE_ENV, "1") != "0" and not injected  # test injections are never remembered


def verdicts(arch: str, device: int, configs: Sequence[str], *, use_cache: Optional[bool] = None) -> list[Verdict]:
    """Verdicts on ``configs`` of ``arch`` on ``device``: cached, or checked in child processes."""
    cache = _caching(use_cache)
    key = cache_key(arch, device) if cache else ""
    known = _read_cache(key) if cache else {}
    fresh = check_in_child(arch, device, [c for c in configs if c not in known])
    if cache and fresh:
        _write_cache(key, fresh)
    by_config = {**{c: (c, *known[c]) for c in configs if c in known}, **{v[0]: v for v in fresh}}
    return [by_config[c] for c in configs]


def install() -> None:
    """Register the out-of-process runner with the dispatcher (not inside a child: there the
    check runs in-process, which is the child's job)."""
    from . import _C

    if os.environ.get(CHILD_ENV) == "1" or not hasattr(_C, "set_self_check_runner"):
        return
    _C.set_self_check_runner(lambda arch, config, device: verdicts(arch, device, [config])[0][1:])


def _child_main(arch: str, device: int, configs: Sequence[str]) -> int:
    """The child: check each config in this process, a start line before and a verdict after."""
    from ._extension import require_extension  # its import registers the arch modules

    ext = require_extension()
    for config in configs:
        print(_START + config, flush=True)
        passed, report = ext.self_check_run(config, device)
        print(_VERDICT + json.dumps([config, bool(passed), report]), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m persistent_gemm.selfcheck")
    ap.add_argument("--child", action="store_true", help="internal: check in this process")
    ap.add_argument("--arch", required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("configs", nargs="*")
    args = ap.parse_args(argv)
    if args.child:
        return _child_main(args.arch, args.device, args.configs)
    ap.error("use python -m persistent_gemm selfcheck")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
