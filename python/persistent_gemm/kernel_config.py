"""A kernel configuration and its canonical name.

A :class:`KernelConfig` holds a :class:`~persistent_gemm.schedule.TileSchedule` beside the
tile shape, pipeline depth, kernel style, input dtype family and target arch. Its canonical
name, e.g. ``sm90a_bf16_128x256x64_c2x1_sw8_row_coop``, is at once the ``config=`` string the
ops accept, the generated file's stem, the pytest id and the benchmark label. The name is
written and read from one table (:data:`_NAME_PARTS`), built from the field vocabulary
(:mod:`persistent_gemm.config_fields`); :func:`parse_name` is its inverse and the one place a
name is taken apart. The rules a config keeps are :mod:`persistent_gemm.config_rules`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

from .config_fields import (ACCUM_TOKEN, ARCHS, DTYPES, ROUTE_TOKENS, STYLE_TOKENS, SWAP_TOKEN, Accum, Arch, Dtype,
                            Kernel, Route)
from .config_rules import rejection
from .library import lowering
from .schedule import RASTER_ALIASES, TileSchedule

_TOKEN_STYLE = {v: k for k, v in STYLE_TOKENS.items()}
_TOKEN_ROUTES = {v: k for k, v in ROUTE_TOKENS.items()}


class ConfigError(ValueError):
    """A kernel configuration that cannot be instantiated; the message says why."""


@dataclass(frozen=True)
class KernelConfig:
    """One kernel instantiation.

    Parameters
    ----------
    tile : (tile_m, tile_n, tile_k)
        CTA tile. On SM90 cooperative kernels split tile_m across two consumer warpgroups
        (tile_m in {128, 256}); ping-pong consumers each own a whole tile (tile_m = 64 or 128).
        tile_k * element bytes must be 64 or 128 (one swizzled shared-memory row), or 256 (two
        128 B swizzle atoms) for the sm90a 16-bit and e4m3 kernels.
    schedule : TileSchedule
        Swizzle, cluster shape and raster order.
    stages : int or None
        Shared-memory pipeline depth; ``None`` lets CUTLASS fill the shared memory left after
        the epilogue (``StageCountAutoCarveout``).
    kernel : {"cooperative", "pingpong"} on sm90a, {"1sm", "2sm"} on sm100a
        (the name tokens ``"coop"`` and ``"pp"`` are accepted and stored as the full spelling)
    dtype : {"bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1"}
    arch : {"sm90a", "sm100a"}
    accum : {"promoted", "fast"}
        FP8 accumulation (see :data:`ACCUMS`); ``"fast"`` exists for e4m3 on sm90a only (tcgen05
        accumulates in fp32 throughout) and adds the ``_fastacc`` token to the name.
    swap_ab : bool
        The kernel computes D^T = W X^T: the weight fills the wgmma's 64-row M side and the
        tokens become a narrow N (decode), D is written transposed; ``tile`` is then
        (weight rows, tokens, K). Adds the ``_swapab`` token. sm90a only; FP8 x FP4 requires it
        (its e2m1 weight is converted in registers, which only the A side allows). Swap-AB and
        split-K kernels of the 16-bit and e4m3 families write D by predicated stores.
    route : {"promote", "bf16", "fold"}
        MX families only (see :data:`MX_ROUTES`): ``"bf16"`` folds both block scales into bf16
        operands and accumulates in fp32 over the whole K (sm90a, swap-AB, tile_k = 64);
        ``"fold"`` (FP8 x FP4) folds the weight's scale into its e4m3 conversion and promotes
        per block with the activation's.
    """

    tile: tuple[int, int, int] = (128, 256, 64)
    schedule: TileSchedule = field(default_factory=TileSchedule)
    stages: Optional[int] = None
    kernel: Kernel = "cooperative"
    dtype: Dtype = "bf16"
    arch: Arch = "sm90a"
    accum: Accum = "promoted"
    swap_ab: bool = False
    route: Route = "promote"

    def __post_init__(self) -> None:
        object.__setattr__(self, "tile", tuple(int(t) for t in self.tile))
        # The names' style tokens are accepted as spellings of the style ("pp" -> "pingpong").
        # Also "ping-pong", "Ping_Pong", "coop": case, '-' and '_' do not matter.
        if isinstance(self.kernel, str):
            key = self.kernel.lower().replace("-", "").replace("_", "")
            style = _TOKEN_STYLE.get(key) or next((s for s in STYLE_TOKENS if s == key), None)
            if style is not None:
                object.__setattr__(self, "kernel", style)
        reason = self.rejection()
        if reason:
            raise ConfigError(f"invalid kernel config: {reason}")

    def rejection(self) -> Optional[str]:
        """The first rule this config breaks, as a one-line reason, or None (:mod:`~persistent_gemm.config_rules`)."""
        return rejection(self)

    @property
    def cta_tile(self) -> tuple[int, int]:
        """The output tile one CTA owns, which is what the scheduler counts. Equal to
        ``tile[:2]`` except for 2-SM UMMA, where a CTA pair shares one ``tile_m``-row MMA tile
        and each CTA owns half of its rows."""
        tm, tn, _ = self.tile
        return (tm // 2, tn) if self.kernel == "2sm" else (tm, tn)

    def grid(self, M: int, N: int, *, batch: int = 1, K: Optional[int] = None):
        """This config's schedule bound to an (M, N) problem, in CTA tiles (and, given ``K``,
        its K-tiles, which split-K divides). The extents are the kernel's: for a ``swap_ab``
        config, which computes D^T, pass the op's (N, M)."""
        return self.schedule.over(M, N, (*self.cta_tile, self.tile[2]), batch=batch, K=K)

    def kernel_rejection(self) -> Optional[str]:
        """Why no kernel can be generated for this (valid) config, or None. A valid config can
        always be named, walked, pictured and parity-tested; only these cannot be compiled."""
        low = lowering(self.arch, self.dtype)
        if low is None:
            return f"no kernel lowering exists for {self.arch} {self.dtype}"
        s = self.schedule
        sm100_grouped = self.arch == "sm100a" and self.dtype in ("mxfp8", "e4m3xe2m1")
        if s.grouped and self.kernel != "gemv" and not (self.arch == "sm90a" and self.route == "bf16") \
                and not sm100_grouped:
            return (f"grouped=True: the grouped kernels are the decode GEMV, the sm90a MX bf16 route and the "
                    f"sm100a MXFP8 / FP8 x FP4 kernels (not {self.arch} {self.dtype} {self.kernel}, route {self.route}), so "
                    f"{self.name} cannot be built; its walk can (persistent_gemm.grouped_walk)")
        if s.grouped and sm100_grouped and (self.kernel != "1sm" or (s.cluster_m, s.cluster_n) != (1, 1)):
            # Sm100GemmPersistent's static_assert: a padded band of an expert's rows is one CTA tile.
            return (f"grouped SM100 kernels run 1x1 clusters and 1-SM MMAs: a padded band is one CTA tile "
                    f"({self.name} is {self.kernel}, cluster {s.cluster_m}x{s.cluster_n})")
        if (s.split_k > 1 or s.stream_k) and (self.arch != "sm90a" or low.tu != "gemm"):
            what = f"split_k={s.split_k}" if s.split_k > 1 else "stream_k=True"
            return (f"{what}: the K-range reduction is built into the sm90a 16-bit and "
                    f"e4m3 kernels only (not {self.arch} {self.dtype}), so {self.name} cannot be built; its "
                    f"schedule can still be walked and pictured")
        return None

    # -- naming ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The canonical name: one token per field of :data:`_NAME_PARTS`, ``_`` between them."""
        return "_".join(t for t in (part.text(self) for part in _NAME_PARTS) if t is not None)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_name(cls, name: str) -> "KernelConfig":
        """Inverse of :attr:`name` (:func:`parse_name`). Raises :class:`ConfigError` naming the bad field."""
        return parse_name(name)

    # -- lowering --------------------------------------------------------------------------
    def template_args(self) -> dict[str, str]:
        """C++ spellings of this config's compile-time parameters (see codegen templates)."""
        tm, tn, tk = self.tile
        s = self.schedule
        raster = "Row" if s.raster == "row" else "Column"
        return {
            "name": self.name,
            "arch": self.arch,
            "tile_shape": f"cute::Shape<cute::_{tm}, cute::_{tn}, cute::_{tk}>",
            "cluster_shape": f"cute::Shape<cute::_{s.cluster_m}, cute::_{s.cluster_n}, cute::_1>",
            "tile_m": str(self.cta_tile[0]),  # the scheduler's (per-CTA) tile
            "tile_n": str(self.cta_tile[1]),
            "tile_k": str(tk),
            "cluster_m": str(s.cluster_m),
            "cluster_n": str(s.cluster_n),
            "swizzle": str(s.swizzle),
            "raster": f"persistent_gemm::scheduler::Raster::{raster}",
            "schedule_tag": (
                f"persistent_gemm::scheduler::PersistentSchedule<{s.swizzle}, {s.cluster_m}, {s.cluster_n}, "
                f"persistent_gemm::scheduler::Raster::{raster}"
                + (f", {s.split_k}>" if s.split_k > 1 else
                   (", 1, true>" if s.stream_k_lanes else ", 1, true, false>") if s.stream_k else
                   ", 1, false, true, true>" if s.grouped else ">")
            ),
            "stages": "0" if self.stages is None else str(self.stages),
            "kernel_style": {
                "cooperative": "persistent_gemm::kernel::Cooperative",
                "pingpong": "persistent_gemm::kernel::PingPong",
                "gemv": "persistent_gemm::kernel::Gemv",
                "1sm": "persistent_gemm::kernel::Umma1Sm",
                "2sm": "persistent_gemm::kernel::Umma2Sm",
            }[self.kernel],
            "dtype": self.dtype,
            "accum": ("persistent_gemm::kernel::AccumFast" if self.accum == "fast"
                      else "persistent_gemm::kernel::AccumPromoted"),
            "swap_ab": str(self.swap_ab).lower(),
            "split_k": str(s.split_k),
            "stream_k": str(s.stream_k).lower(),
            "route": self.route,
            "grouped": str(s.grouped).lower(),
        }


