"""Row tiles: the call shapes a prefill's matmuls and attention run in, so that a token's result never
depends on the call it was computed in.

BLAS and oneDNN pick kernels, blockings and thread splits by a call's row count. On an Intel CPU with
AMX, a float32 matmul of 57 to 192 rows over 1,536 inputs splits its sums across the two threads
where 16 or 1,024 rows do not, and bfloat16's AMX kernels block 48 to 512 rows another way than 16,
32 or 1,024: the same token then rounds differently in a cached suffix than in a full prefill. Which
row counts share a path is a property of the library, the CPU and the thread count, so it is
measured, not assumed: a :class:`TileMenu` holds the row counts (multiples of ``TILE``) whose every
row equals the ``TILE``-row call's on seeded data, at several tile offsets; a call of ``R`` rows runs
as a sequence of tiles from the menu (the last padded), the cover of least measured time. Every row
then gets the ``TILE``-row result, wherever it stands and whatever shares the call with it. Menus are
measured once per process for each (shape, dtype, threads) and kept.

Example:
    >>> menu = TileMenu(sizes=(16, 64), seconds=(1.0, 2.0))
    >>> menu.plan(100)  # 112 rows as 64 + 64 (cost 4) beats 64 + 16 + 16 + 16 (cost 5)
    (64, 64)
    >>> menu.plan(20)
    (16, 16)
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.calibration_cache import recall, remember
from engine.isa import path_key

TILE = 16  # the base tile: every other menu size must give its rows the same bits
CANDIDATES = (32, 64, 128, 256, 512, 1024)  # other call sizes a menu may admit
_OFFSETS = (0, TILE, 3 * TILE)  # tile starts at which a candidate must reproduce the base rows
TIMING_ROUNDS = 5
MENU_KIND = "tiles-v2"  # the stored kind: a new way of timing takes a new name, so old timings are retaken


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class TileMenu:
    """The call sizes (rows) that give every row the base tile's result, and the time each call takes.

    Example:
        >>> TileMenu(sizes=(16, 32, 1024), seconds=(1e-4, 1.5e-4, 2e-3)).plan(500)
        (1024,)
    """

    sizes: tuple[int, ...]  # ascending, sizes[0] == TILE
    seconds: tuple[float, ...]  # one call of each size

    def __post_init__(self) -> None:
        assert self.sizes and self.sizes[0] == TILE and len(self.sizes) == len(self.seconds)

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def plan(self, rows: int) -> tuple[int, ...]:
        """Tile sizes, largest first, whose sum covers ``rows`` at the least total time."""
        return _cover(self, max(rows, 1) // TILE + (max(rows, 1) % TILE > 0))

    def padded(self, rows: int) -> int:
        """Rows a call of ``rows`` runs, padding included."""
        return sum(self.plan(rows))


@functools.lru_cache(maxsize=4096)
def _cover(menu: TileMenu, units: int) -> tuple[int, ...]:
    """The cheapest multiset of menu sizes covering ``units`` base tiles (a small knapsack)."""
    best: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for u in range(1, units + 1):
        options = []
        for size, cost in zip(menu.sizes, menu.seconds):
            prev_cost, prev = best[max(0, u - size // TILE)]
            options.append((prev_cost + cost, (size, *prev)))
        best.append(min(options, key=lambda o: (o[0], len(o[1]))))
    return tuple(sorted(best[units][1], reverse=True))


def problem_rows(candidates: tuple[int, ...] = CANDIDATES) -> int:
    """Rows the seeded problem given to :func:`calibrate` must have."""
    return _OFFSETS[-1] + max(candidates)


def calibrate(run: Callable[[int, int], torch.Tensor], candidates: tuple[int, ...] = CANDIDATES) -> TileMenu:
    """The menu for one operation. ``run(start, size)`` computes rows ``[start, start + size)`` of one
    fixed seeded problem of ``problem_rows(candidates)`` rows as one call (rows on axis 0)."""
    base = torch.cat([run(s, TILE) for s in range(0, problem_rows(candidates), TILE)])
    sizes = [TILE]
    for size in candidates:
        if all(torch.equal(run(o, size), base[o : o + size]) for o in _OFFSETS):
            sizes.append(size)
    return TileMenu(tuple(sizes), _call_seconds(run, sizes))


def _call_seconds(run: Callable[[int, int], torch.Tensor], sizes: list[int]) -> tuple[float, ...]:
    """Each size's call time, the least over rounds that time every size once in turn: a burst of
    load on a busy machine inflates one round of all sizes, not one size in every round."""
    times: list[list[float]] = [[] for _ in sizes]
    for _ in range(TIMING_ROUNDS):
        for size, kept in zip(sizes, times):
            _timed(run, 0, size, kept)
    return tuple(min(kept) for kept in times)


def _timed(
    run: Callable[[int, int], torch.Tensor], start: int, size: int, times: list[float]
) -> torch.Tensor:
    t0 = time.perf_counter()
    out = run(start, size)
    times.append(time.perf_counter() - t0)
    return out


BASE_MENU = TileMenu(sizes=(TILE,), seconds=(1.0,))  # base tiles only: exact anywhere, never measured
_menus: dict[tuple[object, ...], TileMenu] = {}
_menus_lock = threading.Lock()


def linear_menu(in_features: int, out_features: int, dtype: torch.dtype) -> TileMenu:
    """The menu of a float ``[out, in]`` Linear of this dtype on this machine (measured once)."""
    key = ("linear", in_features, out_features, dtype)
    return cached_menu(key, lambda: _calibrate_linear(in_features, out_features, dtype))


def _calibrate_linear(in_features: int, out_features: int, dtype: torch.dtype) -> TileMenu:
    gen = torch.Generator().manual_seed(0)
    rows = problem_rows()
    weight = (torch.randn(out_features, in_features, generator=gen) / in_features**0.5).to(dtype)
    x = torch.randn(rows, in_features, generator=gen).to(dtype)
    with torch.inference_mode():
        return calibrate(lambda start, size: F.linear(x[start : start + size], weight))


def cached_menu(key: tuple[object, ...], measure: Callable[[], TileMenu]) -> TileMenu:
    """A menu kept under ``key`` (plus the path key), in this process and on disk for the next ones
    (engine.calibration_cache), measured on first use."""
    full = (*key, *path_key())
    with _menus_lock:
        menu = _menus.get(full)
        if menu is None:
            menu = _menus[full] = _stored(key) or _measured(key, measure)
    return menu


def _stored(key: tuple[object, ...]) -> TileMenu | None:
    value = recall(MENU_KIND, key)
    try:
        return None if value is None else TileMenu(tuple(value["sizes"]), tuple(value["seconds"]))
    except (KeyError, TypeError, AssertionError):
        return None  # malformed: measure again


def _measured(key: tuple[object, ...], measure: Callable[[], TileMenu]) -> TileMenu:
    menu = measure()
    remember(MENU_KIND, key, {"sizes": list(menu.sizes), "seconds": list(menu.seconds)})
    return menu


def tiled_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    menu: TileMenu,
    bias: torch.Tensor | None = None,
    matmul: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``x [R, in] @ weight.T`` as calls of the menu's sizes: row i depends on ``x[i]`` alone.

    The bias is added afterwards, elementwise, so it never enters a kernel's accumulation.
    ``matmul(part)``: the kernel each call runs (default ``F.linear(part, weight)``); the menu must
    have been calibrated on that kernel.
    """
    rows = x.shape[0]
    product = matmul or (lambda part: F.linear(part, weight))
    parts, start = [], 0
    for size in menu.plan(rows):
        part = x[start : start + size]
        if part.shape[0] < size:  # the last tile: only its own rows are copied to pad it
            part = torch.cat([part, part.new_zeros(size - part.shape[0], x.shape[1])])
        parts.append(product(part))
        start += size
    out = (parts[0] if len(parts) == 1 else torch.cat(parts))[:rows]
    return out if bias is None else out + bias
