"""benchmarks/bench_moe.py's pure parts on the CPU: shapes, routing, offs, the expert permutations
that rotate its inputs past L2, its rows and CSV. (Its timing runs on a GPU; nothing here times.)"""

from __future__ import annotations

import csv
import importlib
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench_moe = importlib.import_module("bench_moe")


def test_shapes_are_the_issue_45_problems():
    s = bench_moe.shapes()
    assert (s["gpt-oss-20b-up"].experts, s["gpt-oss-20b-up"].topk, s["gpt-oss-20b-up"].n, s["gpt-oss-20b-up"].k) == (32, 4, 5760, 2880)
    assert (s["gpt-oss-20b-down"].n, s["gpt-oss-20b-down"].k) == (2880, 2880)
    assert (s["gpt-oss-120b-up"].experts, s["gpt-oss-120b-up"].n) == (128, 5760)
    assert (s["deepseek-like-up"].experts, s["deepseek-like-up"].topk, s["deepseek-like-up"].n, s["deepseek-like-up"].k) == (256, 8, 4096, 7168)
    assert (s["deepseek-like-down"].n, s["deepseek-like-down"].k) == (7168, 2048)
    assert all(v.gather == k.endswith("-up") for k, v in s.items())


def test_select_shapes_takes_models_and_projections():
    names = [s.name for s in bench_moe.select_shapes("gpt-oss-20b,deepseek-like-down,gpt-oss-20b-up")]
    assert names == ["gpt-oss-20b-up", "gpt-oss-20b-down", "deepseek-like-down"]
    with pytest.raises(ValueError, match="unknown shape"):
        bench_moe.select_shapes("gpt-oss-21b")


@pytest.mark.parametrize("tokens,experts,topk", [(1, 32, 4), (16, 128, 4), (128, 256, 8)])
def test_route_is_seeded_top_k_of_distinct_logits(tokens, experts, topk):
    logits, ids, w = bench_moe.route(tokens, experts, topk, seed=7)
    again = bench_moe.route(tokens, experts, topk, seed=7)
    assert all(torch.equal(x, y) for x, y in zip((logits, ids, w), again))
    assert not torch.equal(ids, bench_moe.route(tokens, experts, topk, seed=8)[1]) or tokens == 1
    assert logits.shape == (tokens, experts) and ids.shape == w.shape == (tokens, topk)
    # distinct per token, also in bf16 (the dtype triton_kernels' routing reads): no ties to break
    assert all(len(set(row.tolist())) == experts for row in logits.bfloat16().float())
    assert torch.equal(logits.bfloat16().float(), logits)
    assert all(len(set(row.tolist())) == topk for row in ids)
    assert torch.equal(ids, logits.topk(topk, dim=1).indices)
    torch.testing.assert_close(w.sum(1), torch.ones(tokens))
    assert bool((w[:, :-1] >= w[:, 1:]).all())


