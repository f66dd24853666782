"""Small float models the nn tests swap (test_nn, test_nn_model_path, test_moe)."""

import torch


class Block(torch.nn.Module):
    """A small transformer MLP block with a 3-D residual stream."""

    def __init__(self, d=64, hidden=128, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, hidden)
        self.down = torch.nn.Linear(hidden, d, bias=False)
        self.head = torch.nn.Linear(d, 96)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.1

    def forward(self, x):
        x = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return self.head(x)


class SwiGLUExpert(torch.nn.Module):
    """transformers 4.x's MixtralBlockSparseTop2MLP, ``w2(silu(w1 x) * w3 x)``, or with
    ``names=("gate_proj", "up_proj", "down_proj")`` OLMoE's / Qwen-MoE's expert MLP."""

    def __init__(self, d, hidden, names=("w1", "w3", "w2"), bias=False):
        super().__init__()
        self.names = names
        for name, (i, o) in zip(names, ((d, hidden), (d, hidden), (hidden, d))):
            setattr(self, name, torch.nn.Linear(i, o, bias=bias))
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(self.act_fn(gate(x)) * up(x))


class SparseMoe(torch.nn.Module):
    """transformers 4.x's MixtralSparseMoeBlock as it was: a router Linear ``gate``, softmax in
    float32, top-k renormalised (unless ``norm_topk_prob`` is false, OLMoE's flag), a loop over an
    ``experts`` ModuleList; returns (hidden_states, router_logits)."""

    def __init__(self, d=64, hidden=96, experts=4, top_k=2, names=("w1", "w3", "w2"), norm_topk_prob=True,
                 bias=False, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = torch.nn.Linear(d, experts, bias=False)
        self.experts = torch.nn.ModuleList(SwiGLUExpert(d, hidden, names, bias) for _ in range(experts))
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.2

    def forward(self, hidden_states):
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        router_logits = self.gate(x)
        weights, selected = torch.topk(torch.softmax(router_logits, dim=1, dtype=torch.float), self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(selected == e)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(hidden_states.shape), router_logits


class MoeModel(torch.nn.Module):
    """A Linear, a sparse MoE block and a head Linear: what quantize_ swaps in an MoE model."""

    def __init__(self, d=64, seed=0, **moe):
        super().__init__()
        g = torch.Generator().manual_seed(seed + 1)
        self.proj = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, 32)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.1
        self.moe = SparseMoe(d, seed=seed, **moe)

    def forward(self, x):
        h = self.proj(x)
        return self.head(h + self.moe(h)[0])
