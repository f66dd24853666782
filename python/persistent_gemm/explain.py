"""What the dispatcher would run for a problem, and why (DeepGEMM-style printable decision).

The decision itself is made in C++ (``csrc/heuristics.cpp``), the same code the ops call; this
only asks it about a problem description, so it works without a GPU for any built arch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class Decision:
    config: str
    tma_store: bool
    copy_a: bool
    copy_b: bool
    pad_d: bool
    pad_m: bool = False  # A copied into whole M-tiles, D narrowed back (TMA zero-fill is slow)
    estimate_us: float = 0.0  # the cost model's estimate for the chosen kernel (H200 constants)
    log: list = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join([f"chosen: {self.config}", *(f"  {line}" for line in self.log)])


def explain(M: int, N: int, K: int, *, dtype: str = "bf16", out_dtype: Optional[str] = None,
            layout: str = "rc", scale: str = "none", arch: str = "sm90a", sm_count: int = 132,
            config: Optional[str] = None) -> Decision:
    """The kernel ``mm``/``scaled_mm`` would pick for an (M, N, K) problem.

    ``layout`` is two letters, for a (M, K) and b (K, N): ``r`` row-major, ``c`` column-major
    (``"rc"``: both K-major, the fast path). ``scale``: ``"none"`` (mm), ``"tensor"`` or ``"row"``
    (scaled_mm, dtype ``"e4m3"``). ``out_dtype`` defaults to the input dtype for mm, bf16 for fp8.

    >>> print(explain(128, 8192, 8192))            # doctest: +SKIP
    chosen: sm90a_bf16_128x128x64_c1x2_sw8_row_pp
      ...
    """
    from . import require_extension

    if len(layout) != 2 or set(layout) - {"r", "c"}:
        raise ValueError(f"layout must be two letters from 'r'/'c' (a then b), got {layout!r}")
    out = out_dtype or ("bf16" if dtype == "e4m3" else dtype)
    d = require_extension().explain(arch, M, N, K, dtype, out, a_k_major=layout[0] == "r",
                                    b_k_major=layout[1] == "c", scale=scale, sm_count=sm_count, config=config)
    return Decision(d["config"], d["tma_store"], d["copy_a"], d["copy_b"], d["pad_d"], d["pad_m"], d["estimate_us"],
                    list(d["log"]))
