"""dtypes, the device and its arch, the schedule strategies and hypothesis settings."""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import settings
from hypothesis import strategies as st

import persistent_gemm as pg
from persistent_gemm.catalogue import CATALOGUE
from persistent_gemm.schedule import TileSchedule

E4M3 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
FP4X2 = torch.float4_e2m1fn_x2
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OPS = ("mm", "scaled_mm", "mxfp8_mm", "fp8_fp4_mm")
#: Smallest magnitude the factories produce: a normal number in every dtype used (e4m3's
#: smallest normal is 2^-6), so no element rounds to zero.
TINY = 2.0**-6

HAS_GPU = torch.cuda.is_available() and pg.extension_available()
CAPABILITY = torch.cuda.get_device_capability() if HAS_GPU else None
#: The catalogue arch of the device, or None (no GPU, or one we build no kernels for).
ARCH = {(9, 0): "sm90a", (10, 0): "sm100a"}.get(CAPABILITY)
_ARCH_MARKS = {"sm90": (9, 0), "sm100": (10, 0)}


# -- schedule, catalogue and footprint tests -----------------------------------------------------
REPO = Path(__file__).resolve().parents[2]  # the repository (tests/support/common.py)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLUSTERS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4)]
CATALOGUE_TILES = sorted({c.cta_tile for c in CATALOGUE})
# The catalogue's (tile_m, tile_n) plus a few other legal CTA shapes, so the property tests
# do not hinge on the catalogue having a single tile shape.
TILES = sorted(set(CATALOGUE_TILES) | {(128, 128), (256, 128), (64, 256)})
PROPS = settings(deadline=None, max_examples=60)
FAST = settings(deadline=None, max_examples=150)
#: Any valid TileSchedule.
schedules = st.builds(
    TileSchedule,
    swizzle=st.integers(1, 16),
    cluster=st.sampled_from(CLUSTERS),
    raster=st.sampled_from(["row", "column"]),
)
