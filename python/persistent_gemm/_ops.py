"""Python side of the ops: fake kernels and the typed wrappers.

Schemas live in C++ (``csrc/ops.cpp``), and so does ``mm``'s autograd: a Python autograd kernel
would sit on every eager call's path. This module registers the fake kernels the compiler
needs and wraps ``torch.ops.persistent_gemm.*`` with signatures and docstrings.
Fake kernels check ranks, dtypes and extents with ``torch._check`` so shape errors surface at
trace time; strides and alignment are the real kernels' business (their checks are in C++).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import torch

from . import jit as _jit
from .quant import _NATIVE_DTYPES
from .scale_layout import SCALE_LAYOUTS, padded_extents

if TYPE_CHECKING:
    from .catalogue import KernelConfig

_LIB = "persistent_gemm"
_MX_BLOCK = 32
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _out(out_dtype: Optional[torch.dtype], default: torch.dtype) -> torch.dtype:
    o = default if out_dtype is None else out_dtype
    torch._check(o in _OUT_DTYPES, lambda: f"out_dtype must be bfloat16, float16 or float32, got {o}")
    return o


def _check_2d(name: str, t: torch.Tensor) -> None:
    torch._check(t.dim() == 2, lambda: f"{name} must be a 2-D tensor, got {t.dim()}-D")


def _check_k(a: torch.Tensor, k_b) -> None:
    torch._check(a.shape[1] == k_b, lambda: f"a is (M, K) = {tuple(a.shape)} but b's K extent is {k_b}")


def _check_scale(name: str, s: torch.Tensor, rows, k, scale_layout: str, layout_arg: str = "scale_layout") -> None:
    torch._check(s.dtype == torch.float8_e8m0fnu, lambda: f"{name} must be float8_e8m0fnu, got {s.dtype}")
    blocks = (k + _MX_BLOCK - 1) // _MX_BLOCK
    torch._check(scale_layout in SCALE_LAYOUTS,
                 lambda: f"{layout_arg} must be 'plain' or 'blocked', got {scale_layout!r}")
    if scale_layout == "blocked":
        padded_rows, padded_blocks = padded_extents(rows, blocks)
        want = padded_rows * padded_blocks
        torch._check(s.numel() == want, lambda: f"{name} in the blocked layout must hold {want} scales, got {s.numel()}")
        return
    _check_2d(name, s)
    torch._check(s.shape[0] == rows and s.shape[1] == blocks,
                 lambda: f"{name} must be ({rows}, {blocks}), got {tuple(s.shape)}")


def _check_b_scale(s, rows, k, scale_layout, scale_b_layout) -> None:
    if scale_b_layout is None:
        _check_scale("scale_b", s, rows, k, scale_layout)
    else:
        _check_scale("scale_b", s, rows, k, scale_b_layout, "scale_b_layout")


def _check_bias(bias: Optional[torch.Tensor], n, out_dtype: torch.dtype) -> None:
    if bias is None:
        return
    torch._check(bias.dim() == 1 and bias.shape[0] == n,
                 lambda: f"bias must be a 1-D tensor of N = {n} elements, got shape {tuple(bias.shape)}")
    torch._check(bias.dtype == out_dtype, lambda: f"bias must have the output's dtype {out_dtype}, got {bias.dtype}")


def _result(a: torch.Tensor, n, out_dtype: torch.dtype, bias: Optional[torch.Tensor]) -> torch.Tensor:
    _check_bias(bias, n, out_dtype)
    return a.new_empty((a.shape[0], n), dtype=out_dtype)


def _check_devices(op: str, **tensors) -> None:
    """Every given tensor on ``a``'s device. The fakes are also the ops' Meta kernels, which the
    dispatcher runs whenever any operand is on the meta device, so a real CPU/CUDA operand beside
    a meta one lands here: without this check the op would hand back an uninitialised tensor on
    the real operand's device (values like -7e21, no error)."""
    first_name, first = next((n, t) for n, t in tensors.items() if t is not None)
    for name, t in tensors.items():
        if t is not None and t.device != first.device:
            hint = (" (a model loaded on the meta device must be materialised first, e.g. "
                    "model.to_empty(device=...) and then its weights loaded)"
                    if "meta" in (t.device.type, first.device.type) else "")
            raise ValueError(f"persistent_gemm.{op}: {name} is on {t.device} but {first_name} is on {first.device}; "
                             f"all operands must be on one device{hint}")


