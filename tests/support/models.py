"""Small float models the nn tests swap (test_nn, test_nn_model_path)."""

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
