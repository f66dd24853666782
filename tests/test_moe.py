"""MoE experts in one module (issue 45 item 4): persistent_gemm.moe's GroupedExperts and
SparseMoeBlock against a float64 definition of the experts (every format: bf16 against the float
weights, the MX formats against their own dequantized weights), empty experts, one expert, top-k
slots, routing weights, gpt-oss's clamp; quantize_ swapping ModuleList blocks and transformers'
gpt-oss and Mixtral experts (with its filter, state dicts, casts); gpt-oss's MXFP4 checkpoint
bytes read as transformers reads them; no host sync (a whole-graph trace whose graph has no
host read, and no retrace for new routing); CUDA graphs replaying new routing on a GPU.
transformers is optional: its tests skip without it."""

import copy
import re
import warnings

import pytest
import torch
from conftest import rel_err
from support.models import MoeModel, SparseMoe

import persistent_gemm as pg
from persistent_gemm.moe import FORMATS  # importable without the extension: collection never errors

pytestmark = pytest.mark.skipif(not pg.extension_available() or not hasattr(torch.ops.persistent_gemm, "grouped_mm"),
                                reason="needs the compiled extension with the grouped_mm op")

#: Relative error allowed against the float64 definition on the module's own weights with the
#: activations rounded as the format rounds them (bf16, or MXFP8 for mxfp8 / fp8_fp4): what is left
#: is the GEMMs' bf16 outputs and the roundings those move (measured at most 4.8e-3 and 2.3e-2).
TOL = {"bf16": 1e-2, "mxfp8_weight_only": 1e-2, "mxfp4_weight_only": 1e-2, "mxfp8": 5e-2, "fp8_fp4": 5e-2}
#: The same against a definition whose activations are not rounded (transformers' own forward):
#: MXFP8 activations add their quantization (measured at most 6.2e-2).
TOL_ACT = {**TOL, "mxfp8": 0.15, "fp8_fp4": 0.15}
#: Against the float weights: the weights' own quantization too (measured at most 8.7e-2 for
#: MXFP8, 0.23 for MXFP4 weights).
TOL_FLOAT = {**TOL_ACT, "mxfp8_weight_only": 0.15, "mxfp8": 0.2, "mxfp4_weight_only": 0.4, "fp8_fp4": 0.4}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def reference(x, indices, weights, gate_up, down, gate_up_bias=None, down_bias=None, activation="silu",
              alpha=1.702, limit=7.0, operand=lambda t: t):
    """The experts in float64, slot by slot, nothing sorted or grouped: expert e's gate_up[e]
    (2I, D) holds its gate rows, then its up rows; down[e] is (D, I). ``operand``: how the
    format rounds each GEMM's activations."""
    h = torch.einsum("td,tknd->tkn", operand(x.double()), gate_up.double()[indices])
    if gate_up_bias is not None:
        h = h + gate_up_bias.double()[indices]
    gate, up = h.chunk(2, dim=-1)
    if activation == "silu":
        a = torch.nn.functional.silu(gate) * up
    else:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        a = (up + 1) * gate * torch.sigmoid(alpha * gate)
    y = torch.einsum("tki,tkdi->tkd", operand(a), down.double()[indices])
    if down_bias is not None:
        y = y + down_bias.double()[indices]
    return (y * weights.double().unsqueeze(-1)).sum(1)


def rounded(fmt):
    """How ``fmt`` rounds a GEMM's activations, in float64."""
    if fmt in ("mxfp8", "fp8_fp4"):
        return lambda t: pg.dequantize_mxfp8(*pg.quantize_mxfp8(t.flatten(0, -2).float())).double().reshape(t.shape)
    return lambda t: t.bfloat16().double()


