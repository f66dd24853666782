"""The test harness shared by every test file.

* Markers ``gpu``, ``sm90``, ``sm100``: ``gpu`` tests skip without a CUDA device and the built
  extension; ``sm90``/``sm100`` tests also skip unless the device is compute capability 9.0/10.0.
  Test files only mark (``pytestmark = pytest.mark.gpu``); the skipping happens here.
* Error measures: :func:`rel_err` against a float64 reference and :func:`error_bound`, the
  FlashAttention-3 rule "our error <= 2x the peer's error + a small floor", the peer being
  torch on the same inputs (or, on CPU, the float64 result rounded to the output dtype).
* Operand factories that never produce zeros (a zero hides a skipped tile or a wrong scale).
* :func:`sample_inputs`: representative valid inputs per op, shared by the CPU and GPU suites.
* :func:`built_configs` / :func:`requires_config`: what the (possibly narrowed) build holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/support, for every test file

from support.bounds import *  # noqa: E402,F401,F403
from support.build import *  # noqa: E402,F401,F403
from support.common import *  # noqa: E402,F401,F403
from support.common import _ARCH_MARKS  # noqa: E402
from support.operands import *  # noqa: E402,F401,F403
from support.samples import *  # noqa: E402,F401,F403


# -- markers --------------------------------------------------------------------------------------
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and the built extension (skipped otherwise)")
    config.addinivalue_line("markers", "sm90: needs an SM90 GPU (compute capability 9.0); implies gpu")
    config.addinivalue_line("markers", "sm100: needs an SM100 GPU (compute capability 10.0); implies gpu")


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU and the built persistent_gemm extension")
    for item in items:
        arch_marks = [m for m in _ARCH_MARKS if item.get_closest_marker(m)]
        if (item.get_closest_marker("gpu") or arch_marks) and not HAS_GPU:
            item.add_marker(no_gpu)
            continue
        for m in arch_marks:
            if CAPABILITY != _ARCH_MARKS[m]:
                item.add_marker(pytest.mark.skip(reason=f"needs compute capability {_ARCH_MARKS[m]}, "
                                                        f"this device is {CAPABILITY}"))
