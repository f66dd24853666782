"""The first-use self-check that guards kernels the project never ran on their hardware
(csrc/self_check.cpp). On the H200 it is pointed at the SM90 kernels (PGEMM_SELF_CHECK=all), in
fresh processes since its settings are read once: a sound kernel passes, an injected fault is
reported naming the kernel and the fallback, and PGEMM_FALLBACK=torch runs the references."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.sm90

_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings, torch, persistent_gemm as pg
    torch.manual_seed(0)
    a = torch.randn(300, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(520, 264, device="cuda", dtype=torch.bfloat16)
    out = {}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for attempt in range(2):
            try:
                c = pg.mm(a, b)
                ref = (a.double() @ b.double())
                out[f"err{attempt}"] = ((c.double() - ref).abs().max() / ref.abs().max()).item()
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
    full = {**os.environ, **env}
    for k in ("PGEMM_SELF_CHECK", "PGEMM_FALLBACK", "PGEMM_SELF_CHECK_INJECT_FAULT"):
        if k not in env:
            full.pop(k, None)
    p = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=full, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_default_does_not_check_validated_arch():
    out = _run()
    assert out["results"] == [] and not out["self_checked"]
    assert out["err0"] < 1e-2


def test_sound_kernel_passes_its_self_check():
    out = _run(PGEMM_SELF_CHECK="all")
    assert out["self_checked"]
    assert len(out["results"]) >= 1 and all(r[1] for r in out["results"]), out["results"]
    assert out["err0"] < 1e-2 and out["err1"] < 1e-2
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
