"""Issue 12's ragged rows: a few schedules the catalogue lacks, JIT-compiled on the GPU machine and
forced, against torch.mm and the dispatcher's pick, in CUDA-graph replay."""
import statistics, time, torch, persistent_gemm as pg
from persistent_gemm.catalogue import KernelConfig
from persistent_gemm.schedule import TileSchedule
from persistent_gemm.tuning import replay_times
cands = [KernelConfig(dtype="bf16", tile=(128, 128, 64), kernel="pingpong", schedule=TileSchedule(cluster=(1, 2), swizzle=8, split_k=2)),
         KernelConfig(dtype="bf16", tile=(64, 256, 64), kernel="pingpong", schedule=TileSchedule(cluster=(1, 2), swizzle=8)),
         KernelConfig(dtype="bf16", tile=(128, 128, 64), kernel="cooperative", schedule=TileSchedule(cluster=(2, 1), swizzle=8, split_k=2))]
t0 = time.time()
names = pg.precompile(cands, jobs=3)
print(f"JIT-compiled {len(names)} configs in {time.time() - t0:.0f} s")
for m, n, k in ((257, 4096, 4096), (1000, 3000, 5000), (128, 8192, 8192)):
    xs = [(torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16().t()) for _ in range(4)]
    calls = [[lambda a=a, b=b: torch.mm(a, b) for a, b in xs], [lambda a=a, b=b: pg.mm(a, b) for a, b in xs]]
    calls += [[lambda a=a, b=b, c=c: pg.mm(a, b, config=c) for a, b in xs] for c in names]
    t = [statistics.median(v) for v in replay_times(calls, 9, 10)]
    print(f"{m}x{n}x{k}: torch.mm {t[0]:.1f} us, default {t[1]:.1f} us ({t[0] / t[1]:.2f}x)")
    for c, v in zip(names, t[2:]):
        print(f"   {v:8.1f} us  {t[0] / v:5.2f}x  {c}")
