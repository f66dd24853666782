"""What the dispatcher would run for a problem, and why (DeepGEMM-style printable decision).

The decision itself is made in C++ (``csrc/heuristics.cpp``), the same code the ops call; this
only asks it about a problem description, so it works without a GPU for any built arch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .archs import ARCH_NAMES
from .archs import ARCHS as ARCH_SPECS
from .config_fields import MX_DTYPES, WEIGHT_ONLY_DTYPES
from .kernel_config import KernelConfig
from .library import canonical_family
from .schedule import check_int

#: What :func:`explain` accepts (the C++ side knows the same names).
ARCHS = ARCH_NAMES
#: MX and weight-only MX: e8m0 1x32 block scales, no `scale` argument
DTYPES = ("bf16", "fp16", "e4m3") + MX_DTYPES + WEIGHT_ONLY_DTYPES
OUT_DTYPES = ("bf16", "fp16", "fp32")
SCALES = ("none", "tensor", "row")
#: The kernels index tiles and elements with 32-bit extents (the ops refuse M, N, K >= 2^31).
MAX_EXTENT = 2**31 - 1
#: :attr:`Decision.config` where no built kernel fits: weight_only_mm's exact reference runs, or
#: ("none") the op refuses the problem on that arch's GPU (CPU tensors run the op's reference).
NO_KERNEL = ("reference", "none")


@dataclass(frozen=True)
class Decision:
    config: str
    tma_store: bool
    copy_a: bool
    copy_b: bool
    pad_d: bool
    pad_m: bool = False  # A copied into whole M-tiles, D narrowed back (TMA zero-fill is slow)
    estimate_us: float = 0.0  # the cost model's estimate for the chosen kernel (the arch's constants)
    log: list = field(default_factory=list)
    fast_accum: bool = False  # fp8 partial sums kept in the MMA's accumulator (use_fast_accum=True)
    swap_ab: bool = False  # the kernel computes D^T with the weight on the MMA's M side (MX decode, FP8 x FP4)
    sm_count: int = 0  # the SMs the estimate assumed
    cost_model_measured: bool = True  # False: the arch's constants are published peaks, not fitted (sm100a)
    tuned: bool = False  # persistent_gemm.tune's winner for this problem decided, not the cost model
    problem: tuple = ()  # (M, N, K) as asked

    def __str__(self) -> str:
        return "\n".join([f"chosen: {self.config}", *(f"  {line}" for line in self.log)])

    def render(self, path, *, highlight=None):
        """Draw the chosen config's schedule over this problem to ``path`` (see
        :func:`persistent_gemm.tools.picture.plot`; a swap-AB kernel's grid is over (N, M))."""
        if self.config in NO_KERNEL:
            raise ValueError(f"no schedule to draw: no kernel was chosen ({self.log[0]})")
        from .schedule import default_workers
        from .tools.picture import plot  # a tool, imported only to draw: the library loads without it

        cfg = KernelConfig.from_name(self.config)
        M, N, K = self.problem
        gm, gn = (N, M) if self.swap_ab else (M, N)
        return plot(cfg, gm, gn, path, workers=default_workers(self.sm_count, cfg.schedule), highlight=highlight,
                    sm_count=self.sm_count, K=K)


def _check_choice(name: str, value, choices: tuple) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(choices)}; got {value!r} ({type(value).__name__})")
    if value not in choices:
        raise ValueError(f"{name} must be {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}")
    return value


def _check_args(M, N, K, dtype, out_dtype, layout, scale, arch, sm_count, config, use_fast_accum):
    """Everything :func:`explain` is given, checked before it reaches C++: there a zero extent
    is an integer division by zero (SIGFPE, the whole interpreter gone), not an exception."""
    M, N, K = (check_int(n, v, minimum=1, maximum=MAX_EXTENT) for n, v in (("M", M), ("N", N), ("K", K)))
    if sm_count is not None:
        sm_count = check_int("sm_count", sm_count, minimum=1, maximum=MAX_EXTENT)  # a C int there
    _check_choice("dtype", dtype, DTYPES)
    if out_dtype is not None:
        _check_choice("out_dtype", out_dtype, OUT_DTYPES)
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str of two letters from 'r'/'c', got {layout!r} ({type(layout).__name__})")
    if len(layout) != 2 or set(layout) - {"r", "c"}:
        raise ValueError(f"layout must be two letters from 'r'/'c' (a then b), got {layout!r}")
    _check_choice("scale", scale, SCALES)
    if dtype == "e4m3" and scale == "none":
        raise ValueError("scale must be 'tensor' or 'row' for dtype 'e4m3' (scaled_mm), got 'none'")
    if dtype != "e4m3" and scale != "none":
        what = ("the MX ops carry their e8m0 block scales" if dtype in MX_DTYPES + WEIGHT_ONLY_DTYPES
                else "mm has no scales")
        raise ValueError(f"scale must be 'none' for dtype {dtype!r} ({what}), got {scale!r}")
    if dtype in MX_DTYPES + WEIGHT_ONLY_DTYPES and layout != "rc":
        raise ValueError(f"layout must be 'rc' for dtype {dtype!r} (the MX ops take a row-major a and a column-major b), "
                         f"got {layout!r}")
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a str, one of {', '.join(ARCHS)}; got {arch!r} ({type(arch).__name__})")
    if arch not in ARCHS:
        # Worded as the C++ side words an arch whose module is not built.
        raise ValueError(f"arch must be {' or '.join(ARCHS)}: no kernel module for arch {arch!r} exists")
    if config is not None and not isinstance(config, (str, KernelConfig)):
        raise TypeError(f"config must be a canonical config name (str), a KernelConfig or None, got {config!r} "
                        f"({type(config).__name__})")
    if not isinstance(use_fast_accum, bool):
        raise TypeError(f"use_fast_accum must be a bool, got {use_fast_accum!r} ({type(use_fast_accum).__name__})")
    if use_fast_accum and dtype != "e4m3":
        raise ValueError(f"use_fast_accum=True applies to dtype 'e4m3' (scaled_mm) only, got dtype {dtype!r}")
    return M, N, K, sm_count