def test_sort_rows_groups_by_expert_stable_by_token():
    ids = torch.tensor([[3, 0], [0, 2], [3, 1], [0, 3]])
    order, counts, offs = bench_moe.sort_rows(ids, experts=5)
    assert counts.tolist() == [3, 1, 1, 3, 0]
    assert offs.dtype == torch.int32 and offs.tolist() == [3, 4, 5, 8, 8]  # cumulative ends, empty expert 4 too
    flat = ids.reshape(-1)
    assert flat[order].tolist() == [0, 0, 0, 1, 2, 3, 3, 3]
    assert (order // 2).tolist() == [0, 1, 3, 2, 1, 0, 2, 3]  # tokens ascending within each expert


def test_sort_rows_offs_cover_all_rows():
    _, ids, _ = bench_moe.route(64, 32, 4, seed=1)
    order, counts, offs = bench_moe.sort_rows(ids, 32)
    assert sorted(order.tolist()) == list(range(256)) and int(offs[-1]) == 256 == int(counts.sum())
    ends = [0] + offs.tolist()
    experts = ids.reshape(-1)[order]
    assert all(bool((experts[lo:hi] == e).all()) for e, (lo, hi) in enumerate(zip(ends, ends[1:])))


@pytest.mark.parametrize("experts,touched,copies", [(32, [3, 9, 17, 30], 4), (256, list(range(0, 256, 37)), 16),
                                                    (8, [0, 1, 2, 3, 4], 3)])
def test_expert_perms_are_permutations_first_identity(experts, touched, copies):
    perms = bench_moe.expert_perms(touched, experts, copies, seed=0)
    assert len(perms) == copies and torch.equal(perms[0], torch.arange(experts))
    assert all(sorted(p.tolist()) == list(range(experts)) for p in perms)
    assert all(torch.equal(a, b) for a, b in zip(perms, bench_moe.expert_perms(touched, experts, copies, seed=0)))


def test_expert_perms_touch_fresh_experts_while_they_last():
    touched = [3, 9, 17, 30]
    perms = bench_moe.expert_perms(touched, 32, 8, seed=2)  # 7 later copies x 4 = 28 = the untouched experts
    sets = [set(p[touched].tolist()) for p in perms]
    assert all(len(s) == 4 for s in sets)
    assert len(set().union(*sets)) == 32  # every copy its own experts: disjoint
    perms = bench_moe.expert_perms(touched, 32, 12, seed=2)  # past 28: the cycle repeats, neighbours still disjoint
    sets = [set(p[touched].tolist()) for p in perms]
    assert all(not (a & b) for a, b in zip(sets, sets[1:]))


def test_expert_perms_with_every_expert_touched_are_identities():
    perms = bench_moe.expert_perms(list(range(8)), 8, 2, seed=0)  # large token counts: no expert is free
    assert all(torch.equal(p, torch.arange(8)) for p in perms)


def test_permute_routing_renames_experts_keeping_the_row_counts():
    logits, ids, _ = bench_moe.route(16, 32, 4, seed=3)
    perm = bench_moe.expert_perms(sorted(set(ids.reshape(-1).tolist())), 32, 2, seed=3)[1]
    moved, pid = bench_moe.permute_routing(logits, ids, perm)
    assert torch.equal(pid, perm[ids])
    assert torch.equal(moved.topk(4, dim=1).indices, pid)  # the logits' top-k is the renamed routing
    c0, c1 = bench_moe.sort_rows(ids, 32)[1], bench_moe.sort_rows(pid, 32)[1]
    assert torch.equal(c1[perm], c0)


def test_make_rows_speedups_and_missing_values():
    us = {"torch:bf16": 20.0, "ours:bf16": 10.0, "ours:mxfp4_weight_only": 5.0, "tk:mxfp4_weight_only": 8.0,
          "ours:fp8_fp4": None}
    rows = bench_moe.make_rows("H100", "gpt-oss-20b-up", 16, True, us, ["bf16", "mxfp4_weight_only", "fp8_fp4"])
    by = {r["format"]: r for r in rows}
    assert by["bf16"]["speedup"] == 2.0 and by["bf16"]["vs_tk"] is None and math.isnan(by["bf16"]["tk_us"])
    assert by["mxfp4_weight_only"]["speedup"] == 4.0 and by["mxfp4_weight_only"]["vs_tk"] == 1.6
    assert by["mxfp4_weight_only"]["torch_us"] == 20.0  # torch's bf16 time on every row
    assert math.isnan(by["fp8_fp4"]["ours_us"]) and math.isnan(by["fp8_fp4"]["speedup"])
    assert all(r["graphs"] == "yes" and r["gpu"] == "H100" and r["tokens"] == 16 for r in rows)
    # tk refused or skipped for its format: vs_tk is NaN, written empty; a hook format with its own torch time
    rows = bench_moe.make_rows("H100", "s", 1, False, {"torch:bf16": 2.0, "ours:mxfp4_weight_only": 1.0,
                                                        "ours:layer": 4.0, "torch:layer": 6.0},
                               ["mxfp4_weight_only", "layer"])
    assert math.isnan(rows[0]["vs_tk"]) and rows[0]["graphs"] == "no"
    assert rows[1]["torch_us"] == 6.0 and rows[1]["speedup"] == 1.5 and rows[1]["vs_tk"] is None


def test_write_rows_has_exactly_the_issue_columns(tmp_path):
    us = {"torch:bf16": 20.0, "ours:bf16": 10.0, "ours:mxfp4_weight_only": 3.0, "tk:mxfp4_weight_only": 4.0}
    rows = bench_moe.make_rows("NVIDIA H100 80GB HBM3", "gpt-oss-20b-down", 1, True, us, ["bf16", "mxfp4_weight_only", "mxfp8"])
    path = tmp_path / "sub" / "moe.csv"
    bench_moe.write_rows(path, rows)
    with open(path, newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == ["gpu", "shape", "tokens", "format", "graphs", "ours_us", "torch_us", "tk_us", "speedup", "vs_tk"]
    assert got[1] == ["NVIDIA H100 80GB HBM3", "gpt-oss-20b-down", "1", "bf16", "yes", "10.00", "20.00", "", "2.000", ""]
    assert got[2] == ["NVIDIA H100 80GB HBM3", "gpt-oss-20b-down", "1", "mxfp4_weight_only", "yes", "3.00", "20.00",
                      "4.00", "6.667", "1.333"]
    assert got[3] == ["NVIDIA H100 80GB HBM3", "gpt-oss-20b-down", "1", "mxfp8", "yes", "", "20.00", "", "", ""]


def test_table_prints_every_row():
    rows = bench_moe.make_rows("g", "gpt-oss-120b-up", 128, True, {"torch:bf16": 1.0, "ours:bf16": 0.5}, ["bf16", "mxfp8"])
    lines = bench_moe.table(rows).splitlines()
    assert lines[0].split() == bench_moe.FIELDS[1:] and len(lines) == 3
    assert lines[1].split() == ["gpt-oss-120b-up", "128", "bf16", "yes", "0.50", "1.00", "-", "2.000", "-"]


def test_parse_args_defaults_and_restrictions():
    args = bench_moe.parse_args([])
    assert [s.name for s in args.shapes] == list(bench_moe.shapes()) and args.tokens == [1, 16, 128, 1024, 4096]
    assert args.eager_tokens == args.tokens and args.formats == list(bench_moe.FORMATS)
    assert args.modes == ["graphs", "eager"] and not args.check and args.out == "benchmarks/results/moe.csv"
    args = bench_moe.parse_args(["--shapes", "gpt-oss-20b-up", "--tokens", "1,16", "--eager-tokens", "16",
                                 "--formats", "mxfp4_weight_only", "--check", "--no-tk"])
    assert [s.name for s in args.shapes] == ["gpt-oss-20b-up"] and args.eager_tokens == [16] and args.check and args.no_tk
    for bad in (["--formats", "int4"], ["--modes", "lazy"], ["--shapes", "llama"], ["--iters", "0"]):
        with pytest.raises(SystemExit):
            bench_moe.parse_args(bad)