# -- the name, written and read from one table ---------------------------------------------------
class _Part(NamedTuple):
    """One token of a canonical name: how it is read (a regex with named groups, ``forms`` as
    the error message shows it) and written (``text``; None leaves an optional token out)."""

    pattern: str
    forms: tuple[str, ...]
    text: Callable[[KernelConfig], Optional[str]]
    optional: bool = False


def _one_of(tokens) -> str:
    """A regex alternation of ``tokens``, longest first (``bf16xe4m3`` before ``bf16``)."""
    return "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))


def _tokens(group: str, tokens) -> tuple[str, tuple[str, ...]]:
    tokens = tuple(dict.fromkeys(tokens))  # one each, in table order
    return rf"(?P<{group}>{_one_of(tokens)})", tokens


#: The canonical name, token by token, in order.
_NAME_PARTS: tuple[_Part, ...] = (
    _Part(_tokens("arch", ARCHS)[0], ("<arch>",), lambda c: c.arch),
    _Part(_tokens("dtype", DTYPES)[0], ("<dtype>",), lambda c: c.dtype),
    _Part(r"(?P<tm>\d+)x(?P<tn>\d+)x(?P<tk>\d+)", ("<tm>x<tn>x<tk>",), lambda c: "x".join(map(str, c.tile))),
    _Part(r"c(?P<cm>\d+)x(?P<cn>\d+)", ("c<cm>x<cn>",), lambda c: f"c{c.schedule.cluster_m}x{c.schedule.cluster_n}"),
    _Part(r"sw(?P<sw>\d+)", ("sw<S>",), lambda c: f"sw{c.schedule.swizzle}"),
    _Part(*_tokens("raster", RASTER_ALIASES.values()), lambda c: c.schedule.raster),
    _Part(r"sk(?P<sk>\d+)", ("sk<split_k>",), lambda c: f"sk{c.schedule.split_k}" if c.schedule.split_k > 1 else None,
          optional=True),
    _Part(r"(?P<streamk>streamk)", ("streamk",), lambda c: "streamk" if c.schedule.stream_k else None, optional=True),
    _Part(r"(?P<nolanes>nolanes)", ("nolanes",), lambda c: None if c.schedule.stream_k_lanes else "nolanes",
          optional=True),
    _Part(r"(?P<grouped>grouped)", ("grouped",), lambda c: "grouped" if c.schedule.grouped else None, optional=True),
    _Part(*_tokens("style", STYLE_TOKENS.values()), lambda c: STYLE_TOKENS[c.kernel]),
    _Part(*_tokens("swap", (SWAP_TOKEN,)), lambda c: SWAP_TOKEN if c.swap_ab else None, optional=True),
    _Part(*_tokens("accum", (ACCUM_TOKEN,)), lambda c: ACCUM_TOKEN if c.accum == "fast" else None, optional=True),
    _Part(*_tokens("route", ROUTE_TOKENS.values()), lambda c: ROUTE_TOKENS.get(c.route), optional=True),
    _Part(r"s(?P<stages>\d+)", ("s<stages>",), lambda c: None if c.stages is None else f"s{c.stages}", optional=True),
)


