"""The MoE routing kernels (host/moe_routing.cuh) under compute-sanitizer: moe_dispatch at decode
(a CTA per sorted row), at prefill (rows dealt over CTAs, each CTA counting every slot), with one
expert, with two gathers of which one is not 16-byte rows (the byte copy), with strided rows and
with more experts than 16 counting warps fit (fewer warps); moe_activation and moe_combine with
a partial last 256-column CTA. Outputs NaN-poisoned, each checked against the CPU definition (the
point is memcheck's, racecheck's and synccheck's verdicts; the numerics are the GPU suite's).

    compute-sanitizer --tool racecheck --error-exitcode 1 python benchmarks/sanitize_moe_routing.py
"""

from __future__ import annotations

import sys

import torch

import persistent_gemm as pg

# (tokens, experts, top_k, row elements)
DISPATCH = [(1, 32, 4, 2880), (16, 32, 4, 2880), (300, 256, 8, 136), (2048, 32, 4, 72), (9, 1, 2, 40),
            (40, 1000, 3, 24)]


def main() -> int:
    pg._C.set_poison_outputs(True)
    bad = 0
    g = torch.Generator().manual_seed(0)
    for tokens, e, top_k, d in DISPATCH:
        indices = torch.randint(0, e, (tokens, top_k), generator=g)
        wide = torch.randn(tokens, d + 8, generator=g).bfloat16()
        scales = torch.randint(0, 255, (tokens, d // 32 + 1), generator=g, dtype=torch.uint8)
        x = wide[:, 8:]  # strided rows, 16-byte aligned when d is a multiple of 8
        got = pg.moe_dispatch(indices.cuda(), e, x.cuda(), scales.cuda())
        ref = pg.moe_dispatch(indices, e, x, scales)
        ok = all(torch.equal(a.cpu(), b) for a, b in zip((got[0], got[1], *got[2]), (ref[0], ref[1], *ref[2])))
        print(f"moe_dispatch tokens={tokens} experts={e} top_k={top_k} d={d}: {'ok' if ok else 'MISMATCH'}")
        bad += not ok
        y = torch.randn(tokens * top_k, d, generator=g).bfloat16()
        w = torch.rand(tokens, top_k, generator=g)
        out = pg.moe_combine(y.cuda(), ref[1].cuda(), w.cuda(), out_dtype=torch.float32).cpu()
        ok = torch.equal(out, pg.moe_combine(y, ref[1], w, out_dtype=torch.float32))
        print(f"moe_combine tokens={tokens} top_k={top_k} d={d}: {'ok' if ok else 'MISMATCH'}")
        bad += not ok
        for kind in ("silu", "gpt_oss"):
            h = torch.randn(tokens, 2 * d, generator=g) * 4
            out = pg.moe_activation(h.cuda(), kind).cpu()
            ok = torch.allclose(out, pg.moe_activation(h, kind), rtol=2**-20, atol=1e-6)
            print(f"moe_activation {kind} rows={tokens} inter={d}: {'ok' if ok else 'MISMATCH'}")
            bad += not ok
    torch.cuda.synchronize()
    print(f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
