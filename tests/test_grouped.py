"""grouped_mm / masked_grouped_mm (MoE experts, issue 45) on the CPU: the exact reference against
float64 per expert in every format, the 3-D prepare_weight / from_mxfp4_blocks stacks, the errors
that name the argument, the fake kernel (opcheck, torch.compile), the grouped config names and
the grouped walk's Python twin. The kernels' suite is tests/test_gpu_grouped.py."""

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import error_bound, expert_stack, grouped_activations, grouped_reference, randn, rel_err, rounding_err

import persistent_gemm as pg
from persistent_gemm.grouped_walk import GroupedScheduleGrid
from persistent_gemm.schedule import TileSchedule
from persistent_gemm.strip_schedule import GroupedStripStreamK

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="needs the built extension (the op's schema)")

FORMATS = ("bf16", "mxfp4_weight_only", "mxfp8_weight_only", "fp8_fp4", "mxfp8")


def offs_of(counts, device="cpu"):
    return torch.cumsum(torch.tensor(counts, device=device), 0).to(torch.int32)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("counts", [[3, 0, 1, 7], [5], [0, 0, 2, 0]], ids=["mixed", "one_expert", "mostly_empty"])
def test_grouped_mm_matches_float64(fmt, counts):
    e, n, k = len(counts), 40, 96
    b, w = expert_stack(fmt, e, n, k, seed=e)
    a, sa, av = grouped_activations(fmt, sum(counts), k, seed=n)
    bias = randn(e, n, torch.bfloat16, seed=3)
    out = pg.grouped_mm(a, b, offs_of(counts), scale_a=sa, bias=bias)
    ref = grouped_reference(av, w, counts, bias)
    assert out.shape == (sum(counts), n) and out.dtype == torch.bfloat16
    assert rel_err(out, ref) <= error_bound(rounding_err(ref, torch.bfloat16))


@pytest.mark.parametrize("fmt", FORMATS)
def test_masked_form_zeroes_rows_past_each_count(fmt):
    e, rows, n, k = 3, 4, 24, 64
    b, w = expert_stack(fmt, e, n, k, seed=7)
    a, sa, av = grouped_activations(fmt, e * rows, k, seed=8)
    counts = [2, 0, 4]
    a3 = a.reshape(e, rows, k)
    out = pg.masked_grouped_mm(a3, b, torch.tensor(counts, dtype=torch.int32),
                               scale_a=None if sa is None else sa.reshape(e, rows, -1), out_dtype=torch.float32)
    assert out.shape == (e, rows, n) and out.dtype == torch.float32
    for i, c in enumerate(counts):
        ref = av.reshape(e, rows, k)[i, :c] @ w[i].t()
        assert rel_err(out[i, :c], ref) <= 1e-6 if c else True
        assert (out[i, c:] == 0).all()


