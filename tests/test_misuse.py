"""What a newcomer does wrong, answered with a clear error (issue 23, newcomer report #4, #11,
#13): operands split between the meta device and a real one are refused with both devices named
(the dispatcher runs an op's Meta kernel -- our fake -- whenever any operand is on meta, and the
fake used to return an uninitialised tensor on the real operand's device), while operands all on
meta still give meta results of the right shape; wrong Python types get a TypeError naming the
argument; an unbuilt package says what is missing; the MX ops' old argument order (#7) is named."""

import pytest
import torch

import persistent_gemm as pg

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="needs the built extension (the ops' schemas)")


def _operands():
    a16, b16 = torch.randn(4, 64).bfloat16(), torch.randn(64, 3).bfloat16()
    a8, b8 = torch.randn(4, 64).to(torch.float8_e4m3fn), torch.randn(3, 64).to(torch.float8_e4m3fn).t()
    xq, xs = pg.quantize_mxfp8(torch.randn(4, 64))
    wq8, ws8 = pg.quantize_mxfp8(torch.randn(3, 64))
    wq4, ws4 = pg.quantize_mxfp4(torch.randn(3, 64))
    return {
        "mm": (torch.ops.persistent_gemm.mm.default, dict(a=a16, b=b16)),
        "scaled_mm": (torch.ops.persistent_gemm.scaled_mm.default,
                      dict(a=a8, b=b8, scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0))),
        "mxfp8_mm": (torch.ops.persistent_gemm.mxfp8_mm.default, dict(a=xq, b=wq8.t(), scale_a=xs, scale_b=ws8)),
        "fp8_fp4_mm": (torch.ops.persistent_gemm.fp8_fp4_mm.default, dict(a=xq, b=wq4.t(), scale_a=xs, scale_b=ws4)),
        "dequantize_mx": (torch.ops.persistent_gemm.dequantize_mx.default, dict(data=wq8, scale=ws8)),
    }


CASES = [(op, arg) for op, (_, args) in _operands().items() for arg in args if arg != next(iter(args))]


@pytest.mark.parametrize("op, arg", CASES, ids=[f"{o}-{a}" for o, a in CASES])
def test_a_meta_operand_beside_cpu_ones_is_refused(op, arg):
    fn, args = _operands()[op]
    first = next(iter(args))
    args = dict(args, **{arg: args[arg].to("meta")})
    with pytest.raises(ValueError, match=rf"{op}: {arg} is on meta but {first} is on cpu.*materialised"):
        fn(*args.values())


@pytest.mark.parametrize("op", list(_operands()))
def test_all_meta_operands_give_meta_results(op):
    fn, args = _operands()[op]
    out = fn(*(t.to("meta") for t in args.values()))
    want = fn(*args.values())
    assert out.device.type == "meta" and out.shape == want.shape and out.dtype == want.dtype


def test_the_typed_wrappers_refuse_too():
    xq, xs = pg.quantize_mxfp8(torch.randn(4, 64))
    wq, ws = pg.quantize_mxfp8(torch.randn(3, 64))
    with pytest.raises(ValueError, match="b is on meta but a is on cpu"):
        pg.mxfp8_mm(xq, wq.t().to("meta"), xs, ws)
    with pytest.raises(ValueError, match="a is on meta|b is on cpu but a is on meta"):
        pg.mm(torch.randn(4, 8).bfloat16().to("meta"), torch.randn(8, 3).bfloat16())


def test_wrong_python_types_get_a_typeerror_naming_the_argument():
    # newcomer report #13: not the schema parser's C++ types
    a16, b16 = torch.randn(4, 64).bfloat16(), torch.randn(64, 3).bfloat16()
    with pytest.raises(TypeError, match=r"mm: out_dtype must be a torch.dtype .*got 'bf16'"):
        pg.mm(a16, b16, out_dtype="bf16")
    a8, b8 = a16.to(torch.float8_e4m3fn), b16.to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"scaled_mm: scale_a must be a torch.Tensor, got float"):
        pg.scaled_mm(a8, b8, 1.0, 1.0)
    xq, xs = pg.quantize_mxfp8(torch.randn(4, 64))
    wq, ws = pg.quantize_mxfp8(torch.randn(3, 64))
    with pytest.raises(TypeError, match=r"mxfp8_mm: bias must be a torch.Tensor or None, got list"):
        pg.mxfp8_mm(xq, wq.t(), xs, ws, bias=[0.0, 0.0, 0.0])


def test_an_unbuilt_package_says_so_without_import_machinery_text(tmp_path):
    # newcomer report #11: "cannot import name '_C' from partially initialized module (most likely
    # due to a circular import)" for a Python-only install; now it says what is missing.
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    src = Path(pg.__file__).parent
    dst = tmp_path / "persistent_gemm"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    code = ("import persistent_gemm as pg\n"
            "try:\n    pg.require_extension()\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=120).stdout
    assert "Python-only install, or a checkout not built yet" in out and "circular import" not in out, out


@pytest.mark.parametrize("op", ["mxfp8_mm", "fp8_fp4_mm"])
def test_the_mx_ops_take_torchs_argument_order_and_name_it(op):
    # Newcomer report #7: every op takes (a, b, scale_a, scale_b), as torch._scaled_mm; the
    # 0.1 order (a, a_scale, b, b_scale) gets an error naming the order, from the wrapper and
    # from the op itself.
    fn, kw = _operands()[op]
    a, b, sa, sb = kw["a"], kw["b"], kw["scale_a"], kw["scale_b"]
    want = fn(a, b, sa, sb)
    torch.testing.assert_close(getattr(pg, op)(a, b, sa, sb), want)
    torch.testing.assert_close(getattr(pg, op)(a, b, scale_a=sa, scale_b=sb), want)
    for call in (lambda: getattr(pg, op)(a, sa, b, sb), lambda: fn(a, sa, b, sb)):
        with pytest.raises(TypeError, match=r"takes \(a, b, scale_a, scale_b\), torch._scaled_mm's order.*"
                                            r"e8m0 scale tensor as b"):
            call()
    fmt = "mxfp8" if op == "mxfp8_mm" else "fp4"
    pw = pg.prepare_weight(b.t(), sb, fmt=fmt)
    torch.testing.assert_close(getattr(pg, op)(a, pw, sa), want)
    with pytest.raises(TypeError, match="e8m0 scale tensor as b"):
        getattr(pg, op)(a, sa, pw)
    assert "fmt=" in repr(pw) and "tensor(" not in repr(pw)