def _form(part: _Part) -> str:
    if part.optional:
        return "[" + "|".join("_" + f for f in part.forms) + "]"
    return "_" + (part.forms[0] if len(part.forms) == 1 else "<" + "|".join(part.forms) + ">")


_NAME_RE = re.compile("".join(f"(?:_{p.pattern})?" if p.optional else f"_{p.pattern}" for p in _NAME_PARTS)[1:])
_NAME_FORM = "".join(_form(p) for p in _NAME_PARTS)[1:]


def parse_name(name: str) -> KernelConfig:
    """The config a canonical name spells: the inverse of :attr:`KernelConfig.name`, and the one
    place a name is taken apart (its dtype is ``parse_name(name).dtype``, not a split on ``_``).
    Raises :class:`ConfigError` naming the bad field."""
    m = _NAME_RE.fullmatch(name)
    if not m:
        raise ConfigError(f"config name {name!r} is not of the form {_NAME_FORM}")
    g = m.groupdict()
    if g["sk"] is not None and int(g["sk"]) == 1:
        raise ConfigError(f"config name {name!r}: split_k=1 is written without the _sk token")
    try:
        schedule = TileSchedule(
            swizzle=int(g["sw"]), cluster=(int(g["cm"]), int(g["cn"])), raster=g["raster"],
            split_k=int(g["sk"]) if g["sk"] else 1, stream_k=g["streamk"] is not None,
            stream_k_lanes=g["nolanes"] is None, grouped=g["grouped"] is not None,
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config name {name!r}: {e}") from None
    return KernelConfig(
        tile=(int(g["tm"]), int(g["tn"]), int(g["tk"])),
        schedule=schedule,
        stages=int(g["stages"]) if g["stages"] else None,
        kernel=_TOKEN_STYLE[g["style"]],
        dtype=g["dtype"],
        arch=g["arch"],
        accum="fast" if g["accum"] else "promoted",
        swap_ab=bool(g["swap"]),
        route=_TOKEN_ROUTES[g["route"]] if g["route"] else "promote",
    )


def as_config(config) -> KernelConfig:
    """``config`` itself, or the config a canonical name spells (any valid spec, in the catalogue
    or not); ConfigError names a bad name's fault, TypeError anything else."""
    if isinstance(config, str):
        return parse_name(config)
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig or a canonical config name, got {type(config).__name__}")
    return config
