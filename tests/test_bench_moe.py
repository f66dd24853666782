"""benchmarks/bench_moe.py's pure parts on the CPU: shapes, routing, offs, the expert permutations
that rotate its inputs past L2, its rows and CSV; bench_moe_layer.py's layer shapes, their selection,
rows and (with transformers) a tiny layer built, swapped and checked on the CPU references. (Its
timing runs on a GPU; nothing here times.)"""

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
bench_moe_layer = importlib.import_module("bench_moe_layer")


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
    assert names == ["gpt-oss-20b-up", "gpt-oss-20b-down", "gpt-oss-20b-layer", "deepseek-like-down"]
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
    assert [s.name for s in args.shapes] == [*bench_moe.shapes(), "gpt-oss-20b-layer"]  # 120b's layer when named
    assert args.tokens == [1, 16, 128, 1024, 4096]
    assert args.eager_tokens == args.tokens and args.formats == list(bench_moe.FORMATS)
    assert args.modes == ["graphs", "eager"] and not args.check and args.out == "benchmarks/results/moe.csv"
    args = bench_moe.parse_args(["--shapes", "gpt-oss-20b-up", "--tokens", "1,16", "--eager-tokens", "16",
                                 "--formats", "mxfp4_weight_only", "--check", "--no-tk"])
    assert [s.name for s in args.shapes] == ["gpt-oss-20b-up"] and args.eager_tokens == [16] and args.check and args.no_tk
    for bad in (["--formats", "int4"], ["--modes", "lazy"], ["--shapes", "llama"], ["--iters", "0"]):
        with pytest.raises(SystemExit):
            bench_moe.parse_args(bad)


# ---- the layer rows (bench_moe_layer.py) ----

def test_layer_shapes_are_the_gpt_oss_models():
    layers = bench_moe_layer.shapes()
    assert list(layers) == ["gpt-oss-20b-layer", "gpt-oss-120b-layer"] and bench_moe.ROW_HOOKS == layers
    for name, s in layers.items():
        assert (s.experts, s.topk, s.hidden, s.intermediate) == bench_moe.MODELS[s.model] and name == f"{s.model}-layer"
    assert (layers["gpt-oss-20b-layer"].experts, layers["gpt-oss-120b-layer"].experts) == (32, 128)
    assert set(bench_moe_layer.LAYER_TOL) == set(bench_moe.FORMATS)  # a bound for every format GroupedExperts takes


def test_select_shapes_takes_layers():
    pick = lambda spec: [s.name for s in bench_moe.select_shapes(spec)]
    assert pick("gpt-oss-120b-layer") == ["gpt-oss-120b-layer"]
    assert pick("gpt-oss-120b") == ["gpt-oss-120b-up", "gpt-oss-120b-down", "gpt-oss-120b-layer"]
    assert pick("deepseek-like") == ["deepseek-like-up", "deepseek-like-down"]  # no layer there
    assert pick("gpt-oss-20b-layer,gpt-oss-20b") == ["gpt-oss-20b-layer", "gpt-oss-20b-up", "gpt-oss-20b-down"]
    with pytest.raises(ValueError, match="unknown shape"):
        bench_moe.select_shapes("deepseek-like-layer")
    args = bench_moe.parse_args(["--shapes", "gpt-oss-20b-layer,gpt-oss-120b-layer", "--formats", "mxfp4_weight_only"])
    assert [s.name for s in args.shapes] == ["gpt-oss-20b-layer", "gpt-oss-120b-layer"]
    assert all(isinstance(s, bench_moe_layer.LayerShape) for s in args.shapes)


def test_modes_for_graphs_up_to_the_limit_eager_where_selected():
    args = bench_moe.parse_args([])
    assert [bench_moe.modes_for(t, args) for t in (1, 128, 1024)] == [["graphs", "eager"], ["graphs", "eager"], ["eager"]]
    args = bench_moe.parse_args(["--tokens", "1,16,128,1024", "--eager-tokens", "1"])
    assert [bench_moe.modes_for(t, args) for t in args.tokens] == [["graphs", "eager"], ["graphs"], ["graphs"], []]
    args = bench_moe.parse_args(["--modes", "graphs", "--graph-max-tokens", "16"])
    assert [bench_moe.modes_for(t, args) for t in (1, 16, 128)] == [["graphs"], ["graphs"], []]


