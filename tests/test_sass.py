"""The compiled kernels use the tensor-core instructions they are meant to (checked in SASS).

SM100 code cannot run here; this is how its tcgen05 MMA is shown to be there. cuobjdump comes
from the CUDA toolkit or from the triton package that torch installs.
"""

import importlib
import re
import subprocess

import pytest

import persistent_gemm as pg
from persistent_gemm.catalogue import parse_name
from support.build import cuobjdump

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="extension not built")


def sass(arch: str) -> str:
    if arch not in pg.built_archs():
        pytest.skip(f"{arch} kernels not built")
    mod = importlib.import_module(f"persistent_gemm._C_{arch}")
    out = subprocess.run([cuobjdump(), "--dump-sass", mod.__file__], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _built_families(arch: str) -> set:
    return {e["family"] for e in pg._C.built_kernels() if e["arch"] == arch}


def test_sm90a_uses_wgmma_and_tma():
    text = sass("sm90a")
    fams = _built_families("sm90a")
    if fams & {"bf16", "fp16"}:
        assert re.search(r"\bHGMMA\.64x\d+x16\.F32\.(BF16|F16)", text), "no 16-bit wgmma in the sm90a module"
    if fams & {"e4m3", "mxfp8", "e4m3xe2m1"}:
        assert re.search(r"\bQGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", text), "no fp8 wgmma in the sm90a module"
    assert "UTMALDG" in text, "no TMA loads"
    if fams & {"bf16", "fp16", "e4m3"}:
        assert "UTMASTG" in text, "no TMA stores"
    assert "code for sm_90a" in text


def test_sm90a_mx_kernels_stream_mx_bytes():
    """The MX kernels bulk-copy e8m0 scale atoms (UBLKCP) beside the TMA tiles, and the FP8 x FP4
    kernels feed wgmma a register A operand (the e2m1 -> e4m3 conversion happens in registers,
    by byte permutes), not a shared-memory descriptor."""
    text = sass("sm90a")
    fams = _built_families("sm90a")
    if not fams & {"mxfp8", "e4m3xe2m1"}:
        pytest.skip("no MX kernel built")
    assert "UBLKCP.S.G" in text, "no bulk copy of scale atoms"
    if "e4m3xe2m1" in fams:
        assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", text), "no register-A fp8 wgmma"
        assert text.count("PRMT") > 100, "no byte-permute e2m1 conversion"


def test_sm100a_uses_tcgen05_mma():
    text = sass("sm100a")
    assert re.search(r"\bUTC\w*MMA", text), "no tcgen05 (UTC*MMA) instruction in the sm100a module"
    built = {e["config"] for e in pg._C.built_kernels() if e["arch"] == "sm100a"}
    if any(parse_name(c).dtype in ("bf16", "fp16") and parse_name(c).kernel == "2sm" for c in built):
        assert "UTCHMMA.2CTA" in text, "the catalogue's 2-SM 16-bit config should issue paired-CTA MMAs"
    assert "code for sm_100a" in text


def _functions(text: str) -> dict[str, str]:
    """SASS per kernel: mangled name -> its instructions."""
    parts = re.split(r"^\s*Function : (\S+)\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_sm100a_mx_kernels_issue_block_scaled_mma():
    """Every SM100 MX kernel (CUTLASS's block-scaled mainloop inside our Sm100GemmPersistent)
    issues tcgen05 block_scale MMAs (UTCQMMA, kind::mxf8f6f4, with scale-factor TMEM operands) and
    copies the scale factors smem -> TMEM (UTCCP 4x32dp128bit); the 2-SM ones in their .2CTA
    forms. One such kernel per built SM100 MX entry."""
    text = sass("sm100a")
    entries = [e for e in pg._C.built_kernels() if e["arch"] == "sm100a" and e["family"] in ("mxfp8", "e4m3xe2m1")]
    if not entries:
        pytest.skip("no sm100a MX kernel built")
    mx = {name: body for name, body in _functions(text).items() if "BlockScaled" in name}
    assert len(mx) == len(entries), (len(mx), [e["config"] for e in entries])
    for name, body in mx.items():
        two_sm = "Umma2Sm" in name
        cta = r"\.2CTA" if two_sm else ""
        # UTCQMMA gdesc[A], gdesc[B], tmem[D], tmem[SFA], idesc, tmem[SFB]: the block-scaled form
        assert re.search(rf"\bUTCQMMA{cta} gdesc\[\w+\], gdesc\[\w+\], tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], tmem\[\w+\]",
                         body), f"no block-scaled UTCQMMA{'.2CTA' if two_sm else ''} in {name[:120]}"
        assert re.search(rf"\bUTCCP\.T\.S{cta}\.4x32dp128bit", body), f"no UTCCP scale-factor copy in {name[:120]}"
        if not two_sm:
            assert ".2CTA" not in body, f"1-SM kernel with paired-CTA instructions: {name[:120]}"
        assert "UTMALDG" in body and "UTMASTG" in body, "TMA loads and stores"


def test_sm100a_scaled_mm_kernels_issue_f8f6f4_mma_and_read_their_scales():
    """Every SM100 scaled_mm kernel (e4m3, CUTLASS's dense mainloop inside our Sm100GemmPersistent)
    issues dense tcgen05 MMAs of kind::f8f6f4 (UTCQMMA without the block-scaled form's
    scale-factor TMEM operand, no UTCCP scale copy), .2CTA in a 2-SM kernel, never a 16-bit
    UTCHMMA; loads by TMA, stores by TMA, and reads its fp32 scales in the epilogue (LDG: a
    scalar broadcast for tensorwise, a row and a column broadcast for rowwise)."""
    text = sass("sm100a")
    entries = [e for e in pg._C.built_kernels() if e["arch"] == "sm100a" and e["family"] == "e4m3"]
    if not entries:
        pytest.skip("no sm100a scaled_mm kernel built")
    fp8 = {name: body for name, body in _functions(text).items()
           if "Sm100GemmPersistent" in name and "float_e4m3" in name and "BlockScaled" not in name}
    assert len(fp8) == len(entries), (len(fp8), [e["config"] for e in entries])
    rowwise_kernels = 0
    for name, body in fp8.items():
        cta = r"\.2CTA" if "Umma2Sm" in name else ""
        dense = rf"\bUTCQMMA{cta} gdesc\[\w+\], gdesc\[\w+\], tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], U?P"
        assert re.search(dense, body), f"no dense f8f6f4 UTCQMMA{cta} in {name[:120]}"
        assert not re.search(r"idesc\[\w+\], tmem\[", body) and "UTCCP" not in body, "block-scaled form"
        assert "UTCHMMA" not in body, "a 16-bit MMA in an e4m3 kernel"
        if not cta:
            assert ".2CTA" not in body, f"1-SM kernel with paired-CTA instructions: {name[:120]}"
        assert "UTMALDG" in body and "UTMASTG" in body, "TMA loads and stores"
        rowwise = "Sm90ColBroadcast" in name and "Sm90RowBroadcast" in name
        assert rowwise != ("Sm90ScalarBroadcast" in name), f"neither tensorwise nor rowwise: {name[:120]}"
        assert re.search(r"\bLDG\.E\b", body), "the epilogue reads no scale"
        rowwise_kernels += rowwise
    assert rowwise_kernels == sum(e["scale_mode"] == 2 for e in entries)  # ScaleMode::Rowwise


def test_sm90a_mx_decode_gemv_streams_by_tma_and_reads_shared_memory_with_lds():
    """Every MX decode GEMV kernel loads by TMA, reads its operands with LDS (a generic LD here once
    came from an integer-rounded shared pointer and cost 3x), and runs f16 HMMAs (SM90 lowers the
    e4m3 mma.sync to them; the kernel widens operands itself up to 16 tokens)."""
    built = [e for e in pg._C.built_kernels() if e["arch"] == "sm90a" and "_gemv_" in e["config"]]
    if not built:
        pytest.skip("no MX decode GEMV built")
    gemv = {name: body for name, body in _functions(sass("sm90a")).items() if "Sm90MxGemv" in name}
    assert len(gemv) == len(built), (len(gemv), len(built))
    for name, body in gemv.items():
        assert "UTMALDG" in body and re.search(r"\bHMMA\.16816\.F32\b", body) and "LDS" in body, name
        assert not re.search(r"\bLD\.E\b", body), f"{name}: generic loads (a shared pointer lost its space)"


def test_sm90a_promoted_fp8_kernels_keep_a_wgmma_in_flight_while_promoting():
    """The promoting FP8 mainloops add a retired temporary into the accumulator while the next
    wgmma batch runs (warpgroup.wait 1). ptxas silently serializes every wgmma of a kernel
    (C7514: one wait 0 per wgmma) over details as small as the shape of the K loop, so the
    overlap is checked where it lives, in the SASS: fewer fences than wgmmas, waits that leave
    one batch in flight, and no local memory (a fragment the compiler could not keep in
    registers). The sliced kernels also feed wgmma a register A operand (RS), loaded by ldmatrix."""
    built = [e for e in pg._C.built_kernels() if e["arch"] == "sm90a" and parse_name(e["config"]).dtype == "e4m3"
             and parse_name(e["config"]).accum == "promoted"]
    if not built:
        pytest.skip("no promoted e4m3 sm90a kernel built")
    funcs = {n: b for n, b in _functions(sass("sm90a")).items()
             if "Sm90Fp8OverlappedPromotionMma" in n or "Sm90Fp8SlicedPromotionMma" in n}
    assert funcs, "no promoting FP8 kernel in the sm90a module"
    for name, body in funcs.items():
        wgmmas = len(re.findall(r"\bQGMMA\.64x\d+x32\.F32\.E4M3\.E4M3\b", body))
        arrives = body.count("WARPGROUP.ARRIVE")
        assert wgmmas > 0 and arrives < wgmmas, f"{name}: {arrives} fences for {wgmmas} wgmmas (serialized)"
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in body, f"{name}: no wait that leaves a batch in flight"
        assert not re.search(r"\b(STL|LDL)\b", body), f"{name}: local memory in a promoting kernel"
        if "Sm90Fp8SlicedPromotionMma" in name:
            assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", body), f"{name}: no RS wgmma"
            assert "LDSM" in body, f"{name}: A is not loaded into registers by ldmatrix"


def test_sm100a_grouped_kernel_and_its_passes():
    """The SM100 grouped entries (MXFP8, FP8 x FP4; compiled, not run here): each GEMM is a
    block-scaled tcgen05 kernel (its UTCQMMA, UTCCP and TMA: the test above, which takes every
    BlockScaled kernel) over our grouped mainloop (Sm100GroupedMxMainloop::load_grouped: TMA loads
    of A, B and both scale tensors), and builds its expert table with a warp scan (SHFL.UP) before
    the roles start; the in and out passes beside it copy the rows
    (16-byte loads and stores) and write D with the bias's rounding (no TMA: any ldd)."""
    text = sass("sm100a")
    entries = [e for e in pg._C.built_kernels() if e["arch"] == "sm100a" and "_grouped_" in e["config"]]
    if not entries:
        pytest.skip("no sm100a grouped kernel built")
    assert all(e["family"] in ("mxfp8", "e4m3xe2m1") and e["fused_bias"] and not e["swap_ab"] for e in entries), entries
    fns = _functions(text)
    gemm = {n: b for n, b in fns.items() if "Sm100GroupedMxMainloop" in n}
    assert len(gemm) == len(entries), (len(gemm), [e["config"] for e in entries])
    for name, body in gemm.items():
        assert body.count("UTMALDG") >= 4, f"TMA loads of A, B, SFA, SFB in {name[:120]}"
        assert "SHFL.UP" in body, "no warp scan: the expert table is not built in the kernel"
    passes = {n: b for n, b in fns.items() if "sm100_grouped_bands_" in n}
    ins = [b for n, b in passes.items() if "bands_in_kernel" in n]
    outs = [b for n, b in passes.items() if "bands_out_kernel" in n]
    assert ins and outs, sorted(passes)  # each grouped TU compiles its own copy of the passes
    assert all(re.search(r"\bLDG\.E\.128", b) and re.search(r"\bSTG\.E\.128", b) for b in ins), "16-byte row copies"
    assert all("UTMASTG" not in b for b in outs), "the out pass stores element by element (any ldd)"
