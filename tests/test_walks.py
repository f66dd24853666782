"""The three walks a reader takes through the source (issue 44's measure): from the Python op to
the kernel, each role entered once, in layer order. Every file a walk opens must be a role's
home or a module shared by several routes (no hand-written pass-through), host code at most
25 KB, a kernel or mainloop header at most 40 KB; docs/layout.md states each walk's files and KB,
and stays within 10 % of the tree. Generated files (the instantiation TU, arch_limits.hpp) are
not counted: nobody edits them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INC = "include/persistent_gemm/"
PY = "python/persistent_gemm/"

#: The host side every walk crosses: op registration, dispatcher and its spokes, the ABI.
_HOST = {
    "registration": ["csrc/ops.cpp"],
    "dispatcher": ["csrc/dispatch.cpp", "csrc/dispatch.h"],
    "validation": ["csrc/checks.cpp", "csrc/checks.h"],
    "registry, guard": ["csrc/arch_registry.cpp", "csrc/device_info.h", "csrc/self_check.cpp", "csrc/self_check.h"],
    "choice": ["csrc/heuristics.cpp", "csrc/heuristics.h", "csrc/cost_model.cpp"],
    "ABI, text": [INC + "registry.h", "csrc/text.h"],
}

#: The persistent kernel both tile routes run: the kernel and its launch, the tile scheduler.
_PERSISTENT = [INC + "kernel/sm90_gemm_persistent.hpp", INC + "kernel/persistent_kernel_types.hpp",
               INC + "kernel/cluster_launch.hpp"]
_TILES = [INC + "scheduler/tile_scheduler.hpp"]

#: role -> files, in the order a reader meets them.
WALKS = {
    "prefill, bf16 route (pg.fp8_fp4_mm(a, prepared weight, scale_a), M = 2048)": {
        "Python op": [PY + "_ops.py", PY + "prepare.py"],
        **_HOST,
        "builder": [INC + "kernel/sm90_mx_bf16_gemm_builder.hpp", INC + "kernel/builder_spec.hpp",
                    INC + "kernel/builder_common.hpp", INC + "kernel/activation_tags.hpp"],
        "pre-pass": [INC + "host/mx_bf16_prepass.cuh"],
        "mainloop": [INC + "collective/sm90_mx_bf16_mma.hpp", INC + "collective/sm90_mx_tma_operands.hpp",
                     INC + "collective/mx_block_scales.hpp", INC + "collective/sm90_mx_wgmma.hpp",
                     INC + "layout/mx_blocked.hpp"],
        "kernel": _PERSISTENT,
        "scheduler": _TILES,
        "epilogue": [INC + "epilogue/sm90_predicated_epilogue.hpp"],
    },
    "decode GEMV (pg.mm(x, prepared MXFP4 weight), M = 1)": {
        "Python op": [PY + "_ops.py", PY + "prepare.py"],
        **_HOST,
        "builder": [INC + "kernel/gemv_builder.hpp", INC + "kernel/builder_spec.hpp"],
        "kernel": [INC + "kernel/sm90_mx_gemv.hpp", INC + "kernel/sm90_mx_gemv_impl.hpp",
                   INC + "kernel/activation_tags.hpp", INC + "kernel/cluster_launch.hpp", INC + "kernel/split_nonce.hpp"],
        "scheduler": [INC + "scheduler/strip_stream_k.hpp"],
        "MX pieces": [INC + "collective/mx_block_scales.hpp", INC + "layout/mx_blocked.hpp"],
    },
    "forced promotion kernel (pg.scaled_mm(..., config='sm90a_e4m3_128x128x128_c2x1_sw8_row_coop'))": {
        "Python op": [PY + "_ops.py", PY + "jit.py"],
        **_HOST,
        "builder": [INC + "kernel/sm90_gemm_builder.hpp", INC + "kernel/builder_spec.hpp",
                    INC + "kernel/builder_common.hpp", INC + "kernel/promotion_rule.hpp"],
        "mainloop": [INC + "collective/sm90_fp8_promoted_mma.hpp"],
        "kernel": [*_PERSISTENT, INC + "kernel/split_nonce.hpp"],
        "scheduler": _TILES,
        "epilogue": [INC + "epilogue/sm90_tma_fusion.hpp", INC + "epilogue/sm90_predicated_epilogue.hpp"],
    },
}

#: What a file that is more than a pass-through has: a definition of its own (a type, function,
#: constant or macro), not only includes, re-exports and aliases.
_DEFINES = re.compile(r"^\s*(template\b|struct\b|class\b|enum\b|constexpr\b|inline\b|def\b|#\s*define\b|"
                      r"[\w:<>,\s*&]+\([^;]*\)\s*(const\s*)?\{)", re.M)
_NOT_CODE = re.compile(r"//.*|^\s*#\s*(include|pragma|if|ifn?def|else|elif|endif)\b.*|^\s*(from|import)\s.*", re.M)


def files(walk: dict) -> list[str]:
    return [f for role in walk.values() for f in role]


def measure(walk: dict) -> tuple[int, float]:
    fs = files(walk)
    return len(fs), sum((ROOT / f).stat().st_size for f in fs) / 1000


@pytest.mark.parametrize("name", WALKS)
def test_walk_enters_each_file_once_and_every_file_exists(name):
    fs = files(WALKS[name])
    assert len(fs) == len(set(fs)), [f for f in fs if fs.count(f) > 1]
    assert not [f for f in fs if not (ROOT / f).is_file()]


@pytest.mark.parametrize("name", WALKS)
def test_walk_files_keep_the_size_rules(name):
    for f in files(WALKS[name]):
        size = (ROOT / f).stat().st_size
        kernel_header = f.startswith(INC) and not f.endswith((".h", ".cuh"))
        assert size <= (40_000 if kernel_header else 25_000), f"{f}: {size} B"


@pytest.mark.parametrize("name", WALKS)
def test_walk_opens_no_pass_through(name):
    for f in files(WALKS[name]):
        text = _NOT_CODE.sub("", (ROOT / f).read_text())
        assert _DEFINES.search(text), f"{f} defines nothing: a pass-through"


def test_layout_doc_states_each_walk():
    doc = (ROOT / "docs" / "layout.md").read_text()
    for name, walk in WALKS.items():
        count, kb = measure(walk)
        row = next((line for line in doc.splitlines() if line.startswith("| " + name.split(" (")[0])), None)
        assert row, f"docs/layout.md has no row for the walk {name!r}"
        doc_count, doc_kb = (float(x) for x in re.findall(r"\|\s*([\d.]+)\s*(?=\|)", row)[:2])
        assert doc_count == count and abs(doc_kb - kb) <= 0.1 * kb, (name, row, count, round(kb, 1))
