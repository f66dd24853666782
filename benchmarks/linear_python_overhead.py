"""The Python share of a swapped Linear's host cost (issue 23), on any device: a tiny (1 x 64)
Linear's forward against its op called directly, per format, median-free wall time of many calls
under inference_mode. Device-independent: it times the module's own lines, not the kernel.

    python benchmarks/linear_python_overhead.py
"""
import time, torch, persistent_gemm as pg
torch.manual_seed(0)
def bench(fn, n=20000):
    for _ in range(200): fn()
    t=time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter()-t)/n*1e6
with torch.inference_mode():
  for fmt in ("bf16", "mxfp8_weight_only", "mxfp8"):
    lin = pg.nn.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 64)), fmt)[0].to(torch.bfloat16) if fmt!="mxfp8" else pg.nn.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 64)), fmt)[0]
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    ops = torch.ops.persistent_gemm
    if fmt == "bf16":
        w = lin.weight.t(); b = lin.bias.to(torch.bfloat16)
        op = lambda: ops.mm.default(x, w, torch.bfloat16, None, b)
    elif fmt == "mxfp8":
        op = lambda: ops.quantized_linear.default(x, lin.weight_q, lin.weight_scale, "mxfp8", torch.bfloat16, lin.bias.to(torch.bfloat16), "floor", False, None)
    else:
        w = lin.weight_q.t(); s = lin.weight_scale; b = lin.bias.to(torch.bfloat16)
        op = lambda: ops.weight_only_mm.default(x, w, s, torch.bfloat16, "blocked", None, b)
    f, o = bench(lambda: lin(x)), bench(op)
    print(f"{fmt:20s} forward {f:6.1f} us  op {o:6.1f} us  python {f-o:5.1f} us")
