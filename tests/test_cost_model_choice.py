"""The cost model against a measured sweep (issue 27): on every shape of the committed H200
sweep (bench_mm.py --sweep --kernel-time: every built bf16 and e4m3 config forced, kernel time),
the config the dispatcher picks now must run within 3% of the fastest one measured, but for the
rows named below with the reason the model misses them. Asked without a GPU: the same C++
the ops run, against the numbers in the file (benchmarks/choice_table.py prints the table). The
sweeps are kept byte for byte in tests/data/ (tests/data/README.md says where each came from)."""

import csv
import math
from pathlib import Path

import pytest

import persistent_gemm as pg
from persistent_gemm.explain import choice_table

DATA = Path(__file__).resolve().parent / "data"
SWEEP = DATA / "h200_issue27_suite_sweep_kernel_time.csv"

#: Configs registered after the H200 sweep, with the sweep that timed each. Where the model picks
#: one, the row is checked there instead: an H100 sweep (no H200 was lent) that timed it in one
#: process beside the config the H200 sweep found fastest on that shape, which the pick must not
#: trail by more than 3% either.
LATER = {**{name: DATA / "h100_stop38_swapab_128x144_sweep_kernel_time.csv"
            for name in ("sm90a_bf16_128x144x64_c1x2_sw1_row_sk2_coop_swapab",
                         "sm90a_e4m3_128x144x128_c1x2_sw1_row_sk2_coop_swapab_fastacc",
                         "sm90a_e4m3_128x96x128_c1x2_sw1_row_coop_swapab")},
         "sm90a_bf16_128x208x64_c4x1_sw8_row_coop": DATA / "h100_stop39_ragged_tiles_sweep_kernel_time.csv"}

#: Rows the model is known to miss by more than 3%, with the measured ratio it must not exceed.
KNOWN_MISSES = {
    # Unaligned D (8191 columns): the stream-K twin has only a TMA-store variant, which pads D (two
    # extra passes in the ranking, before time); it ran 5.4% faster than the pick all the same.
    ("mm", 8191, 8191, 8192): 1.06,
}


def _sweep_configs_built() -> bool:
    if not pg.extension_available() or "sm90a" not in pg.built_archs():
        return False
    with open(SWEEP) as f:
        timed = {r["config"] for r in csv.DictReader(f)}
    return timed <= {k["config"] for k in pg._C.built_kernels()}


pytestmark = pytest.mark.skipif(not _sweep_configs_built(),
                                reason="needs every config the sweep timed built (the default sm90a catalogue)")


def test_the_models_choice_runs_within_3_percent_of_the_fastest_measured():
    with open(SWEEP) as f:
        rows = choice_table(list(csv.DictReader(f)), sm_count=132)
    assert len(rows) >= 40
    later = {}
    for r in rows:
        key = (r["op"], r["m"], r["n"], r["k"])
        if r["chosen"] in LATER:
            later[key] = r
            continue
        assert not math.isnan(r["ratio"]), f"{key}: the model picks {r['chosen']}, which the sweep did not time"
        assert r["ratio"] <= KNOWN_MISSES.get(key, 1.03), (key, r)
    for key, r in later.items():
        with open(LATER[r["chosen"]]) as f:
            times = {t["config"]: float(t["ms"]) for t in csv.DictReader(f)
                     if (t["op"], int(t["m"]), int(t["n"]), int(t["k"])) == key}
        assert r["chosen"] in times and r["best"] in times, (key, r["chosen"], r["best"], sorted(times))
        r["ratio"] = times[r["chosen"]] / min(times.values())  # counted in the mean as its own sweep measured it
        assert r["ratio"] <= 1.03, (key, times)
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    assert geo <= 1.01, geo