def fake_timers(monkeypatch, ms: dict):
    """bench_moe's timing replaced by fixed ms per label (graphs: as given, eager: doubled): rows alone."""
    monkeypatch.setattr(bench_moe, "time_graph_mode", lambda calls, iters: {k: ms[k] for k in calls})
    monkeypatch.setattr(bench_moe, "time_bursts", lambda calls, warmup, iters: {k: 2 * ms[k] for k in calls})


def test_run_shape_times_a_hook_shapes_cases_into_rows(monkeypatch, capsys):
    asked = []

    class Fake:
        name = "gpt-oss-20b-layer"

        def cases(self, tokens, args, refused):
            asked.append(list(tokens))
            for t in tokens:
                yield t, {"torch:bf16": [None], "ours:bf16": [None], "ours:mxfp4_weight_only": [None]}

    fake_timers(monkeypatch, {"torch:bf16": 0.1, "ours:bf16": 0.08, "ours:mxfp4_weight_only": 0.04})
    args = bench_moe.parse_args(["--tokens", "1,16,1024", "--eager-tokens", "16", "--formats",
                                 "bf16,mxfp4_weight_only,fp8_fp4"])
    rows = bench_moe.run_shape(Fake(), args, None, "H100", [])
    assert asked == [[1, 16]]  # 1024: no mode (past --graph-max-tokens, not an eager token): no inputs made
    got = [(r["tokens"], r["graphs"], r["format"]) for r in rows]
    assert got == [(1, "yes", "bf16"), (1, "yes", "mxfp4_weight_only"), (1, "yes", "fp8_fp4"),
                   (16, "yes", "bf16"), (16, "yes", "mxfp4_weight_only"), (16, "yes", "fp8_fp4"),
                   (16, "no", "bf16"), (16, "no", "mxfp4_weight_only"), (16, "no", "fp8_fp4")]
    by = {(r["graphs"], r["format"]): r for r in rows if r["tokens"] == 16}
    assert by["yes", "mxfp4_weight_only"]["ours_us"] == pytest.approx(40.0)
    assert by["yes", "mxfp4_weight_only"]["torch_us"] == pytest.approx(100.0)  # the bf16 layer's time on every row
    assert by["yes", "mxfp4_weight_only"]["speedup"] == pytest.approx(2.5)
    assert by["no", "bf16"]["ours_us"] == pytest.approx(160.0) and by["no", "bf16"]["speedup"] == pytest.approx(1.25)
    assert math.isnan(by["yes", "fp8_fp4"]["ours_us"])  # refused or not swapped: empty, the row kept
    assert all(r["shape"] == "gpt-oss-20b-layer" and math.isnan(r["tk_us"]) for r in rows)
    assert all(not (isinstance(r["vs_tk"], float) and math.isfinite(r["vs_tk"])) for r in rows)  # written empty
    assert "gpt-oss-20b-layer" in capsys.readouterr().out


def test_layer_rows_skip_without_transformers(monkeypatch, capsys):
    monkeypatch.setattr(bench_moe_layer, "load_transformers", lambda: "transformers is not installed")
    fake_timers(monkeypatch, {})
    args = bench_moe.parse_args(["--shapes", "gpt-oss-20b-layer,gpt-oss-120b-layer"])
    refused, rows = [], []
    for s in args.shapes:
        rows += bench_moe.run_shape(s, args, None, "H100", refused)
    out = capsys.readouterr().out.splitlines()
    assert rows == [] and refused == []
    assert [line.split(":")[0] for line in out] == ["gpt-oss-20b-layer", "gpt-oss-120b-layer"]  # one line each
    assert all("skipped: transformers is not installed" in line for line in out)


def test_layer_row_error_is_the_worst_token():
    ref = torch.ones(1, 4, 8)
    out = ref.clone()
    out[0, 2] *= 1.5
    assert bench_moe_layer.row_error(out, ref) == pytest.approx(0.5)
    assert bench_moe_layer.row_error(out.reshape(4, 8), ref.reshape(4, 8)) == pytest.approx(0.5)


