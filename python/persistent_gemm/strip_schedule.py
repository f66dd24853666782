"""Stream-K over weight strips: the schedule of the MX decode GEMV (kernel style ``"gemv"``).

The Python twin of ``include/persistent_gemm/scheduler/strip_stream_k.hpp`` (same numbers,
same roles): the weight's N rows are cut into 128-row strips and each strip's K into work units
of 256 weight bytes per row; the ``strips x chunks`` units are numbered strip-major and dealt to
W workers (one CTA per SM) as contiguous ranges whose lengths differ by at most one. A worker
therefore streams long K runs, and only strips that straddle two workers' ranges are reduced
across CTAs, in worker order (deterministic).

    >>> s = StripStreamK.for_problem(n=8192, k=8192, dtype="e4m3xe2m1", sm_count=132)
    >>> s.pieces(0)[:2]          # worker 0's first pieces: (worker, strip, chunk range, role)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .config_fields import GEMV_CHUNK_BYTES, GEMV_STRIP_ROWS, MX_DTYPES
from .library import ELEMENTS, lowering
from .stream_k import EvenShare

__all__ = ["ROLES", "StripPiece", "StripStreamK"]

#: What a worker does with its piece of a strip (scheduler::StripRole).
ROLES = ("whole", "partial", "reducer")

def _weight_bytes(dtype: str) -> float:
    """Bytes per weight element of an MX family (its lowering record's weight element)."""
    low = lowering("sm90a", dtype) if dtype in MX_DTYPES else None
    if low is None:
        raise ValueError(f"dtype must be one of {MX_DTYPES}, got {dtype!r}")
    return ELEMENTS[low.b].bits / 8


class StripPiece(NamedTuple):
    worker: int
    strip: int
    chunk_begin: int  # first K unit of the strip this worker reduces
    chunk_end: int    # one past the last
    role: str         # "whole": writes D; "partial": publishes a slot; "reducer": adds the slots, writes D


@dataclass(frozen=True)
class StripStreamK(EvenShare):
    strips: int
    chunks: int
    workers: int

    def __post_init__(self) -> None:
        for name in ("strips", "chunks", "workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.workers > self.units:
            raise ValueError(f"workers ({self.workers}) must not exceed the units ({self.units}): each owns one at least")

    @classmethod
    def for_problem(cls, n: int, k: int, dtype: str, sm_count: int) -> "StripStreamK":
        """The schedule the kernel runs for an (N, K) weight of MX family ``dtype`` on ``sm_count``
        SMs (Sm90MxGemv::schedule)."""
        per_k = _weight_bytes(dtype)
        if n < 1 or k < 1 or sm_count < 1:
            raise ValueError(f"n, k and sm_count must be >= 1, got {n}, {k}, {sm_count}")
        strips = -(-n // GEMV_STRIP_ROWS)
        chunks = -(-int(k * per_k) // GEMV_CHUNK_BYTES)
        return cls(strips, chunks, min(strips * chunks, sm_count))

    @property
    def units(self) -> int:
        return self.strips * self.chunks

    @property
    def items(self) -> int:  # EvenShare: the units, dealt to the workers
        return self.units

    @property
    def parts(self) -> int:
        return self.workers

    def role(self, w: int, strip: int) -> str:
        s0, s1 = strip * self.chunks, (strip + 1) * self.chunks
        if self.begin(w) > s0:
            return "partial"
        return "whole" if self.begin(w + 1) >= s1 else "reducer"

    def last_partner(self, strip: int) -> int:
        """The last worker holding a unit of ``strip``: a reducer adds workers (w, last]."""
        return self.owner((strip + 1) * self.chunks - 1)

    def pieces(self, w: int) -> list[StripPiece]:
        """Worker ``w``'s pieces in the order it computes them."""
        u0, u1 = self.begin(w), self.begin(w + 1)
        out = []
        for strip in range(u0 // self.chunks, (u1 - 1) // self.chunks + 1):
            lo, hi = max(u0, strip * self.chunks), min(u1, (strip + 1) * self.chunks)
            out.append(StripPiece(w, strip, lo - strip * self.chunks, hi - strip * self.chunks, self.role(w, strip)))
        return out

    def walk(self) -> list[StripPiece]:
        """Every worker's pieces, worker by worker."""
        return [p for w in range(self.workers) for p in self.pieces(w)]

    def summary(self) -> str:
        shared = sum(1 for p in self.walk() if p.role == "reducer")
        return (f"stream-K over {self.strips} strips x {self.chunks} K units on {self.workers} workers "
                f"({self.units / self.workers:.2f} units each, {shared} strips reduced across CTAs)")


class GroupItem(NamedTuple):
    """One item of a grouped walk: ``rows`` (>= 1, at most the token tile) of expert ``group``'s
    rows, starting at activation row ``row0``."""

    group: int
    row0: int
    rows: int


@dataclass(frozen=True)
class GroupedStripStreamK:
    """The grouped decode GEMV's walk (TileSchedule(grouped=True); the Python twin of
    ``scheduler/grouped_rows.hpp``): each expert's rows cut into items of up to ``tokens`` rows,
    the items' strips x K chunks dealt like one problem's (:class:`StripStreamK` over
    ``items x strips`` strips). Built from the rows on the host here; the kernel builds the same
    table from ``offs`` on the device.

    >>> w = GroupedStripStreamK.from_offs([0, 3, 3, 20], tokens=8, n=256, k=512, dtype="e4m3xe2m1", sm_count=132)
    >>> w.items
    (GroupItem(group=1, row0=0, rows=3), GroupItem(group=3, row0=3, rows=8), GroupItem(group=3, row0=11, rows=8), GroupItem(group=3, row0=19, rows=1))
    """

    items: tuple[GroupItem, ...]
    strips_per_item: int
    schedule: StripStreamK

    @classmethod
    def from_offs(cls, offs, *, tokens: int, n: int, k: int, dtype: str, sm_count: int,
                  masked_rows: int = 0) -> "GroupedStripStreamK":
        """``offs``: torch's cumulative row ends (or, with ``masked_rows`` > 0, the masked form's
        per-expert counts, expert e's rows starting at e * masked_rows)."""
        one = StripStreamK.for_problem(n=n, k=k, dtype=dtype, sm_count=sm_count)
        items, prev = [], 0
        for e, v in enumerate(int(x) for x in offs):
            begin, end = (e * masked_rows, e * masked_rows + v) if masked_rows else (prev, v)
            if end < begin:
                raise ValueError(f"offs must be non-decreasing (offs[{e}] = {v} < {begin})")
            items += [GroupItem(e, r, min(tokens, end - r)) for r in range(begin, end, tokens)]
            prev = end
        if not items:
            raise ValueError("no expert has rows: nothing to walk")
        strips = len(items) * one.strips
        return cls(tuple(items), one.strips, StripStreamK(strips, one.chunks, min(strips * one.chunks, sm_count)))

    def unit(self, u: int) -> tuple[GroupItem, int, int]:
        """Unit ``u``: its item, the strip in the expert's weight, and its K chunk."""
        gs, chunk = divmod(u, self.schedule.chunks)
        item, strip = divmod(gs, self.strips_per_item)
        return self.items[item], strip, chunk
