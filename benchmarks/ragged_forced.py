"""Every built bf16 config forced on the ragged rows of bench_mm's suite, in CUDA-graph replay."""
import statistics, torch, persistent_gemm as pg
from persistent_gemm.catalogue import parse_name
from persistent_gemm.tuning import replay_times
names = sorted({e["config"] for e in pg._C.built_kernels()
                if e["arch"] == "sm90a" and parse_name(e["config"]).dtype == "bf16"})
for m, n, k in ((257, 4096, 4096), (1000, 3000, 5000), (128, 8192, 8192)):
    xs = [(torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16().t()) for _ in range(4)]
    calls = [[lambda a=a, b=b: torch.mm(a, b) for a, b in xs]] + [[lambda a=a, b=b, c=c: pg.mm(a, b, config=c) for a, b in xs] for c in names]
    t = [statistics.median(v) for v in replay_times(calls, 9, 10)]
    print(f"{m}x{n}x{k}: torch.mm {t[0]:.1f} us; default pick {pg.explain(m, n, k).config}")
    for c, v in sorted(zip(names, t[1:]), key=lambda p: p[1]):
        print(f"   {v:8.1f} us  {t[0] / v:5.2f}x  {c}")
