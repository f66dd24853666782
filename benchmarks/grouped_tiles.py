"""The grouped kernels' token tile (issue 45): for gpt-oss-20b's up/gate projection (E = 32,
top-4, N = 5760, K = 2880, MXFP4 weight-only, bf16 activations) at a few token counts, the time of
the config the chooser picks (``explain(..., groups=E)``), of every grouped GEMV tile and the
grouped prefill tile forced, and of bf16
``torch._grouped_mm`` on the same routing. CUDA-graph replay of 20 back-to-back calls, median of
10 replays, per call. No L2 rotation: at 1 token the 4 touched experts' FP4 bytes (35 MB) fit an
H100's 50 MB L2, which flatters ours there (torch's bf16 experts, 140 MB, do not fit); the
moe.csv rows come from bench_moe.py, which rotates. A probe for the chooser, not the record.

    python benchmarks/grouped_tiles.py [--tokens 1,16,128]
"""

import argparse

import torch

import persistent_gemm as pg

E, N, K, TOP = 32, 5760, 2880, 4
CFG = "sm90a_bf16xe2m1_128x{}x512_c1x1_sw1_row_grouped_gemv_swapab"
TILE = "sm90a_bf16xe2m1_128x{}x64_c1x1_sw8_row_grouped_coop_swapab_bf16route"


def graph_us(f, calls=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,4,16,32,128,512,1024,4096")
    args = ap.parse_args()
    torch.manual_seed(0)
    w = torch.randn(E * N, K, device="cuda")
    wq, ws = pg.quantize_mxfp4(w)
    pw = pg.prepare_weight(wq.reshape(E, N, -1), ws.reshape(E, N, -1), fmt="fp4")
    wb = w.reshape(E, N, K).to(torch.bfloat16).transpose(1, 2)
    del w
    print(f"GPU: {torch.cuda.get_device_name()}; gpt-oss-20b up, MXFP4 weight-only, us per call (graph replay)")
    for tokens in (int(t) for t in args.tokens.split(",")):
        experts = torch.rand(tokens, E, device="cuda").topk(TOP, 1).indices.flatten()
        counts = torch.bincount(experts, minlength=E)
        offs = counts.cumsum(0).to(torch.int32)
        x = torch.randn(TOP * tokens, K, device="cuda", dtype=torch.bfloat16)
        pick = pg.explain(TOP * tokens, N, K, dtype="bf16xe2m1", groups=E).config
        built = set(pg.built_configs("sm90a"))
        forced = {t: graph_us(lambda: pg.grouped_mm(x, pw, offs, config=CFG.format(t)))
                  for t in (8, 16, 32, 64) if CFG.format(t) in built}
        for t in (128, 256):
            if TILE.format(t) in built:
                forced[f"tile{t}"] = graph_us(lambda: pg.grouped_mm(x, pw, offs, config=TILE.format(t)))
        auto = graph_us(lambda: pg.grouped_mm(x, pw, offs))
        torch_us = graph_us(lambda: torch._grouped_mm(x, wb, offs=offs))
        print(f"tokens {tokens}: experts touched {int((counts > 0).sum())}, most rows {int(counts.max())}; "
              f"pick {pick.split('_')[2]} {auto:.1f} | forced " + " ".join(f"{t}: {v:.1f}" for t, v in forced.items())
              + f" | torch bf16 {torch_us:.1f} ({torch_us / auto:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
