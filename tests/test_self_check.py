"""The first-use self-check that guards kernels the project never ran on their hardware
(csrc/self_check.cpp, python/persistent_gemm/selfcheck.py). On the H200 it is pointed at the SM90
kernels (PGEMM_SELF_CHECK=all), in fresh processes since its settings are read once: a sound
kernel passes (checked in a child process, then from the cache), an injected fault is reported
naming the kernel and the fallback, an injected hang times out in the child and fails the kernel
while the caller's process goes on, and PGEMM_FALLBACK=torch runs the references."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import HAS_GPU, REPO, built_configs, error_bound

pytestmark = [
    pytest.mark.sm90,
    # The children's pg.mm(bf16) needs a built bf16 kernel (a PGEMM_KERNELS build may have none).
    pytest.mark.skipif(HAS_GPU and not built_configs("bf16", arch="sm90a"),
                       reason="no sm90a bf16 kernel built (PGEMM_KERNELS)"),
]

_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings, torch, persistent_gemm as pg
    sys.path.insert(0, sys.argv[1])  # tests/, for the suite's error measure
    from support.bounds import rel_err
    torch.manual_seed(0)
    a = torch.randn(300, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(520, 264, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    out = {"peer_err": rel_err(torch.mm(a, b), ref)}  # cuBLAS on the same inputs: the bound's peer
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for attempt in range(2):
            try:
                c = pg.mm(a, b)
                out[f"err{attempt}"] = rel_err(c, ref)
                out[f"bitwise_ref{attempt}"] = bool(torch.equal(c, torch.mm(a.float(), b.float()).to(torch.bfloat16)))
            except RuntimeError as e:
                out[f"raised{attempt}"] = str(e)
        out["warnings"] = [str(x.message) for x in w]
    out["results"] = [list(r) for r in pg._C.self_check_results()]
    out["self_checked"] = pg._C.arch_info()["sm90a"]["self_checked"]
    print(json.dumps(out))
    """
)


def _run(**env):
    full = {**os.environ, "PGEMM_SELF_CHECK_CACHE": "0", **env}
    for k in ("PGEMM_SELF_CHECK", "PGEMM_FALLBACK", "PGEMM_SELF_CHECK_INJECT_FAULT", "PGEMM_SELF_CHECK_INJECT_HANG",
              "PGEMM_SELF_CHECK_TIMEOUT", "PGEMM_SELF_CHECK_CHILD"):
        if k not in env:
            full.pop(k, None)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, str(REPO / "tests")], capture_output=True, text=True, env=full,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _accurate(out, attempt=0) -> bool:
    """The child's pg.mm within error_bound of torch.mm's error against float64, same inputs."""
    return out[f"err{attempt}"] <= error_bound(out["peer_err"])


def test_default_does_not_check_validated_arch():
    out = _run()
    assert out["results"] == [] and not out["self_checked"]
    assert _accurate(out), out


def test_sound_kernel_passes_its_self_check():
    out = _run(PGEMM_SELF_CHECK="all")
    assert out["self_checked"]
    assert len(out["results"]) >= 1 and all(r[1] for r in out["results"]), out["results"]
    assert _accurate(out, 0) and _accurate(out, 1), out
    # sm90a is validated on hardware: no "not validated" warning for it
    assert not any("not been run on hardware" in w for w in out["warnings"])


def test_disagreement_raises_naming_kernel_and_fallback():
    out = _run(PGEMM_SELF_CHECK="all", PGEMM_SELF_CHECK_INJECT_FAULT="1")
    for attempt in (0, 1):  # refused now and for the rest of the process
        msg = out[f"raised{attempt}"]
        assert "self-check of kernel sm90a_bf16_" in msg and "PGEMM_FALLBACK=torch" in msg, msg
        assert "disagrees with the reference" in msg and "M = " in msg, msg
    (config, passed, report), = out["results"]
    assert not passed and config in report


def test_fallback_runs_the_reference():
    out = _run(PGEMM_SELF_CHECK="all", PGEMM_FALLBACK="torch")
    assert out["results"] == []  # no kernel of ours ran
    assert out["bitwise_ref0"], "the fallback is the fp32 reference, rounded once"


def test_verdict_is_cached_per_build(tmp_path):
    cache = {"PGEMM_CACHE_DIR": str(tmp_path), "PGEMM_SELF_CHECK_CACHE": "1", "PGEMM_SELF_CHECK": "all"}
    first = _run(**cache)
    assert first["results"] and all(r[1] for r in first["results"]), first["results"]
    assert list((tmp_path / "selfcheck").glob("sm90a-*.json"))
    # A child could not start and check in 1 ms: this pass can only come from the cache.
    again = _run(**cache, PGEMM_SELF_CHECK_TIMEOUT="0.001")
    assert all(r[1] for r in again["results"]) and _accurate(again), again


def test_hang_in_the_child_fails_the_kernel_not_the_process():
    t0 = time.monotonic()
    out = _run(PGEMM_SELF_CHECK="all", PGEMM_SELF_CHECK_INJECT_HANG="1", PGEMM_SELF_CHECK_TIMEOUT="20")
    assert time.monotonic() - t0 < 120
    for attempt in (0, 1):  # refused now and for the rest of the process (no second child)
        msg = out[f"raised{attempt}"]
        assert "self-check of kernel sm90a_bf16_" in msg and "did not finish within 20 s" in msg, msg
        assert "PGEMM_FALLBACK=torch" in msg, msg