def test_stacked_prepare_is_each_expert_prepared():
    e, n, k = 3, 130, 64
    wq, ws = pg.quantize_mxfp4(randn(e * n, k, torch.float32, seed=1))
    pw = pg.prepare_weight(wq.reshape(e, n, -1), ws.reshape(e, n, -1), fmt="fp4")
    assert pw.experts == e and pw.b.shape == (e, k // 2, n) and pw.scale_b.shape[0] == e
    for i in range(e):
        one = pg.prepare_weight(wq.reshape(e, n, -1)[i], ws.reshape(e, n, -1)[i], fmt="fp4")
        assert torch.equal(pw.expert(i).b.t().view(torch.uint8), one.b.t().view(torch.uint8))
        assert torch.equal(pw.scale_b[i].view(torch.uint8), one.scale_b.view(torch.uint8))
    assert torch.equal(pw.dequantize(), pg.dequantize_mxfp4(wq, ws).reshape(e, n, k))


def test_from_mxfp4_blocks_takes_gpt_oss_stacks():
    g = torch.Generator().manual_seed(4)
    e, n, k = 2, 8, 64
    blocks = torch.randint(0, 256, (e, n, k // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, (e, n, k // 32), generator=g, dtype=torch.uint8)
    pw = pg.from_mxfp4_blocks(blocks, scales)
    assert pw.experts == e
    for i in range(e):
        assert torch.equal(pw.expert(i).dequantize(), pg.from_mxfp4_blocks(blocks[i], scales[i]).dequantize())


def _args(**over):
    b, _ = expert_stack("mxfp4_weight_only", 3, 16, 64)
    args = dict(a=randn(6, 64, torch.bfloat16), b=b, offs=offs_of([2, 1, 3]))
    args.update(over)
    return args


@pytest.mark.parametrize("over,match", [
    (dict(offs=torch.tensor([2, 1, 6], dtype=torch.int32)), r"offs must be non-decreasing .*offs\[1\] = 1"),
    (dict(offs=torch.tensor([2, 3, 5], dtype=torch.int32)), r"offs\[-1\] == 6 .*offs\[2\] = 5"),
    (dict(offs=torch.tensor([2, 6], dtype=torch.int32)), r"offs must be 1-D with one entry per expert \(E = 3"),
    (dict(offs=torch.tensor([2, 3, 6])), r"offs must be torch.int32"),
    (dict(a=randn(6, 48, torch.bfloat16)), r"a's K = 48 but b is"),
    (dict(a=randn(6, 64, torch.float32)), r"a must be torch.bfloat16, torch.float16 or torch.float8_e4m3fn"),
], ids=["decreasing", "last_not_rows", "length", "dtype", "k", "a_dtype"])
def test_bad_input_names_the_argument(over, match):
    a = _args(**over)
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        pg.grouped_mm(a["a"], a["b"], a["offs"])


def test_bad_input_other_operands():
    b16, _ = expert_stack("bf16", 2, 8, 48)
    with pytest.raises(ValueError, match=r"K = 48 must be a multiple of 32 for MX"):
        torch.ops.persistent_gemm.grouped_mm(randn(3, 48, torch.bfloat16), torch.zeros(2, 48, 8, dtype=torch.float8_e4m3fn),
                                             offs_of([1, 2]), None, torch.zeros(2, 256, dtype=torch.float8_e8m0fnu))
    with pytest.raises(TypeError, match=r"an MX b goes through prepare_weight"):
        pg.grouped_mm(randn(3, 48, torch.bfloat16), torch.zeros(2, 48, 8, dtype=torch.float8_e4m3fn), offs_of([1, 2]))
    with pytest.raises(TypeError, match=r"b must have a's dtype torch.float16"):
        pg.grouped_mm(randn(3, 48, torch.float16), b16, offs_of([1, 2]))
    with pytest.raises(ValueError, match=r"bias must be \(E, N\) = \(2, 8\)"):
        pg.grouped_mm(randn(3, 48, torch.bfloat16), b16, offs_of([1, 2]), bias=torch.zeros(8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"offs is on meta but a is on cpu"):
        pg.grouped_mm(randn(3, 48, torch.bfloat16), b16, offs_of([1, 2], device="meta"))
    pw, _ = expert_stack("mxfp8_weight_only", 2, 8, 64)
    with pytest.raises(ValueError, match=r"e4m3 a needs scale_a"):
        pg.grouped_mm(randn(3, 64, torch.bfloat16).to(torch.float8_e4m3fn), pw, offs_of([1, 2]))
    with pytest.raises(ValueError, match=r"counts must be in \[0, 2\]"):
        pg.masked_grouped_mm(randn(4, 64, torch.bfloat16).reshape(2, 2, 64), pw, torch.tensor([1, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"2-D PreparedWeight \(one expert\)"):
        pg.grouped_mm(randn(3, 64, torch.bfloat16), pw.expert(0), offs_of([1, 2]))


def test_grouped_mm_refuses_grad():
    b, _ = expert_stack("bf16", 2, 8, 32)
    a = randn(3, 32, torch.bfloat16).requires_grad_()
    with pytest.raises(RuntimeError, match=r"a requires grad, but grouped_mm is for inference"):
        pg.grouped_mm(a, b, offs_of([1, 2]))
    with torch.no_grad():  # what its message offers: no grad mode, no refusal
        assert pg.grouped_mm(a, b, offs_of([1, 2])).shape == (3, 8)


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4_weight_only", "fp8_fp4"])
def test_opcheck_and_compile(fmt):
    b, _ = expert_stack(fmt, 3, 16, 64)
    a, sa, _ = grouped_activations(fmt, 5, 64)
    offs = offs_of([2, 0, 3])
    w, sb = (b.b, b.scale_b) if isinstance(b, pg.PreparedWeight) else (b, None)
    args = (a, w, offs, sa, sb, None, None, None)
    # torch's test_schema compares inputs with allclose, which has no CPU kernel for the 8-bit
    # and 4-bit dtypes: there, the other checks, and "no input is mutated" bitwise ourselves.
    utils = () if fmt == "bf16" else ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    before = [t.view(torch.uint8).clone() if t.element_size() == 1 else t.clone() for t in args[:5] if t is not None]
    torch.library.opcheck(torch.ops.persistent_gemm.grouped_mm.default, args, **({"test_utils": utils} if utils else {}))
    after = [t.view(torch.uint8) if t.element_size() == 1 else t for t in args[:5] if t is not None]
    assert all(torch.equal(x, y) for x, y in zip(before, after))
    f = torch.compile(lambda x, o: pg.grouped_mm(x, b, o, scale_a=sa), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(a, offs), pg.grouped_mm(a, b, offs, scale_a=sa))


def test_grouped_config_names():
    families = {"bf16xe2m1", "bf16xe4m3", "e4m3xe2m1", "mxfp8"}
    grouped = [c for c in pg.CATALOGUE if c.schedule.grouped]
    gemv = [c for c in grouped if c.kernel == "gemv"]
    tiles = [c for c in grouped if c.kernel != "gemv"]
    assert {c.dtype for c in gemv} == {c.dtype for c in tiles} == families
    assert all("_grouped_gemv_" in c.name for c in gemv)
    sm90 = [c for c in tiles if c.arch == "sm90a"]
    assert {c.dtype for c in sm90} == families
    for c in sm90:  # the prefill tiles: the sm90a bf16 route, one name, buildable
        assert c.route == "bf16" and c.swap_ab and c.kernel_rejection() is None
        assert "_grouped_coop_" in c.name and pg.KernelConfig.from_name(c.name) == c
    # SM100: the grouped MXFP8 and FP8 x FP4 kernels (1-SM, 1x1 clusters; compiled, not run here).
    sm100 = [c for c in tiles if c.arch == "sm100a"]
    assert sorted(c.dtype for c in sm100) == ["e4m3xe2m1", "mxfp8"]
    assert all(not c.swap_ab and c.kernel == "1sm" and "_grouped_1sm" in c.name for c in sm100)
    assert all(c.kernel_rejection() is None and pg.KernelConfig.from_name(c.name) == c for c in sm100)
    tile = pg.KernelConfig(tile=(128, 256, 64), schedule=pg.TileSchedule(grouped=True))  # walkable, not built
    assert "the grouped kernels are the decode GEMV, the sm90a MX bf16 route and the sm100a MXFP8 / FP8 x FP4" \
        in tile.kernel_rejection()
    assert pg.KernelConfig.from_name(tile.name) == tile
    two_sm = pg.KernelConfig(tile=(256, 128, 128), schedule=pg.TileSchedule(grouped=True, cluster=(2, 1)),
                             kernel="2sm", dtype="mxfp8", arch="sm100a")
    assert "1x1 clusters and 1-SM MMAs" in two_sm.kernel_rejection()
    with pytest.raises(pg.ConfigError, match=r"grouped=True deals whole tiles"):
        pg.KernelConfig(tile=(128, 256, 64), schedule=pg.TileSchedule(grouped=True, split_k=2))


@pytest.mark.parametrize("counts,tokens", [([3, 0, 17, 8, 0], 8), ([64, 1], 16), ([0, 0, 5], 64)])
def test_grouped_walk_covers_every_row_and_unit_once(counts, tokens):
    walk = GroupedStripStreamK.from_offs(offs_of(counts).tolist(), tokens=tokens, n=300, k=1024, dtype="e4m3xe2m1",
                                         sm_count=7)
    rows = [r for it in walk.items for r in range(it.row0, it.row0 + it.rows)]
    assert rows == list(range(sum(counts)))  # every row once, in order, items never padded
    assert all(1 <= it.rows <= tokens for it in walk.items)
    seen = {walk.unit(u)[:2] + (walk.unit(u)[2],) for u in range(walk.schedule.units)}
    assert len(seen) == walk.schedule.units == len(walk.items) * walk.strips_per_item * walk.schedule.chunks
    masked = GroupedStripStreamK.from_offs(counts, tokens=tokens, n=300, k=1024, dtype="e4m3xe2m1", sm_count=7,
                                           masked_rows=max(counts))
    assert [(it.group, it.rows) for it in masked.items] == [(it.group, it.rows) for it in walk.items]


def test_explain_picks_grouped_kernels_by_rows_per_expert():
    built = {k["config"] for k in pg._C.built_kernels()}
    if not any("_grouped_gemv_" in c for c in built):
        pytest.skip("no grouped kernel in this build (PGEMM_KERNELS)")
    few = pg.explain(4, 5760, 2880, dtype="bf16xe2m1", groups=32)
    many = pg.explain(512, 5760, 2880, dtype="bf16xe2m1", groups=32)
    for d in (few, many):
        assert "_grouped_gemv_" in d.config and "grouped: each expert's rows" in d.log[0], d
    assert pg.KernelConfig.from_name(many.config).tile[1] > pg.KernelConfig.from_name(few.config).tile[1]
    assert "_grouped_" not in pg.explain(4, 5760, 2880, dtype="bf16xe2m1").config
    # ~128 rows per expert (gpt-oss-20b's 1024 tokens, top-4): the prefill tiles, where built.
    if any("_grouped_coop_" in c and "bf16xe2m1" in c for c in built):
        prefill = pg.explain(4096, 5760, 2880, dtype="bf16xe2m1", groups=32)
        assert "_grouped_coop_" in prefill.config and "(expert, tile) ids" in prefill.log[0], prefill


def test_explain_picks_the_sm100_grouped_kernel_for_mxfp8():
    built = {k["config"] for k in pg._C.built_kernels() if k["arch"] == "sm100a"}
    if not any("_grouped_" in c for c in built):
        pytest.skip("no sm100a grouped kernel in this build (PGEMM_KERNELS)")
    d = pg.explain(4096, 5760, 2880, dtype="mxfp8", groups=32, arch="sm100a")
    assert d.config == "sm100a_mxfp8_128x128x128_c1x1_sw8_row_grouped_1sm" and "128-row band" in d.log[0], d
    assert "_grouped_" not in pg.explain(4096, 5760, 2880, dtype="mxfp8", arch="sm100a").config
    with pytest.raises(ValueError, match="has no variant"):  # the MXFP8 kernel is not FP8 x FP4's
        pg.explain(4096, 5760, 2880, dtype="e4m3xe2m1", groups=32, arch="sm100a", config=d.config)
    if any("e4m3xe2m1" in c and "_grouped_" in c for c in built):
        fp4 = pg.explain(4096, 4096, 7168, dtype="e4m3xe2m1", groups=256, arch="sm100a")
        assert fp4.config == "sm100a_e4m3xe2m1_128x128x128_c1x1_sw8_row_grouped_1sm", fp4


_WALKS = [(8, 0, [0, 3, 3, 20, 20]), (16, 0, [64, 65]), (64, 0, [0, 0, 5]), (8, 4, [0, 4, 2, 1]), (16, 0, [7])]


def test_grouped_table_cpp_matches_python(tmp_path):
    """scheduler/grouped_rows.hpp's group_span and locate (the kernel's, compiled for the host) ==
    GroupedStripStreamK's items; a malformed offs is reported at its first bad entry."""
    from support.host_build import build_host_program

    root = Path(__file__).resolve().parents[1]
    exe = build_host_program([root / "tests" / "host" / "grouped_rows.cu"], tmp_path / "grouped_rows",
                             flags=("-std=c++17",))
    for tokens, ld, rows in _WALKS:
        total = ld * len(rows) if ld else rows[-1]
        out = subprocess.run([str(exe), str(tokens), str(ld), str(total), *map(str, rows)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        walk = GroupedStripStreamK.from_offs(rows, tokens=tokens, n=128, k=512, dtype="e4m3xe2m1", sm_count=4,
                                             masked_rows=ld)
        assert out.stdout.split("\n")[0] == "bad -1"
        assert out.stdout.split("\n")[1:-1] == [f"item {i.group} {i.row0} {i.rows}" for i in walk.items]
    out = subprocess.run([str(exe), "8", "0", "6", "2", "1", "6"], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[0] == "bad 1"
    out = subprocess.run([str(exe), "8", "0", "6", "2", "3", "5"], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[0] == "bad 2"  # offs[-1] != rows


_TILE_SCHEDULES = [(TileSchedule(), (128, 128)), (TileSchedule(swizzle=8, cluster=(2, 1)), (128, 256)),
                   (TileSchedule(swizzle=3, cluster=(1, 2), raster="column"), (64, 16))]


def test_grouped_tile_walk_cpp_matches_python(tmp_path):
    """PersistentTileScheduler::grouped_work_at (compiled for the host) == grouped_walk.GroupedScheduleGrid,
    experts' rows on M (a plain kernel) and on N (a swap-AB kernel's tokens), empty experts included."""
    from support.host_build import build_host_program

    root = Path(__file__).resolve().parents[1]
    exe = build_host_program([root / "tests" / "host" / "grouped_tiles.cu"], tmp_path / "grouped_tiles",
                             flags=("-std=c++17",))
    cases = [((300, 0, 1, 700), 1000, True, 7), ((0, 129, 5000), 256, True, 132), ((33, 0, 17, 64), 2880, False, 16)]
    for which, (sched, tile) in enumerate(_TILE_SCHEDULES):
        for extents, other, group_m, workers in cases:
            out = subprocess.run([str(exe), str(which), str(int(group_m)), str(workers), str(other), *map(str, extents)],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            grid = GroupedScheduleGrid(sched, extents, other, tile, group_m)
            got = [tuple(map(int, line.split())) for line in out.stdout.split("\n") if line]
            assert got == grid.work_order(workers), (which, extents)
            assert sorted(t[2:] for t in got) == sorted(grid.coord(t) for t in range(grid.num_ids))


_BANDS = [(5760, 0, [0, 300, 300, 301, 1000]), (2880, 0, [128, 256, 257, 257]), (100, 0, [1]), (4096, 0, [0, 0, 0]),
          (300, 70, [70, 0, 5, 69]), (7168, 0, [1, 2, 3, 4, 5, 6, 7, 8])]


def test_sm100_grouped_bands_agree_with_the_walk(tmp_path):
    """The SM100 grouped kernel's GEMM addresses each (expert, m tile) at the padded band its in /
    out passes copy that expert's rows to, every band once per N tile, within the host's bound
    (tests/host/sm100_grouped_bands.cu compiles the kernel's headers for the host): empty experts,
    band-sized ones, one-row ones, all empty, the masked form."""
    from support.host_build import build_host_program

    root = Path(__file__).resolve().parents[1]
    exe = build_host_program([root / "tests" / "host" / "sm100_grouped_bands.cu"], tmp_path / "bands")
    for n, ld, rows in _BANDS:
        total = ld * len(rows) if ld else rows[-1]
        out = subprocess.run([str(exe), str(n), str(ld), str(total), *map(str, rows)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("ok "), (n, ld, rows, out.stdout + out.stderr)
        counts = rows if ld else [b - a for a, b in zip([0, *rows], rows)]
        assert int(out.stdout.split()[1]) == sum((c + 127) // 128 for c in counts)


def test_grouped_tile_walk_is_each_groups_dense_walk():
    grid = GroupedScheduleGrid(TileSchedule(swizzle=2), (256, 0, 100), 512, (128, 128))
    assert grid.ids_before == (0, 8, 8, 12)
    dense = TileSchedule(swizzle=2).over(256, 512, (128, 128))
    assert [grid.coord(t)[1:] for t in range(8)] == [dense.coord(t) for t in range(8)]
    with pytest.raises(ValueError, match="split_k and stream_k do not apply"):
        GroupedScheduleGrid(TileSchedule(split_k=2), (1,), 8, (64, 64))


@pytest.mark.parametrize("groups,err", [(0, ValueError), (True, TypeError), (2.0, TypeError)])
def test_explain_groups_is_checked(groups, err):
    with pytest.raises(err, match="groups"):
        pg.explain(64, 5760, 2880, dtype="bf16xe2m1", groups=groups)
