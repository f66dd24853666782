"""The main job: run every op once and check it against a float64 reference.

``python -m persistent_gemm demo`` runs on the GPU when there is one with kernels built for it,
and otherwise says so and runs the CPU references, which define the ops' semantics.
"""

from __future__ import annotations

import time

import torch

import persistent_gemm as pg
from persistent_gemm.archs import by_capability


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _device() -> tuple[str, str]:
    if not torch.cuda.is_available():
        return "cpu", "no CUDA GPU visible: running the CPU reference implementations"
    major, minor = torch.cuda.get_device_capability()
    spec = by_capability(major, minor)
    arch = spec.name if spec else None
    name = torch.cuda.get_device_name()
    if arch is None or arch not in pg.built_archs():
        return "cpu", f"{name} (sm_{major}{minor}) has no kernels in this build: running the CPU references"
    return "cuda", f"{name} ({arch})"


def _time(fn, device: str) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    pg.require_extension()
    device, note = _device()
    print(f"persistent_gemm {pg.__version__}: {note}")
    m, n, k = (4096, 4096, 4096) if device == "cuda" else (256, 384, 512)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    a16, b16 = x.to(torch.bfloat16).to(device), w.to(torch.bfloat16).to(device).t()
    a8, b8 = x.to(torch.float8_e4m3fn).to(device), w.to(torch.float8_e4m3fn).to(device).t()
    one = torch.ones((), device=device)
    xq, xs = pg.quantize_mxfp8(x.to(device))
    wq8, ws8 = pg.quantize_mxfp8(w.to(device))
    wq4, ws4 = pg.quantize_mxfp4(w.to(device))
    deq_x = pg.dequantize_mxfp8(xq, xs).double()
    runs = [
        ("mm bf16", lambda: pg.mm(a16, b16), a16.double() @ b16.double()),
        ("scaled_mm e4m3", lambda: pg.scaled_mm(a8, b8, one, one), a8.double() @ b8.double()),
        ("mxfp8_mm", lambda: pg.mxfp8_mm(xq, xs, wq8.t(), ws8), deq_x @ pg.dequantize_mxfp8(wq8, ws8).double().t()),
        ("fp8_fp4_mm", lambda: pg.fp8_fp4_mm(xq, xs, wq4.t(), ws4), deq_x @ pg.dequantize_mxfp4(wq4, ws4).double().t()),
    ]
    failed = 0
    for name, fn, ref in runs:
        try:
            ms = _time(fn, device)
            err = _rel(fn(), ref)
        except RuntimeError as e:  # an op with no kernel for this GPU says so; report it
            print(f"  {name:<16} {m}x{n}x{k}: not available here: {str(e).splitlines()[0]}")
            continue
        ok = err < 1e-2
        failed += not ok
        print(f"  {name:<16} {m}x{n}x{k} on {device}: rel. error vs float64 {err:.2e} "
              f"[{'ok' if ok else 'FAIL'}], {ms:.2f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