@torch.library.register_fake(f"{_LIB}::mm")
def _mm_fake(a, b, out_dtype=None, config=None, bias=None, alpha=1.0, beta=1.0):
    _check_devices("mm", a=a, b=b, bias=bias)
    _check_2d("a", a)
    _check_2d("b", b)
    torch._check(a.dtype in (torch.bfloat16, torch.float16), lambda: f"a must be bfloat16 or float16, got {a.dtype}")
    torch._check(b.dtype == a.dtype, lambda: f"b must have a's dtype {a.dtype}, got {b.dtype}")
    _check_k(a, b.shape[0])
    return _result(a, b.shape[1], _out(out_dtype, a.dtype), bias)


@torch.library.register_vmap(f"{_LIB}::mm")
def _mm_vmap(info, in_dims, a, b, out_dtype=None, config=None, bias=None, alpha=1.0, beta=1.0):
    """torch.vmap(mm): a batch of activations against one weight (and one bias) is one GEMM
    over the stacked rows (B*M, K) @ (K, N); batched weights or biases run one GEMM per batch
    element. Either way no per-example fallback warning."""
    a_dim, b_dim = in_dims[0], in_dims[1]
    bias_dim = in_dims[4] if len(in_dims) > 4 else None  # in_dims covers the arguments given
    mm_ = torch.ops.persistent_gemm.mm.default
    if b_dim is None and bias_dim is None:
        a = a.movedim(a_dim, 0)
        batch, m, k = a.shape
        return mm_(a.reshape(batch * m, k), b, out_dtype, config, bias, alpha, beta).reshape(batch, m, -1), 0
    size = info.batch_size
    a = a.movedim(a_dim, 0) if a_dim is not None else a.expand(size, *a.shape)
    b = b.movedim(b_dim, 0) if b_dim is not None else b.expand(size, *b.shape)
    if bias is not None:
        bias = bias.movedim(bias_dim, 0) if bias_dim is not None else bias.expand(size, *bias.shape)
    return torch.stack([mm_(a[i], b[i], out_dtype, config, None if bias is None else bias[i], alpha, beta)
                        for i in range(size)]), 0


@torch.library.register_fake(f"{_LIB}::scaled_mm")
def _scaled_mm_fake(a, b, scale_a, scale_b, out_dtype=None, use_fast_accum=False, config=None, bias=None,
                    alpha=1.0, beta=1.0):
    _check_devices("scaled_mm", a=a, b=b, scale_a=scale_a, scale_b=scale_b, bias=bias)
    _check_2d("a", a)
    _check_2d("b", b)
    torch._check(a.dtype == torch.float8_e4m3fn and b.dtype == torch.float8_e4m3fn,
                 lambda: f"a and b must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    torch._check(scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32,
                 lambda: "scale_a and scale_b must be float32")
    _check_k(a, b.shape[0])
    return _result(a, b.shape[1], _out(out_dtype, torch.bfloat16), bias)


