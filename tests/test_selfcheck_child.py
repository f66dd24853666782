"""The out-of-process self-check's parent logic (python/persistent_gemm/selfcheck.py) on the CPU:
children that answer, hang, crash or skip, stood in for by small Python scripts; the verdict
cache's round trip. The real check in a child runs on the H200 (tests/test_self_check.py)."""

import json
import sys

import pytest

from persistent_gemm import selfcheck


def _script(behaviour: dict):
    """A child command: for each config, by behaviour[config]: "pass", "fail", "hang", "crash",
    "skip" (no verdict, clean exit)."""
    def command(arch, device, configs):
        lines = ["import json, sys, time"]
        for c in configs:
            what = behaviour[c]
            lines.append(f"print({selfcheck._START + c!r}, flush=True)")
            if what == "hang":
                lines.append("time.sleep(60)")
            elif what == "crash":
                lines.append("sys.stderr.write('Segmentation fault (core dumped)\\n'); sys.exit(139)")
            elif what == "skip":
                lines.append("sys.exit(0)")
            else:
                v = json.dumps([c, what == "pass", "" if what == "pass" else f"{c} disagrees"])
                lines.append(f"print({selfcheck._VERDICT + v!r}, flush=True)")
        return [sys.executable, "-c", "\n".join(lines)]
    return command


def _by_config(verdicts):
    return {c: (ok, report) for c, ok, report in verdicts}


def test_every_answer_is_kept():
    got = _by_config(selfcheck.check_in_child("sm100a", 0, ["a", "b"], timeout=30,
                                              command=_script({"a": "pass", "b": "fail"})))
    assert got == {"a": (True, ""), "b": (False, "b disagrees")}


def test_a_hang_fails_its_kernel_and_the_rest_are_still_checked():
    got = _by_config(selfcheck.check_in_child("sm100a", 0, ["a", "b", "c"], timeout=3,
                                              command=_script({"a": "pass", "b": "hang", "c": "pass"})))
    assert got["a"] == (True, "") and got["c"] == (True, "")
    ok, report = got["b"]
    assert not ok and "kernel b" in report and "did not finish within 3 s" in report and "PGEMM_FALLBACK" in report


def test_a_crash_fails_its_kernel_with_the_childs_last_words():
    got = _by_config(selfcheck.check_in_child("sm100a", 0, ["a", "b", "c"], timeout=30,
                                              command=_script({"a": "crash", "b": "pass", "c": "fail"})))
    ok, report = got["a"]
    assert not ok and "exited with code 139" in report and "Segmentation fault" in report
    assert got["b"] == (True, "") and got["c"] == (False, "c disagrees")


def test_a_child_that_skips_cannot_loop_forever():
    got = _by_config(selfcheck.check_in_child("sm100a", 0, ["a", "b"], timeout=30,
                                              command=_script({"a": "skip", "b": "skip"})))
    assert not got["a"][0] and not got["b"][0] and "without a verdict" in got["a"][1]


def test_timeout_env_is_checked(monkeypatch):
    monkeypatch.setenv(selfcheck.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="PGEMM_SELF_CHECK_TIMEOUT must be a number of seconds"):
        selfcheck.timeout_s()
    monkeypatch.setenv(selfcheck.TIMEOUT_ENV, "-1")
    with pytest.raises(ValueError, match="must be > 0"):
        selfcheck.timeout_s()
    monkeypatch.setenv(selfcheck.TIMEOUT_ENV, "90")
    assert selfcheck.timeout_s() == 90.0


def test_cache_round_trip(monkeypatch, tmp_path):
    from persistent_gemm import jit

    monkeypatch.setattr(jit, "cache_dir", lambda: str(tmp_path))
    assert selfcheck._read_cache("k") == {}
    selfcheck._write_cache("k", [("a", True, ""), ("b", False, "why")])
    selfcheck._write_cache("k", [("c", True, "")])  # merged, not replaced
    assert selfcheck._read_cache("k") == {"a": (True, ""), "b": (False, "why"), "c": (True, "")}
    assert not list((tmp_path / "selfcheck").glob(".tmp-*"))  # written by rename
    (tmp_path / "selfcheck" / "k.json").write_text("{not json")
    assert selfcheck._read_cache("k") == {}  # a damaged cache is a miss, not an error


def test_verdicts_check_only_what_the_cache_lacks(monkeypatch, tmp_path):
    from persistent_gemm import jit

    monkeypatch.setattr(jit, "cache_dir", lambda: str(tmp_path))
    monkeypatch.setattr(selfcheck, "cache_key", lambda arch, device: f"{arch}-test")
    asked = []

    def fake_child(arch, device, configs, **kw):
        asked.append(list(configs))
        return [(c, c != "bad", "" if c != "bad" else "bad disagrees") for c in configs]

    monkeypatch.setattr(selfcheck, "check_in_child", fake_child)
    first = selfcheck.verdicts("sm100a", 0, ["a", "bad"])
    assert first == [("a", True, ""), ("bad", False, "bad disagrees")] and asked == [["a", "bad"]]
    again = selfcheck.verdicts("sm100a", 0, ["bad", "c", "a"])
    assert asked[-1] == ["c"] and [v[0] for v in again] == ["bad", "c", "a"] and not again[0][1]
    monkeypatch.setenv("PGEMM_SELF_CHECK_INJECT_FAULT", "1")  # injected faults are never cached
    selfcheck.verdicts("sm100a", 0, ["a"])
    assert asked[-1] == ["a"]