# -- with transformers: a tiny gpt-oss layer on the CPU references (the GPU run builds the 20b one) --

TINY = bench_moe_layer.LayerShape("tiny-layer", "tiny", experts=4, topk=2, hidden=128, intermediate=64)


def tiny_cases(tokens, formats, check, refused, monkeypatch=None, hook=None):
    if isinstance(bench_moe_layer.load_transformers(), str):
        pytest.skip("transformers with gpt-oss is not installed")
    if bench_moe_layer.pg is None:
        pytest.skip("persistent_gemm is not importable")
    if hook is not None:  # the swapped layers' experts output replaced: a wrong kernel
        real = bench_moe_layer.swapped

        def broken(mlp, fmt):
            net = real(mlp, fmt)
            net.experts.register_forward_hook(lambda mod, args, out: hook(out))
            return net
        monkeypatch.setattr(bench_moe_layer, "swapped", broken)
    return list(bench_moe_layer.layer_cases(TINY, tokens, formats, check, refused, device="cpu"))  # as the bench: no no_grad


def test_tiny_layer_built_swapped_and_checked_on_the_cpu(capsys):
    refused = []
    cases = tiny_cases([1, 3], ["bf16", "mxfp4_weight_only", "mxfp8"], True, refused)
    assert refused == [] and [t for t, _ in cases] == [1, 3]
    out = capsys.readouterr().out
    assert out.count("check ours:") == 6 and "experts_implementation='grouped_mm'" in out
    t, calls = cases[1]
    assert list(calls) == ["torch:bf16", "ours:bf16", "ours:mxfp4_weight_only", "ours:mxfp8"]
    assert all(len(fns) == bench_moe_layer.COPIES for fns in calls.values())
    ys = [fn() for fn in calls["ours:mxfp4_weight_only"][:2]]
    assert all(y.shape == (1, 3, 128) and y.dtype == torch.bfloat16 and y.grad_fn is None for y in ys)
    assert not torch.equal(*ys)  # the input copies differ


def test_tiny_layer_shares_the_bf16_layers_router_and_keeps_its_experts():
    tf = bench_moe_layer.load_transformers()
    if isinstance(tf, str) or bench_moe_layer.pg is None:
        pytest.skip("needs transformers with gpt-oss and persistent_gemm")
    mlp = bench_moe_layer.build_layer(TINY, tf, device="cpu")
    again = bench_moe_layer.build_layer(TINY, tf, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(mlp.parameters(), again.parameters()))  # seeded
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in mlp.parameters())
    w = mlp.experts.gate_up_proj.float()
    assert w.shape == (4, 128, 128) and 0.015 < w.std().item() < 0.025 and mlp.experts.gate_up_proj_bias.abs().sum() > 0
    assert mlp.experts.config._experts_implementation == "grouped_mm"
    net = bench_moe_layer.swapped(mlp, "mxfp4_weight_only")
    assert isinstance(net.experts, bench_moe_layer.pg.nn.GroupedExperts) and net.experts.fmt == "mxfp4_weight_only"
    assert type(mlp.experts).__name__ == "GptOssExperts"  # the bf16 layer keeps its own experts
    assert net.router.weight is mlp.router.weight and net.router.bias is mlp.router.bias  # one router, no copy


@pytest.mark.parametrize("check,kept", [(True, False), (False, True)])
def test_tiny_layer_with_wrong_experts_is_refused_under_check(monkeypatch, check, kept):
    refused = []
    cases = tiny_cases([2], ["mxfp8_weight_only"], check, refused, monkeypatch, hook=lambda out: out * 0)
    assert ("ours:mxfp8_weight_only" in cases[0][1]) == kept and "torch:bf16" in cases[0][1]
    assert kept or (len(refused) == 1 and "tokens=2 ours:mxfp8_weight_only" in refused[0]
                    and "against the bf16 layer" in refused[0])


def test_tiny_layer_with_non_finite_output_is_refused_without_check(monkeypatch):
    refused = []
    cases = tiny_cases([2], ["bf16"], False, refused, monkeypatch, hook=lambda out: out * float("nan"))
    assert list(cases[0][1]) == ["torch:bf16"] and "non-finite" in refused[0]