@torch.library.register_fake(f"{_LIB}::mxfp8_mm")
def _mxfp8_mm_fake(a, b, scale_a, scale_b, out_dtype=None, scale_layout="plain", config=None, scale_b_layout=None,
                   bias=None):
    _refuse_old_order("mxfp8_mm", a, b)
    _check_devices("mxfp8_mm", a=a, b=b, scale_a=scale_a, scale_b=scale_b, bias=bias)
    _check_2d("a", a)
    _check_2d("b", b)
    torch._check(a.dtype == torch.float8_e4m3fn and b.dtype == torch.float8_e4m3fn,
                 lambda: f"a and b must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    _check_k(a, b.shape[0])
    _check_scale("scale_a", scale_a, a.shape[0], a.shape[1], scale_layout)
    _check_b_scale(scale_b, b.shape[1], a.shape[1], scale_layout, scale_b_layout)
    return _result(a, b.shape[1], _out(out_dtype, torch.bfloat16), bias)


@torch.library.register_fake(f"{_LIB}::weight_only_mm")
def _weight_only_mm_fake(a, b, scale_b, out_dtype=None, scale_b_layout="blocked", config=None, bias=None):
    _check_devices("weight_only_mm", a=a, b=b, scale_b=scale_b, bias=bias)
    _check_2d("a", a)
    _check_2d("b", b)
    torch._check(a.dtype in (torch.bfloat16, torch.float16), lambda: f"a must be bfloat16 or float16, got {a.dtype}")
    e2m1 = b.dtype == torch.float4_e2m1fn_x2
    torch._check(e2m1 or b.dtype == torch.float8_e4m3fn,
                 lambda: f"b must be float8_e4m3fn or float4_e2m1fn_x2, got {b.dtype}")
    _check_k(a, b.shape[0] * (2 if e2m1 else 1))
    _check_scale("scale_b", scale_b, b.shape[1], a.shape[1], scale_b_layout, "scale_b_layout")
    out = _out(out_dtype, a.dtype)
    torch._check(out in (a.dtype, torch.float32), lambda: f"out_dtype must be {a.dtype} or float32, got {out}")
    return _result(a, b.shape[1], out, bias)


@torch.library.register_fake(f"{_LIB}::fp8_fp4_mm")
def _fp8_fp4_mm_fake(a, b, scale_a, scale_b, out_dtype=None, scale_layout="plain", config=None,
                     scale_b_layout=None, bias=None):
    _refuse_old_order("fp8_fp4_mm", a, b)
    _check_devices("fp8_fp4_mm", a=a, b=b, scale_a=scale_a, scale_b=scale_b, bias=bias)
    _check_2d("a", a)
    _check_2d("b", b)
    torch._check(a.dtype == torch.float8_e4m3fn, lambda: f"a must be float8_e4m3fn, got {a.dtype}")
    torch._check(b.dtype == torch.float4_e2m1fn_x2, lambda: f"b must be float4_e2m1fn_x2, got {b.dtype}")
    torch._check(a.shape[1] % _MX_BLOCK == 0, lambda: f"K = {a.shape[1]} must be a multiple of 32")
    _check_k(a, b.shape[0] * 2)
    _check_scale("scale_a", scale_a, a.shape[0], a.shape[1], scale_layout)
    _check_b_scale(scale_b, b.shape[1], a.shape[1], scale_layout, scale_b_layout)
    return _result(a, b.shape[1], _out(out_dtype, torch.bfloat16), bias)


@torch.library.impl(f"{_LIB}::dequantize_mx", "CPU")
def _dequantize_mx_cpu(data, scale):
    # The definition (quant.py), rounded to bf16 once; the CUDA kernel matches it bit for bit.
    from .quant import dequantize_mxfp4, dequantize_mxfp8

    fp4 = data.dtype == torch.float4_e2m1fn_x2
    return (dequantize_mxfp4 if fp4 else dequantize_mxfp8)(data, scale).to(torch.bfloat16)


@torch.library.register_fake(f"{_LIB}::dequantize_mx")
def _dequantize_mx_fake(data, scale):
    _check_devices("dequantize_mx", data=data, scale=scale)
    k = data.shape[1] * (2 if data.dtype == torch.float4_e2m1fn_x2 else 1)
    return data.new_empty((data.shape[0], k), dtype=torch.bfloat16)


def _check_quantizer_input(x):
    """The CUDA quantizers' input rules (csrc/quantize.cpp): 2-D, bf16 / fp16 / fp32."""
    _check_2d("x", x)
    torch._check(x.dtype in _NATIVE_DTYPES, lambda: f"x must be bfloat16, float16 or float32, got {x.dtype}")


@torch.library.register_fake(f"{_LIB}::quantize_mxfp8")
def _quantize_mxfp8_fake(x, rule="floor"):
    _check_quantizer_input(x)
    rows, k = x.shape
    return (x.new_empty((rows, k), dtype=torch.float8_e4m3fn),
            x.new_empty((rows, (k + _MX_BLOCK - 1) // _MX_BLOCK), dtype=torch.float8_e8m0fnu))


@torch.library.register_fake(f"{_LIB}::quantize_rowwise_e4m3")
def _quantize_rowwise_e4m3_fake(x):
    _check_quantizer_input(x)
    rows, k = x.shape
    return x.new_empty((rows, k), dtype=torch.float8_e4m3fn), x.new_empty((rows, 1), dtype=torch.float32)


# -- typed wrappers ----------------------------------------------------------------------------
ConfigArg = Union[str, "KernelConfig", None]


def _check_types(op: str, out_dtype, bias, **tensors) -> None:
    """Python types before the schema parser sees them (its messages name C++ types)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"persistent_gemm.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"persistent_gemm.{op}: out_dtype must be a torch.dtype such as torch.bfloat16 (or None), "
                        f"got {out_dtype!r}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"persistent_gemm.{op}: bias must be a torch.Tensor or None, got {type(bias).__name__}")


def _config(config: ConfigArg, op: str, family: str, device: torch.device) -> Optional[str]:
    """``config=`` as the dispatcher's name: a canonical name or a KernelConfig, built or not
    (persistent_gemm.jit compiles a valid spec at first use, after checking that it fits the op,
    the operands' dtype family and the device). Under torch.compile the config must already be
    runnable (precompile it, or call the op once eagerly): the trace only passes the name."""
    if config is None:
        return None
    if torch.compiler.is_compiling():
        return config if isinstance(config, str) else config.name
    return _jit.runnable(config, op=op, family=family, device=device)


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: Optional[torch.dtype] = None,
       config: ConfigArg = None, bias: Optional[torch.Tensor] = None, alpha: float = 1.0,
       beta: float = 1.0) -> torch.Tensor:
    """``a @ b`` for bf16/fp16 ``a`` (M, K) and ``b`` (K, N), fp32 accumulation.

    ``b`` may be a :class:`PreparedWeight` (MXFP8 or MXFP4, :func:`prepare_weight`): a
    weight-only MX GEMM, the activations staying 16-bit (``torch.ops.persistent_gemm.weight_only_mm``;
    output in ``a``'s dtype or fp32, ``bias`` as here, no ``alpha``/``beta``). On an SM90 GPU,
    bf16 activations run fused kernels: the decode GEMV up to 64 tokens when K % 32 == 0, else
    the bf16-route kernels (``..._swapab_bf16route``). fp16 activations, a build with no fitting
    kernel, and CPU tensors run the op's exact reference: the weight dequantized exactly, fp32
    sums, one rounding. :func:`explain` (dtype ``"bf16xe4m3"`` / ``"bf16xe2m1"``) says which;
    ``config`` forces a kernel. Other GPUs: docs/api.md.

    Row- and column-major operands run without copies; any other strides (stride-0 broadcast
    views such as ``x.expand(M, K)``, misaligned rows) are copied once to a K-major buffer.
    ``out_dtype`` defaults to the input dtype (bf16, fp16 or fp32 allowed). ``config`` forces a
    kernel: a canonical name or a :class:`KernelConfig`, in the build or not (a valid spec that
    is not built is compiled once at first use and cached; see :mod:`persistent_gemm.jit`).
    Semantics (the CPU reference): ``(alpha * (a.float() @ b.float()) + beta * bias.float()).to(out_dtype)``:
    ``bias`` (N,) has the output's dtype and is added in the kernel's epilogue in fp32, one
    rounding (on SM90; SM100 kernels add it after, unfused). ``beta == 0`` ignores the bias.
    Differentiable in ``a``, ``b`` and ``bias``: the backward is two ``mm`` calls and a sum.
    """
    from .prepare import PreparedWeight

    if isinstance(b, PreparedWeight):
        if alpha != 1.0 or beta != 1.0:
            raise ValueError("mm with a PreparedWeight (weight-only MX) takes no alpha / beta; scale the output instead")
        _check_types("mm", out_dtype, bias, a=a)
        family = "bf16xe2m1" if b.b.dtype == torch.float4_e2m1fn_x2 else "bf16xe4m3"
        return torch.ops.persistent_gemm.weight_only_mm.default(a, b.b, b.scale_b, out_dtype, b.scale_b_layout,
                                                                _config(config, "weight_only_mm", family, a.device),
                                                                bias)
    _check_types("mm", out_dtype, bias, a=a, b=b)
    return torch.ops.persistent_gemm.mm.default(
        a, b, out_dtype, _config(config, "mm", "fp16" if a.dtype == torch.float16 else "bf16", a.device),
        bias, float(alpha), float(beta))


def addmm(input: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1.0, alpha: float = 1.0,
          out_dtype: Optional[torch.dtype] = None, config: ConfigArg = None) -> torch.Tensor:
    """``beta * input + alpha * (a @ b)``, like ``torch.addmm``, through :func:`mm`.

    A row bias ``input`` of shape (N,) or (1, N) is fused into the epilogue. Any other shape
    broadcastable to (M, N) -- a full (M, N) matrix, a column (M, 1), a scalar -- is added
    after the GEMM by torch (unfused, a second rounding for 16-bit outputs).
    """
    if isinstance(b, torch.Tensor) and b.dim() == 1:  # addmm(a, w.t(), bias): mm would only say "b must be 2-D"
        raise ValueError(f"persistent_gemm.addmm takes torch.addmm's order, addmm(input, a, b), the bias first: b "
                         f"is 1-D {tuple(b.shape)}; call addmm(bias, a, b)")
    out = a.dtype if out_dtype is None else out_dtype
    n = b.shape[-1] if b.dim() == 2 else None
    if input.dim() in (1, 2) and input.shape[-1] == n and (input.dim() == 1 or input.shape[0] == 1):
        return mm(a, b, out_dtype=out_dtype, config=config, bias=input.reshape(-1).to(out), alpha=alpha, beta=beta)
    y = mm(a, b, out_dtype=torch.float32, config=config, alpha=alpha)
    return (y + input.float() * beta if beta != 0 else y).to(out)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
              out_dtype: Optional[torch.dtype] = None, use_fast_accum: bool = False,
              config: ConfigArg = None, bias: Optional[torch.Tensor] = None, alpha: float = 1.0,
              beta: float = 1.0) -> torch.Tensor:
    """FP8 ``a @ b`` with fp32 scales, like ``torch._scaled_mm``.

    ``a`` (M, K) e4m3 row-major, ``b`` (K, N) e4m3 column-major. Scales are fp32, either both
    tensorwise (one element each) or rowwise (``scale_a`` (M, 1), ``scale_b`` (1, N)).
    Semantics: ``(alpha * scale_a * scale_b * (a.float() @ b.float()) + beta * bias).to(out_dtype)``,
    scales applied to the fp32 accumulator; ``out_dtype`` defaults to bf16; ``bias`` (N,) of
    the output's dtype, fused in the epilogue as for :func:`mm` (``torch._scaled_mm``'s bias).

    ``use_fast_accum`` has ``torch._scaled_mm``'s meaning and default. ``False`` runs kernels
    that promote the FP8 partial sums into an fp32 accumulator every K-tile (128 K-elements),
    matching torch's accuracy. ``True`` also admits the ``*_fastacc`` kernels, which keep the
    sums in the tensor core's reduced-precision accumulator for the whole K loop: faster on
    compute-bound shapes, with an error that grows with K (``explain(..., use_fast_accum=True)``
    says which one runs). A forced ``config`` ending in ``_fastacc`` needs ``use_fast_accum=True``.
    On SM100 (tcgen05) the accumulation is fp32 throughout: no ``_fastacc`` kernel exists there
    and both values run the same kernels (tensorwise / rowwise scales applied in the epilogue;
    bias, alpha and beta after the kernel, as for every SM100 kernel).
    """
    _check_types("scaled_mm", out_dtype, bias, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    return torch.ops.persistent_gemm.scaled_mm.default(a, b, scale_a, scale_b, out_dtype, use_fast_accum,
                                                       _config(config, "scaled_mm", "e4m3", a.device),
                                                       bias, float(alpha), float(beta))


def _refuse_old_order(op: str, a, b) -> None:
    """An e8m0 tensor in an operand's slot: the (a, a_scale, b, b_scale) order of 0.1 (the C++
    checks say the same for direct torch.ops calls)."""
    for name, t in (("b", b), ("a", a)):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float8_e8m0fnu:
            raise TypeError(f"persistent_gemm.{op} takes (a, b, scale_a, scale_b), torch._scaled_mm's order: operands "
                            f"first, then their scales; got an e8m0 scale tensor as {name} (the (a, a_scale, b, "
                            f"b_scale) order of persistent_gemm 0.1 is gone)")


def _weight_args(b, scale_b, scale_b_layout, fmt: str):
    """(b, scale_b, scale_b_layout) from either plain tensors or a PreparedWeight."""
    from .prepare import PreparedWeight

    if isinstance(b, PreparedWeight):
        if scale_b is not None:
            raise ValueError("b is a PreparedWeight, which carries its own scales: leave scale_b out")
        if b.fmt != fmt:
            raise ValueError(f"b is a PreparedWeight for fmt={b.fmt!r}; this op needs fmt={fmt!r}")
        return b.b, b.scale_b, b.scale_b_layout
    if scale_b is None:
        raise ValueError("scale_b is required unless b is a PreparedWeight (persistent_gemm.prepare_weight)")
    return b, scale_b, scale_b_layout


def mxfp8_mm(a: torch.Tensor, b, scale_a: torch.Tensor, scale_b: Optional[torch.Tensor] = None, *,
             out_dtype: Optional[torch.dtype] = None, scale_layout: str = "plain",
             config: ConfigArg = None, scale_b_layout: Optional[str] = None,
             bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """MXFP8 block-scaled ``a @ b`` (``+ bias``, (N,) of the output's dtype, fused on SM90).

    Arguments in ``torch._scaled_mm``'s order, as :func:`scaled_mm` and :func:`fp8_fp4_mm`:
    ``mxfp8_mm(a, b, scale_a, scale_b)``, or ``mxfp8_mm(a, pw, scale_a)`` with a prepared weight.

    ``a`` (M, K) e4m3 row-major with ``scale_a`` (M, ceil(K/32)) e8m0; ``b`` (K, N) e4m3
    column-major with ``scale_b`` (N, ceil(K/32)) e8m0. Each scale covers 32 consecutive K
    elements of one row of ``a`` (one column of ``b``); the last block may be partial.
    Semantics: dequantize exactly (``x * 2**(e - 127)``), multiply in fp32, round once.
    Use :func:`persistent_gemm.quantize_mxfp8` to produce the operands.

    ``scale_layout`` says how the scales are laid out: ``"plain"`` (the shapes above) or
    ``"blocked"`` (the 128x4-tile layout of cuBLAS/CUTLASS and torchao's ``to_blocked``;
    :func:`persistent_gemm.to_blocked` converts). It is never guessed from the shapes.
    ``scale_b_layout`` overrides it for ``scale_b`` alone. ``b`` may be a
    :class:`PreparedWeight` (:func:`prepare_weight`), which carries its scales: omit ``scale_b``.

    On SM90 the dispatcher picks one of three fused kernels by shape (``explain`` says which):
    at prefill the bf16 route (both scales folded exactly into bf16 operands -- the weight in
    registers, the activations by a pre-pass launch -- and bf16 wgmma over the whole K, no
    per-block promotion); the promotion route (e4m3 wgmma per 32-deep K block, promoted into
    fp32 with its two scales); at decode (M <= 64, K % 32 == 0) the MX decode GEMV (mma.sync per
    block across every SM, stream-K over weight strips). Weight scales are read blocked: plain
    ones are relaid out per call unless the weight is prepared.
    """
    return _mx_op("mxfp8_mm", "mxfp8", "mxfp8", a, b, scale_a, scale_b, out_dtype, scale_layout, config,
                  scale_b_layout, bias)


def fp8_fp4_mm(a: torch.Tensor, b, scale_a: torch.Tensor, scale_b: Optional[torch.Tensor] = None, *,
               out_dtype: Optional[torch.dtype] = None, scale_layout: str = "plain",
               config: ConfigArg = None, scale_b_layout: Optional[str] = None,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """e4m3 activations times block-scaled e2m1 weights (``+ bias``, as for :func:`mxfp8_mm`).

    ``a`` (M, K) e4m3 row-major with ``scale_a`` (M, K/32) e8m0; ``b`` (K/2, N)
    ``float4_e2m1fn_x2`` column-major -- the transpose of weights stored (N, K/2), two e2m1
    values per byte, element 2i in the low nibble -- with ``scale_b`` (N, K/32) e8m0.
    K must be a multiple of 32. For weights ``w`` (N, K): ``wq, ws = quantize_mxfp4(w)``, then
    ``fp8_fp4_mm(a, wq.t(), scale_a, ws)``, or ``fp8_fp4_mm(a, prepare_weight(wq, ws, fmt="fp4"), scale_a)``.
    ``scale_layout``, ``scale_b_layout``: as for :func:`mxfp8_mm`.

    On SM90 the packed weight is streamed as is and converted in registers inside the GEMM (the
    weight is the MMA's register-sourced A operand; D is written transposed): to bf16 with its
    scale folded by the bf16 route at prefill, to e4m3 by the promotion route, to f16 / e4m3 by
    the MX decode GEMV (mma.sync, stream-K over weight strips) at M <= 64. The fold route
    (``config="sm90a_e4m3xe2m1_128x128x128_c1x2_sw8_row_coop_swapab_fold"``: the weight's scale
    folded into its e4m3 conversion) ran at half the promotion kernel's speed on the H200; the
    dispatcher never picks it, so only ``config=`` reaches it (docs/api.md).
    """
    return _mx_op("fp8_fp4_mm", "fp4", "e4m3xe2m1", a, b, scale_a, scale_b, out_dtype, scale_layout, config,
                  scale_b_layout, bias)


def _mx_op(op: str, fmt: str, family: str, a, b, scale_a, scale_b, out_dtype, scale_layout, config, scale_b_layout,
           bias) -> torch.Tensor:
    """The body of both MX ops: a prepared weight's own scales, the type checks, then the op."""
    _refuse_old_order(op, a, b)
    b, scale_b, scale_b_layout = _weight_args(b, scale_b, scale_b_layout, fmt)
    _check_types(op, out_dtype, bias, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    return getattr(torch.ops.persistent_gemm, op).default(a, b, scale_a, scale_b, out_dtype, scale_layout,
                                                         _config(config, op, family, a.device), scale_b_layout, bias)