def experts_and_weights(e=4, d=64, i=96, bias=True, seed=0, scale=0.15):
    g = torch.Generator().manual_seed(seed)
    w = {"gate_up": torch.randn(e, 2 * i, d, generator=g) * scale, "down": torch.randn(e, d, i, generator=g) * scale}
    if bias:
        w["gate_up_bias"] = torch.randn(e, 2 * i, generator=g) * 0.1
        w["down_bias"] = torch.randn(e, d, generator=g) * 0.1
    return w


def routing(tokens, e, top_k, seed=1, experts=None):
    """Random (tokens, top_k) expert indices (repeats within a token included) drawn from
    ``experts`` (all by default), and positive weights that do not sum to 1."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.arange(e) if experts is None else torch.tensor(experts)
    indices = pool[torch.randint(0, len(pool), (tokens, top_k), generator=g)]
    return indices, torch.rand(tokens, top_k, generator=g) + 0.25


def check(m, w, x, indices, weights, fmt, **act):
    """m(x) against the float64 definition on m's own weights (their bf16 or MX values)."""
    gate_up, down = m.dequantize()
    biases = {k: w[k].bfloat16().to(x.device) for k in ("gate_up_bias", "down_bias") if k in w}
    with torch.no_grad():
        out = m(x, indices, weights)
    assert out.shape == x.shape and out.dtype == x.dtype and torch.isfinite(out).all()
    ref = reference(x, indices, weights, gate_up, down, **biases, **act, operand=rounded(fmt))
    assert rel_err(out, ref) < TOL[fmt], (fmt, rel_err(out, ref))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_grouped_experts_match_the_float64_definition(fmt, top_k):
    w = experts_and_weights()
    m = pg.nn.GroupedExperts.from_weights(**w, fmt=fmt)
    x = torch.randn(37, 64)
    indices, weights = routing(37, 4, top_k)
    out = check(m, w, x, indices, weights, fmt)
    # and near the float weights, as each format's weights allow
    assert rel_err(out, reference(x, indices, weights, **w)) < TOL_FLOAT[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_experts_and_a_single_expert(fmt):
    w = experts_and_weights(e=8)
    m = pg.nn.GroupedExperts.from_weights(**w, fmt=fmt)
    x = torch.randn(21, 64)
    indices, weights = routing(21, 8, 2, experts=[1, 5, 6])  # experts 0, 2-4 and 7 (the last) get no rows
    check(m, w, x, indices, weights, fmt)
    one = experts_and_weights(e=1, seed=3)
    check(pg.nn.GroupedExperts.from_weights(**one, fmt=fmt), one, x, *routing(21, 1, 1), fmt)


def test_routing_weights_scale_each_slot():
    m = pg.nn.GroupedExperts.from_weights(**experts_and_weights(bias=False), fmt="mxfp4_weight_only")
    x = torch.randn(9, 64)
    indices, weights = routing(9, 4, 2)
    with torch.no_grad():
        out = m(x, indices, weights)
        # the output is linear in the weights: doubled, it doubles exactly (fp32 sums of bf16 outputs)
        assert torch.equal(m(x, indices, 2 * weights), 2 * out)
        # a slot of weight zero drops its expert: the same as routing that token to its other slot alone
        first = m(x, indices[:, :1], weights[:, :1])
        assert torch.equal(m(x, indices, torch.cat((weights[:, :1], torch.zeros(9, 1)), 1)), first)


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4_weight_only", "fp8_fp4"])
def test_gpt_oss_clamp_is_hit_and_applied(fmt):
    w = experts_and_weights(scale=0.5)
    m = pg.nn.GroupedExperts.from_weights(**w, fmt=fmt, activation="gpt_oss")
    x = torch.randn(40, 64) * 2
    indices, weights = routing(40, 4, 2)
    h = torch.einsum("td,tknd->tkn", x, w["gate_up"][indices])
    assert (h[..., :96] > 7).float().mean() > 0.1 and (h[..., 96:].abs() > 7).float().mean() > 0.1
    out = check(m, w, x, indices, weights, fmt, activation="gpt_oss")
    unclamped = reference(x, indices, weights, *m.dequantize(), activation="gpt_oss", limit=float("inf"))
    assert rel_err(out, unclamped) > 0.3  # the clamp changed the output, far beyond any rounding


@pytest.mark.parametrize("fmt", FORMATS)
def test_forward_traces_whole_without_reading_routing_on_the_host(fmt):
    # What a CUDA graph needs, checked on the CPU: torch.compile(fullgraph=True) fails on a graph
    # break (.item(), .tolist(), bincount, nonzero, boolean masks: shapes or values read on the
    # host); the one graph holds none of them, and new routing of the same shape reuses it.
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    m = pg.nn.GroupedExperts.from_weights(**experts_and_weights(), fmt=fmt, activation="gpt_oss")
    compiled = torch.compile(m, fullgraph=True, backend=backend, dynamic=False)
    x = torch.randn(11, 64)
    with torch.no_grad():
        for seed in (1, 2):
            indices, weights = routing(11, 4, 2, seed=seed)
            assert torch.equal(compiled(x, indices, weights), m(x, indices, weights))
    assert len(graphs) == 1
    called = {getattr(n.target, "__name__", str(n.target)) for n in graphs[0].graph.nodes}
    assert not called & {"item", "tolist", "bincount", "nonzero", "unique", "masked_select", "_local_scalar_dense"}
    # the routing is ours, in the graph: sort and gather, the gated activation, the weighted sum
    assert {"moe_dispatch.default", "moe_activation.default", "moe_combine.default"} <= called, called


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8", "mxfp4_weight_only"])
@pytest.mark.parametrize("names,norm", [(("w1", "w3", "w2"), True), (("gate_proj", "up_proj", "down_proj"), False)])
def test_quantize_swaps_a_modulelist_block_and_the_linears(fmt, names, norm):
    model = MoeModel(names=names, norm_topk_prob=norm, bias=norm)
    x = torch.randn(2, 7, 64)
    with torch.no_grad():
        ref = model(x)
        pg.nn.quantize_(model, fmt, filter_fn=lambda mod, fqn: fqn != "moe.gate")  # the router kept in float
        out = model(x)
    assert isinstance(model.moe, pg.nn.SparseMoeBlock) and type(model.moe.gate) is torch.nn.Linear
    assert isinstance(model.moe.experts, pg.nn.GroupedExperts) and model.moe.experts.fqn == "moe"
    assert isinstance(model.proj, pg.nn.Linear) and isinstance(model.head, pg.nn.Linear)
    assert model.moe.norm_topk_prob == norm and model.moe.top_k == 2
    assert not any(type(mod) is torch.nn.Linear for mod in model.modules() if mod is not model.moe.gate)
    assert rel_err(out, ref.double()) < TOL_FLOAT[fmt]


def test_the_block_alone_matches_the_loop_it_replaces():
    block = SparseMoe(experts=6, top_k=3)
    x = torch.randn(3, 5, 64)
    swapped = pg.nn.SparseMoeBlock.from_block(copy.deepcopy(block), "bf16")
    with torch.no_grad():
        ref, ref_logits = block.double()(x.double())
        out, logits = swapped(x)
    assert out.shape == x.shape and torch.allclose(logits.double(), ref_logits, atol=1e-5)
    assert rel_err(out, ref) < TOL["bf16"]


def test_filter_fn_and_fp8_rowwise_leave_a_block_its_linears():
    model = MoeModel()
    pg.nn.quantize_(model, "mxfp8", filter_fn=lambda mod, fqn: fqn != "moe")
    assert type(model.moe) is SparseMoe and isinstance(model.moe.experts[0].w1, pg.nn.Linear)
    model = MoeModel()
    pg.nn.quantize_(model, "fp8_rowwise")  # no grouped GEMM: the experts' Linears swap one by one
    assert type(model.moe) is SparseMoe and isinstance(model.moe.experts[0].w2, pg.nn.Linear)


def test_state_dict_names_round_trip_and_casts_keep_the_bytes():
    model = pg.nn.quantize_(MoeModel(bias=True), "fp8_fp4")
    sd = model.state_dict()
    keys = {k for k in sd if k.startswith("moe.experts.")}
    assert keys == {f"moe.experts.{p}_{s}" for p in ("gate_up", "down")
                    for s in ("weight_q", "weight_scale", "bias")}
    assert sd["moe.experts.gate_up_weight_q"].shape == (4, 192, 32)  # (E, 2I, D/2) e2m1 pairs
    assert sd["moe.experts.down_weight_q"].shape == (4, 64, 48)
    assert sd["moe.experts.gate_up_weight_q"].dtype == torch.float4_e2m1fn_x2
    assert sd["moe.experts.gate_up_weight_scale"].dtype == torch.float8_e8m0fnu
    x = torch.randn(6, 64)
    with torch.no_grad():
        out = model(x)
        fresh = pg.nn.quantize_(MoeModel(seed=7, bias=True), "fp8_fp4")
        assert not torch.equal(fresh(x), out)
        fresh.load_state_dict(copy.deepcopy(sd))
        assert torch.equal(fresh(x), out)  # the prepared weights were made again from what was loaded
        fresh.load_state_dict(sd, assign=True)
        assert torch.equal(fresh(x), out)
        experts = fresh.moe.experts
        fresh.half()
        assert experts.gate_up_weight_q.dtype == torch.float4_e2m1fn_x2 and experts.gate_up_bias.dtype == torch.float16
        assert rel_err(fresh(x.half()), out.double()) < TOL["fp8_fp4"]  # MXFP8 blocks may round otherwise


def test_errors_name_the_module_and_the_rule():
    with pytest.raises(ValueError, match="fmt must be one of .*fp8_rowwise has no grouped GEMM"):
        pg.nn.GroupedExperts(4, 64, 96, "fp8_rowwise")
    with pytest.raises(ValueError, match="^moe: .*multiples of 32 for fmt='fp8_fp4'.*got 4, 64, 48"):
        pg.nn.quantize_(MoeModel(hidden=48), "fp8_fp4")
    m = pg.nn.GroupedExperts.from_weights(**experts_and_weights(), fmt="bf16")
    m.fqn = "layers.0.mlp.experts"
    with pytest.raises(ValueError, match="'layers.0.mlp.experts' .*hidden_states must be a float \\(tokens, 64\\)"):
        m(torch.randn(2, 3, 64), *routing(2, 4, 2))
    with pytest.raises(ValueError, match="both be \\(tokens, top_k\\) for 5 tokens"):
        m(torch.randn(5, 64), *routing(4, 4, 2))
    with pytest.raises(ValueError, match="not a transformers experts module"):
        pg.nn.GroupedExperts.from_module(torch.nn.Linear(4, 4))


# -- transformers' own modules (optional dependency) --------------------------------------------
def _tiny(name, **extra):
    import transformers

    cfg = getattr(transformers, name)(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                            vocab_size=128, **extra)
    cfg._experts_implementation = "eager"
    return cfg


def _randomized(module, seed=0, scale=0.15):
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = torch.randn(p.shape, generator=g) * scale
    return module


def _with_weights(experts, gate_up, down, interleaved, transposed):
    """A float64 copy of transformers' experts module holding (E, 2I, D) / (E, D, I) weights in its layout."""
    ref = copy.deepcopy(experts).double()
    if interleaved:  # our gate rows then up rows -> gate 2j, up 2j + 1
        gate_up = torch.stack(gate_up.chunk(2, dim=1), dim=2).flatten(1, 2)
    ref.gate_up_proj.data = (gate_up.transpose(1, 2) if transposed else gate_up).double()
    ref.down_proj.data = (down.transpose(1, 2) if transposed else down).double()
    return ref


#: bf16, 16-bit activations x MX weights, MXFP8 activations x MXFP4 weights: transformers' layouts
#: against each path (tests above cover every format)
TF_FORMATS = ("bf16", "mxfp8_weight_only", "fp8_fp4")


@pytest.mark.parametrize("fmt", TF_FORMATS)
def test_gpt_oss_experts_swap_in_the_mlp(fmt):
    pytest.importorskip("transformers")  # an optional dependency (the "models" extra)
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    mlp = _randomized(GptOssMLP(_tiny("GptOssConfig")), scale=0.3)
    x = torch.randn(1, 24, 64) * 2
    with torch.no_grad():
        ref, ref_scores = mlp(x)
        original = copy.deepcopy(mlp.experts)
        pg.nn.quantize_(mlp, fmt)
        out, scores = mlp(x)  # GptOssMLP calls experts(hidden_states, router_indices, router_scores)
        assert isinstance(mlp.experts, pg.nn.GroupedExperts) and mlp.experts.fqn == "experts"
        assert mlp.experts.activation == "gpt_oss" and mlp.experts.limit == 7.0 and mlp.experts.alpha == 1.702
        assert torch.equal(scores, ref_scores)  # the router is untouched
        assert rel_err(out, ref.double()) < TOL_FLOAT[fmt]
        # against transformers' own forward on the swapped module's weights (their layout put back)
        rows = x.reshape(-1, 64)
        _, weights, indices = mlp.router(rows)
        same = _with_weights(original, *mlp.experts.dequantize(), interleaved=True, transposed=True)
        same.gate_up_proj_bias.data = original.gate_up_proj_bias.bfloat16().double()
        same.down_proj_bias.data = original.down_proj_bias.bfloat16().double()
        ref = same(rows.double(), indices, weights.double())
        assert rel_err(mlp.experts(rows, indices, weights), ref) < TOL_ACT[fmt]


@pytest.mark.parametrize("fmt", TF_FORMATS)
def test_mixtral_experts_swap_in_the_block(fmt):
    pytest.importorskip("transformers")  # an optional dependency (the "models" extra)
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    block = _randomized(MixtralSparseMoeBlock(_tiny("MixtralConfig")).eval())
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        ref = block(x)
        original = copy.deepcopy(block.experts)
        pg.nn.quantize_(block, fmt)
        assert isinstance(block.experts, pg.nn.GroupedExperts) and block.experts.activation == "silu"
        assert rel_err(block(x), ref.double()) < TOL_FLOAT[fmt]
        rows = x.reshape(-1, 64)
        _, weights, indices = block.gate(rows)
        same = _with_weights(original, *block.experts.dequantize(), interleaved=False, transposed=False)
        ref = same(rows.double(), indices, weights.double())
        assert rel_err(block.experts(rows, indices, weights), ref) < TOL_ACT[fmt]


def test_gpt_oss_mxfp4_checkpoint_reads_as_transformers_reads_it():
    pytest.importorskip("transformers")  # an optional dependency (the "models" extra)
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    w = experts_and_weights(scale=0.3)
    # the checkpoint's rows: gate_up interleaved (gate 2j, up 2j + 1), as gpt-oss ships them
    interleaved = torch.stack(w["gate_up"].chunk(2, dim=1), dim=2).flatten(1, 2)
    tensors = []
    for weight in (interleaved, w["down"]):
        wq, ws = pg.quantize_mxfp4(weight)
        e, n, kh = wq.shape
        tensors += [wq.view(torch.uint8).reshape(e, n, kh // 16, 16), ws.view(torch.uint8)]
    bias_gu = torch.stack(w["gate_up_bias"].chunk(2, dim=1), dim=2).flatten(1, 2)
    ours = pg.nn.GroupedExperts.from_mxfp4_blocks(*tensors, bias_gu, w["down_bias"])
    theirs = GptOssExperts(_tiny("GptOssConfig")).double()
    theirs.gate_up_proj.data = convert_moe_packed_tensors(*tensors[:2], dtype=torch.float32).double()
    theirs.down_proj.data = convert_moe_packed_tensors(*tensors[2:], dtype=torch.float32).double()
    theirs.gate_up_proj_bias.data = bias_gu.bfloat16().double()
    theirs.down_proj_bias.data = w["down_bias"].bfloat16().double()
    x = torch.randn(30, 64) * 2
    indices, weights = routing(30, 4, 2)
    with torch.no_grad():
        ref = theirs(x.double(), indices, weights.double())
        assert rel_err(ours(x, indices, weights), ref) < TOL["mxfp4_weight_only"]
    assert ours.gate_up_weight_q.shape == (4, 192, 32) and ours.fmt == "mxfp4_weight_only"
    # A model loaded dequantized (transformers' Mxfp4Config(dequantize=True)) and swapped holds the
    # same values: the floor rule finds each block's scale again, or an equal (scale, code) pair.
    swapped = pg.nn.GroupedExperts.from_module(theirs.float(), "mxfp4_weight_only")
    assert all(torch.equal(a, b) for a, b in zip(swapped.dequantize(), ours.dequantize()))


def test_an_experts_module_with_another_gate_is_left_with_a_warning():
    pytest.importorskip("transformers")  # an optional dependency (the "models" extra)
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    for act, fmt, why in (("gelu", "mxfp8", r"its gate \(_default_apply_gate, act_fn GELU"),
                          ("silu", "fp8_rowwise", r"format 'fp8_rowwise' has no grouped GEMM")):
        block = MixtralSparseMoeBlock(_tiny("MixtralConfig", hidden_act=act))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pg.nn.quantize_(block, fmt)
        said = " | ".join(str(w.message) for w in caught)
        assert re.search(r"MoE experts left as they are.*: experts \(" + why, said), said
        assert "nothing was swapped" in said and not isinstance(block.experts, pg.nn.GroupedExperts)


# -- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
class TestCuda:
    """On a GPU: the grouped kernels (or the op's GPU reference) against float64, no host sync
    in a forward, and a CUDA graph captured once replaying new routing."""

    @pytest.mark.parametrize("fmt", FORMATS)
    def test_matches_float64_and_replays_new_routing_in_a_cuda_graph(self, fmt):
        w = experts_and_weights(e=8, d=256, i=128)
        m = pg.nn.GroupedExperts.from_weights(**w, fmt=fmt, activation="gpt_oss").cuda()
        x = torch.randn(16, 256, device="cuda").bfloat16()
        indices, weights = (t.cuda() for t in routing(16, 8, 4, experts=[0, 3, 4, 7]))
        with torch.no_grad():
            torch.cuda.set_sync_debug_mode("error")  # a host read of a device value raises
            try:
                m(x, indices, weights)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            check(m, w, x, indices, weights, fmt, activation="gpt_oss")
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                m(x, indices, weights)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = m(x, indices, weights)
            new_indices, new_weights = (t.cuda() for t in routing(16, 8, 4, seed=5))  # every expert now
            indices.copy_(new_indices)
            weights.copy_(new_weights)
            out.fill_(float("nan"))
            g.replay()
            eager = m(x, new_indices, new_weights)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, eager, rtol=2**-8, atol=1e-3)

    def test_a_swapped_model_moves_to_the_gpu(self):
        model = pg.nn.quantize_(MoeModel(), "fp8_fp4")
        x = torch.randn(5, 64)
        with torch.no_grad():
            cpu = model(x)
            gpu = model.cuda()(x.cuda())
        assert model.moe.experts.gate_up_weight_q.is_cuda and model.moe.experts._prepared["down"].b.is_cuda
        assert rel_err(gpu.cpu(), cpu.double()) < 2e-2
