"""Stream-K's arithmetic: how a tail of work units is cut and dealt (the module docstring of
:mod:`persistent_gemm.schedule` defines the walk; ``scheduler/tile_scheduler.hpp`` computes the
same numbers). :class:`EvenShare` is also the GEMV strips' deal (:mod:`.strip_schedule`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

#: Stream-K's tail gives each worker this many K-tiles at least (fewer workers take it if
#: needed), unless that would leave a tail unit without a worker of its own. Mirrored by
#: scheduler::kStreamKMinIters in tile_scheduler.hpp.
STREAM_K_MIN_ITERS = 4


class EvenShare:
    """``items`` dealt to ``parts`` workers as contiguous ranges whose sizes differ by at most one
    (the larger first): stream-K's tail (:class:`StreamKPartition`) and the GEMV's strips
    (strip_schedule.StripStreamK) deal their work this way. A subclass names the two counts."""

    @property
    def items(self) -> int:
        raise NotImplementedError

    @property
    def parts(self) -> int:
        raise NotImplementedError

    def begin(self, w: int) -> int:
        """First item of worker ``w`` (``w = parts``: the end)."""
        q, r = divmod(self.items, self.parts)
        return w * q + min(w, r)

    def owner(self, i: int) -> int:
        """The worker whose range holds item ``i`` (the inverse of :meth:`begin`)."""
        q, r = divmod(self.items, self.parts)
        big = r * (q + 1)  # items held by the r workers of q + 1
        return i // (q + 1) if i < big else r + (i - big) // q


@dataclass(frozen=True)
class StreamKPartition(EvenShare):
    """How stream-K cuts a problem's units (:func:`stream_k_partition`), and in how many lanes
    it deals the tail (:meth:`with_lanes`): its items are one lane's (position, K-tile)
    iterations, position-major, its parts one lane's workers (with one lane: the tail's
    (unit, K-tile) iterations and all its workers)."""

    dp_units: int    # the data-parallel head: ids [0, dp_units), a multiple of the workers
    sk_units: int    # the stream-K tail: ids [dp_units, dp_units + sk_units)
    sk_workers: int  # workers sharing the tail's iterations (0: no tail), a multiple of lanes
    k_tiles: int
    lanes: int = 1   # the tail's lanes (:func:`stream_k_lanes`): each lane is an even share

    @property
    def items(self) -> int:
        """Iterations of one lane: its positions times the K-tiles."""
        return self.sk_units // self.lanes * self.k_tiles

    @property
    def parts(self) -> int:
        """Workers of one lane."""
        return self.sk_workers // self.lanes

    def pieces(self, t: int) -> int:
        """Pieces tail unit ``t`` (counted from the tail's start) is cut into."""
        kt, pos = self.k_tiles, t // self.lanes
        return self.owner((pos + 1) * kt - 1) - self.owner(pos * kt) + 1

    def with_lanes(self, lanes: int) -> "StreamKPartition":
        """This partition dealt in ``lanes`` lanes (``sk_workers`` rounded down to a multiple)."""
        if lanes == 1 or self.sk_units == 0:
            return self
        if self.sk_units % lanes or self.sk_workers < lanes:
            raise ValueError(f"{lanes} lanes need a tail of whole lane positions and a worker per lane, got {self}")
        return dataclasses.replace(self, sk_workers=self.sk_workers // lanes * lanes, lanes=lanes)


def stream_k_partition(units: int, k_tiles: int, workers: int) -> StreamKPartition:
    """Stream-K's data-parallel head and stream-K tail for ``units`` work units of ``k_tiles``
    K-tiles on ``workers`` workers (the module docstring; ``tile_scheduler.hpp`` computes the same).

    >>> stream_k_partition(units=96, k_tiles=64, workers=132)   # under one wave: all stream-K
    StreamKPartition(dp_units=0, sk_units=96, sk_workers=132, k_tiles=64, lanes=1)
    >>> stream_k_partition(units=300, k_tiles=64, workers=132)  # one full wave, then the last 36 + 132
    StreamKPartition(dp_units=132, sk_units=168, sk_workers=132, k_tiles=64, lanes=1)
    >>> stream_k_partition(units=264, k_tiles=64, workers=132)  # whole waves: data-parallel
    StreamKPartition(dp_units=264, sk_units=0, sk_workers=0, k_tiles=64, lanes=1)
    """
    full, rest = divmod(units, workers)
    if rest == 0:
        return StreamKPartition(units, 0, 0, k_tiles)
    sk_units = rest + workers if full >= 1 else units
    sk_workers = min(workers, max(sk_units, sk_units * k_tiles // STREAM_K_MIN_ITERS))
    return StreamKPartition(units - sk_units, sk_units, sk_workers, k_tiles)


def stream_k_lanes(part: StreamKPartition, clusters_major: int, clusters_minor: int, swizzle: int) -> int:
    """Lanes of a stream-K tail (module docstring): the width of the panel it lies in, when the
    tail is whole panel columns of panels of one width, else 1 (``tile_scheduler.hpp``'s
    ``stream_k_lanes`` computes the same). Consecutive ids of a panel column share a strip of
    the minor operand, so a lane position is one column.

    >>> stream_k_lanes(stream_k_partition(48, 64, 66), clusters_major=3, clusters_minor=16, swizzle=8)
    3
    >>> stream_k_lanes(stream_k_partition(47, 64, 66), clusters_major=3, clusters_minor=16, swizzle=8)  # ragged
    1
    """
    if part.sk_units == 0:
        return 1
    narrow = clusters_major % swizzle
    last = narrow or swizzle
    if part.sk_units <= last * clusters_minor:
        lanes = last                # inside the last panel, which ends where the ids end
    elif narrow == 0:
        lanes = swizzle             # panels of one width throughout (batches start on one)
    else:
        return 1
    return lanes if lanes > 1 and part.sk_units % lanes == 0 and part.sk_workers >= lanes else 1
