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


def _op(name):
    """The op's default overload, looked up when called: collection needs no extension."""
    return lambda *args, **kwargs: getattr(torch.ops.persistent_gemm, name).default(*args, **kwargs)


def _operands():
    a16, b16 = torch.randn(4, 64).bfloat16(), torch.randn(64, 3).bfloat16()
    a8, b8 = torch.randn(4, 64).to(torch.float8_e4m3fn), torch.randn(3, 64).to(torch.float8_e4m3fn).t()
    xq, xs = pg.quantize_mxfp8(torch.randn(4, 64))
    wq8, ws8 = pg.quantize_mxfp8(torch.randn(3, 64))
    wq4, ws4 = pg.quantize_mxfp4(torch.randn(3, 64))
    return {
        "mm": (_op("mm"), dict(a=a16, b=b16)),
        "scaled_mm": (_op("scaled_mm"),
                      dict(a=a8, b=b8, scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0))),
        "mxfp8_mm": (_op("mxfp8_mm"), dict(a=xq, b=wq8.t(), scale_a=xs, scale_b=ws8)),
        "fp8_fp4_mm": (_op("fp8_fp4_mm"), dict(a=xq, b=wq4.t(), scale_a=xs, scale_b=ws4)),
        "dequantize_mx": (_op("dequantize_mx"), dict(data=wq8, scale=ws8)),
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


def test_one_format_answers_to_its_other_names():
    # Newcomer report #19: explain takes the op's name, the pg.nn format, "mxfp4" and torch dtypes
    # beside the family; prepare_weight takes "mxfp4" / "fp8_fp4" for "fp4".
    want = pg.explain(256, 4096, 4096, dtype="e4m3xe2m1").config
    for alias in ("fp8_fp4", "fp8_fp4_mm", "mxfp4"):
        assert pg.explain(256, 4096, 4096, dtype=alias).config == want, alias
    assert pg.explain(256, 4096, 4096, dtype=torch.bfloat16, out_dtype=torch.float32).config == \
        pg.explain(256, 4096, 4096, dtype="bf16", out_dtype="fp32").config
    wq, ws = pg.quantize_mxfp4(torch.randn(48, 128))
    assert pg.prepare_weight(wq, ws, fmt="mxfp4").fmt == "fp4"
    with pytest.raises(ValueError, match=r"fmt must be one of \('mxfp8', 'fp4'\) \(or 'mxfp4'"):
        pg.prepare_weight(wq, ws, fmt="nvfp4")


def test_papercut_errors_name_the_fix():
    # Newcomer report #18, #20, #25: NVFP4 is named as unsupported; the rule's case; a transposed
    # weight handed to prepare_weight or an untransposed one to mm.
    with pytest.raises(ValueError, match="NVFP4 .* is not supported; 'fp8_fp4' is MX FP4"):
        pg.nn.QuantConfig("nvfp4")
    with pytest.raises(ValueError, match="lowercase: torchao's ScaleCalculationMode.RCEIL is 'rceil'"):
        pg.quantize_mxfp8(torch.randn(2, 32), rule="RCEIL")
    wq, ws = pg.quantize_mxfp4(torch.randn(48, 128))
    with pytest.raises(ValueError, match="wq looks transposed"):
        pg.prepare_weight(wq.t(), ws, fmt="fp4")
    a, w = torch.randn(4, 64).bfloat16(), torch.randn(32, 64).bfloat16()
    with pytest.raises(ValueError, match=r"b looks like the \(N, K\) weight itself: pass its transpose"):
        pg.mm(a, w)