def _device_defaults(arch, sm_count):
    """explain() about the GPU it runs on unless told otherwise: the current device's arch and
    SM count where that arch's module is built; without one, sm90a at its reference part."""
    if arch is not None and not isinstance(arch, str):
        return arch, sm_count  # _check_args names the bad type
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            here = next((a.name for a in ARCH_SPECS.values() if a.sm == (major, minor)), None)
            if here is not None and (arch is None or arch == here):
                from ._extension import built_archs

                if here in built_archs():
                    arch = here
                    if sm_count is None:
                        sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    except Exception:  # no usable CUDA: the reference part
        pass
    return (arch or "sm90a"), sm_count


def explain(M: int, N: int, K: int, *, dtype: str = "bf16", out_dtype: Optional[str] = None,
            layout: str = "rc", scale: str = "none", arch: Optional[str] = None, sm_count: Optional[int] = None,
            config=None, use_fast_accum: bool = False, render=None, groups: Optional[int] = None) -> Decision:
    """The kernel an op would run for an (M, N, K) problem on a GPU, and why.

    ``M``, ``N``, ``K``: positive ints below 2^31. ``dtype`` names the op by its operands:
    ``"bf16"``, ``"fp16"`` (mm), ``"e4m3"`` (scaled_mm), ``"mxfp8"`` (mxfp8_mm), ``"e4m3xe2m1"``
    (fp8_fp4_mm: e4m3 activations x MXFP4 weights), ``"bf16xe4m3"`` or ``"bf16xe2m1"`` (weight-only:
    ``pg.mm`` of bf16 activations and an MXFP8 / MXFP4 prepared weight); the op's name, the pg.nn
    format (``"fp8_rowwise"``, ``"fp8_fp4"``, ``"mxfp4_weight_only"``), ``"mxfp4"`` (fp8_fp4_mm's
    operands; the weight-only use of the same weight is ``"bf16xe2m1"``) and torch dtypes are
    accepted too. The op's own rules on the problem apply (K a multiple of 32 for e2m1 weights).
    Where no built kernel fits, :attr:`Decision.config` is ``"reference"`` (weight-only: the op runs
    its exact reference) or ``"none"`` (the op refuses the problem on that GPU; a build without
    kernels, ``PGEMM_KERNELS='^none$'``, says so here), and the log says why. On a machine without
    a CUDA GPU the decision is still the GPU's (the ops run their CPU references there): its last
    log line says so. ``out_dtype``: ``"bf16"``, ``"fp16"`` or ``"fp32"``; defaults to the
    input dtype for mm, bf16 for fp8. ``layout`` is two letters, for a (M, K) and b (K, N):
    ``r`` row-major, ``c`` column-major (``"rc"``: both K-major, the fast path). ``scale``:
    ``"none"`` for mm; ``"tensor"`` or ``"row"`` for scaled_mm (dtype ``"e4m3"`` needs one of
    them). ``arch``: ``"sm90a"`` or ``"sm100a"`` (its kernel module must be built); None: the
    current CUDA device's arch when its module is built, else ``"sm90a"``. ``sm_count``: SMs of
    the target GPU; None takes the current device's when it is that arch, else the arch's
    reference part (archs.py: 132 for an H200, 148 for a B200). The decision says which it used
    (:attr:`Decision.sm_count`). The sm100a cost model uses published B200 peaks, not measurements
    (:attr:`Decision.cost_model_measured`). ``config``: a canonical config name or a
    :class:`KernelConfig` to force (one that is not built is compiled first, as the ops do), or
    None to let the cost model choose; a winner of :func:`persistent_gemm.tune` for this problem
    decides before the cost model (:attr:`Decision.tuned`). ``render``: a path; the chosen
    config's schedule over this problem is drawn there (:func:`persistent_gemm.tools.picture.plot`).

    ``use_fast_accum`` has torch._scaled_mm's meaning and applies to ``"e4m3"`` only: False
    (the default) picks kernels that promote FP8 partial sums into fp32 registers every few
    k-blocks (accurate for long K); True allows the fast-accumulation kernels, which keep the
    sums in the MMA's own accumulator over the whole K loop. The choice is
    :attr:`Decision.fast_accum`.

    ``groups``: a grouped problem (:func:`persistent_gemm.grouped_mm`, MoE experts): ``M`` rows
    sorted over ``groups`` experts of an (N, K) weight each, their split known only on the device;
    the grouped kernels are chosen from the expected rows per expert (the MX families only).

    Bad arguments raise TypeError (wrong type; a bool is not an int here) or ValueError (out of
    range, unknown name), each naming the argument and the value.

    >>> print(explain(128, 8192, 8192))            # doctest: +SKIP
    chosen: sm90a_bf16_128x128x64_c1x2_sw8_row_pp
      ...
    """
    from ._extension import require_extension

    import torch

    from .library import ELEMENTS

    dtype = canonical_family(dtype)  # "fp8_fp4", "mxfp8_mm", torch.bfloat16, ... (catalogue.FAMILY_ALIASES)
    if isinstance(out_dtype, torch.dtype):
        out_dtype = next((n for n in OUT_DTYPES if getattr(torch, ELEMENTS[n].torch) == out_dtype), out_dtype)
    arch, sm_count = _device_defaults(arch, sm_count)
    M, N, K, sm_count = _check_args(M, N, K, dtype, out_dtype, layout, scale, arch, sm_count, config,
                                    use_fast_accum)
    out = out_dtype or ("bf16" if dtype in ("e4m3",) + MX_DTYPES + WEIGHT_ONLY_DTYPES else dtype)
    ext = require_extension()
    if config is not None:  # as the ops take it: a registered name as is, else checked, then compiled
        from . import jit

        config = jit.runnable(config, op="explain", family=dtype)
    if groups is not None:
        groups = check_int("groups", groups, 1, (1 << 31) - 1)
    d = ext.explain(arch, M, N, K, dtype, out, a_k_major=layout[0] == "r",
                                    b_k_major=layout[1] == "c", scale=scale, sm_count=sm_count or 0, config=config,
                                    fast_accum=use_fast_accum, groups=groups or 0)
    log, sms = list(d["log"]), int(d.get("sm_count", sm_count or ARCH_SPECS[arch].sm_count))
    if not torch.cuda.is_available():
        log.append(f"no CUDA GPU here: the ops run their CPU references on this machine; this is the decision for "
                   f"an {arch} GPU with {sms} SMs" + (" (the arch's reference part)" if sm_count is None else ""))
    dec = Decision(d["config"], d["tma_store"], d["copy_a"], d["copy_b"], d["pad_d"], d["pad_m"], d["estimate_us"],
                   log, bool(d.get("fast_accum", False)), bool(d.get("swap_ab", False)), sms,
                   bool(d.get("cost_model_measured", ARCH_SPECS[arch].cost.measured)), bool(d.get("tuned", False)),
                   (M, N, K))
    if render is not None:
        dec.render(render)
    return dec


