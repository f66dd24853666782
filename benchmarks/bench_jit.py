"""What running a config that is not built costs (persistent_gemm.jit), on this machine.

* cold compile: a fresh spec into an empty cache (``jit.ensure``), wall seconds;
* cache hit: a second process loads the same spec from the cache (import excluded), seconds;
* per-call host overhead of ``config=``: eager ``mm`` on a problem small enough that the host is
  the bottleneck, per call, with ``config=None``, a canonical name (built and JIT-compiled) and a
  ``KernelConfig`` (the wrapper's memo), medians over rounds, interleaved.

Writes a CSV (``--out``). Usage: ``python benchmarks/bench_jit.py --out benchmarks/results/h200_jit.csv``
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import persistent_gemm as pg
from persistent_gemm import jit
from persistent_gemm.catalogue import KernelConfig
from persistent_gemm.schedule import TileSchedule

#: A spec in no catalogue (and not the one the tests compile).
SPEC = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=2, cluster=(2, 1), raster="column"),
                    kernel="pingpong")

_LOAD = """
import sys, time
import persistent_gemm as pg
from persistent_gemm import jit
t = time.perf_counter()
jit.ensure(sys.argv[1])
print(time.perf_counter() - t)
"""


def host_per_call(fn, calls: int = 2000, rounds: int = 7) -> float:
    """Median over rounds of the host time per call (us) of ``calls`` back-to-back calls."""
    per = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    cache = Path(tempfile.mkdtemp(prefix="pgemm-jit-bench-"))
    os.environ[jit.CACHE_ENV] = str(cache)
    t = time.perf_counter()
    jit.ensure(SPEC)
    cold = time.perf_counter() - t
    rows.append(("cold_compile_s", SPEC.name, f"{cold:.1f}", f"{len(jit.variants_for(SPEC))} variants, "
                 f"{os.cpu_count()} cores"))
    p = subprocess.run([sys.executable, "-c", _LOAD, SPEC.name], capture_output=True, text=True, check=True,
                       env=dict(os.environ))
    rows.append(("cache_hit_load_s", SPEC.name, f"{float(p.stdout.strip()):.3f}", "second process, import excluded"))

    # Same kernel in every pairing, so only the config= path differs: the dispatcher's own pick
    # for this problem (forced by name, by KernelConfig, or not), and the JIT spec forced through
    # the wrapper or straight through torch.ops.
    a = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16).t().contiguous().t()
    pick = pg.explain(128, 128, 128, sm_count=torch.cuda.get_device_properties(0).multi_processor_count).config
    pick_cfg = KernelConfig.from_name(pick)
    op = torch.ops.persistent_gemm.mm
    variants = {
        f"config=None (dispatcher picks {pick})": lambda: pg.mm(a, b),
        "torch.ops.persistent_gemm.mm, config=None": lambda: op(a, b, None, None),
        f"config='{pick}' (built, by name)": lambda: pg.mm(a, b, config=pick),
        f"config=KernelConfig({pick}) (built)": lambda: pg.mm(a, b, config=pick_cfg),
        f"torch.ops.persistent_gemm.mm, config='{pick}'": lambda: op(a, b, None, pick),
        f"config='{SPEC.name}' (jit, by name)": lambda: pg.mm(a, b, config=SPEC.name),
        f"config=KernelConfig({SPEC.name}) (jit)": lambda: pg.mm(a, b, config=SPEC),
        f"torch.ops.persistent_gemm.mm, config='{SPEC.name}'": lambda: op(a, b, None, SPEC.name),
        "torch.mm": lambda: torch.mm(a, b),
    }
    for fn in variants.values():
        fn()
    times = {k: [] for k in variants}
    for _ in range(3):  # interleaved
        for k, fn in variants.items():
            times[k].append(host_per_call(fn))
    for k, v in times.items():
        rows.append(("host_us_per_call", k, f"{statistics.median(v):.2f}", "eager 128x128x128 bf16, host-bound"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "what", "value", "note"])
        w.writerows(rows)
    for r in rows:
        print(",".join(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