#: bench_mm.py's ops as explain() spells their problems (its OPS table: input kind and accumulation).
SWEEP_OPS = {"mm": dict(dtype="bf16", scale="none"),
             "scaled_mm": dict(dtype="e4m3", scale="tensor", use_fast_accum=False),
             "scaled_mm_fast": dict(dtype="e4m3", scale="tensor", use_fast_accum=True)}


def choice_table(sweep_rows, *, sm_count: int, arch: str = "sm90a") -> list[dict]:
    """The cost model's choice against a measured sweep (``bench_mm.py --sweep`` rows: op, m, n, k,
    config, ms): per (op, shape) the config :func:`explain` picks now, the fastest one measured,
    and the ratio of their measured times (1.0: the model chose the fastest). A choice the sweep
    did not time (not built there) has ratio NaN."""
    shapes: dict = {}
    for r in sweep_rows:
        shapes.setdefault((r["op"], int(r["m"]), int(r["n"]), int(r["k"])), {})[r["config"]] = float(r["ms"])
    out = []
    for (op, m, n, k), times in shapes.items():
        chosen = explain(m, n, k, out_dtype="bf16", arch=arch, sm_count=sm_count, **SWEEP_OPS[op]).config
        best = min(times, key=times.get)
        out.append({"op": op, "m": m, "n": n, "k": k, "chosen": chosen, "best": best,
                    "ratio": times[chosen] / times[best] if chosen in times else float("nan")})
    return out
