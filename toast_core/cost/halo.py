"""Which collective-permutes XLA's SPMD partitioner emits to slice a sharded dim.

A `slice` (or one piece of a `split`) along a dim sharded n ways, whose result stays sharded n
ways on that dim, is partitioned as a windowed read of the operand (the partitioner's
`ReshardAsWindowedInput`): shard i of the result covers elements
`[start + i * out, start + (i + 1) * out)` of the operand (`out` = result size / n), while shard i
of the operand holds `[i * s, (i + 1) * s)` (`s` = dim size / n). What shard i lacks on its left
(`left(i) = i * s - window start`) and right (`right(i) = window limit - (i + 1) * s`) it receives
from other shards by collective-permutes (XLA's `ExchangeHaloAndGetValidData`,
xla/service/spmd/spmd_partitioner_util.cc), in one of two forms:

* **compact** (`ExchangeHaloCompact`), when the farthest halo exceeds twice the result shard:
  every shard lists the pieces of its window by source shard; permutes are built greedily, each
  taking at most one pending piece per source and per destination (a small left piece is not
  merged with a small right piece), and moving the union of their ranges within a source shard;
* **neighbour** (`ExchangeHalo`): one permute per shard distance on each side, each moving the
  largest halo at that distance (from shard i - k - 1 to i, and from i + k + 1 to i).

When neither applies (the window covers half the dim or more), XLA gathers the operand instead.

Worked example (measured on the GNS edge split, [256, 192] sharded 4 ways into three [256, 64]
pieces, s = 48, out = 16): piece 0 is compact, permutes of 32 and 16 columns; piece 1 neighbour,
32 from the left and 32 from the right; piece 2 compact, three permutes of 16: 7 permutes, 160
columns, where a gather would have moved 192 columns to every device.
"""

from __future__ import annotations

import math

from toast_core.errors import ToastError, bad_value

__all__ = ["slice_halo_permutes"]


def slice_halo_permutes(dim_size: int, n: int, start: int, size: int) -> tuple[int, ...] | None:
    """Sizes (elements along the dim) of the collective-permutes XLA emits to slice
    `[start, start + size)` of a dim of `dim_size` elements sharded `n` ways into a result
    sharded `n` ways; None when XLA gathers the operand instead (module essay). An empty slice
    (size 0: an edge pad's gradient can take one) moves nothing."""
    if n < 1 or dim_size < 1 or size < 0 or start < 0 or start + size > dim_size:
        raise ToastError(
            bad_value("slice_halo_permutes", (dim_size, n, start, size), "a slice inside the dim")
        )
    if n == 1 or size == 0:
        return ()
    if dim_size % n or size % n:
        return None
    s, out = dim_size // n, size // n
    left = [i * s - (start + i * out) for i in range(n)]
    right = [(start + (i + 1) * out) - (i + 1) * s for i in range(n)]
    max_halo = max(max(left), max(right))
    # XLA's test: left(0) equals the slice's explicit left padding (-start) always here, and the
    # widest window (s + left + right = out) equals the result shard.
    if max_halo > 2 * out:
        if out * 2 >= n * s:
            return None
        return _compact(s, n, start, out)
    return _neighbour(s, n, left, right)


def _neighbour(s: int, n: int, left: list[int], right: list[int]) -> tuple[int, ...] | None:
    """`ExchangeHalo`: permutes per shard distance, left side then right side."""
    max_left = max(left[1:])
    max_right = max(right[: n - 1])
    if max_left + max_right + s >= s * n and (max_left > s or max_right > s):
        return None
    left_bound = -max(left)
    right_bound = s + max(right)
    if left_bound >= right_bound:
        return None
    sizes = []
    for i in range(math.ceil(max_left / s) - 1, -1, -1):
        if (-i - 1) * s >= right_bound:
            break
        size = min(max_left - s * i, s) - max(-i * s - right_bound, 0)
        if n > i + 1 and size > 0:
            sizes.append(size)
    skipped = min(max(left_bound - s, 0), max(max_right, 0)) // s
    for i in range(skipped, math.ceil(max_right / s)):
        size = min(max_right - s * i, s) - max(left_bound - (i + 1) * s, 0)
        if n > i + 1 and size > 0:
            sizes.append(size)
    return tuple(sizes)


def _compact(s: int, n: int, start: int, out: int) -> tuple[int, ...]:
    """`ExchangeHaloCompact`: greedy permutes over the (source, destination) pieces."""
    # Per source shard, the pieces other shards need from it: (destination, lo, hi) in the
    # source's local coordinates, in order of their offset in the destination's window (one
    # piece per destination here: a result shard is never wider than the operand shard when the
    # compact form is chosen, but a window may straddle two sources).
    pending: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n)]
    for i in range(n):
        lo, hi = start + i * out, start + (i + 1) * out
        at = lo
        while at < hi:
            src = at // s
            piece_lo = at - src * s
            piece_hi = min(s, hi - src * s)
            if src != i:
                pending[src].append((at - lo, i, piece_lo, piece_hi))
            at = src * s + piece_hi
    for p in pending:
        p.sort(key=lambda x: x[0])
    return tuple(width for width, _ in _greedy_permutes(pending, s, lambda t: t[1:]))


def _greedy_permutes(pending: list[list], s: int, piece) -> list[tuple[int, list]]:
    """The permutes `ExchangeHaloCompact` builds greedily from `pending` (per source shard, the
    pieces other shards need from it, in window order; `piece(item)` is (destination, lo, hi)
    in the source's local coordinates, of a shard of `s` elements): each round takes every
    source's next piece unless its destination is already served or the ranges would wrap.
    Per permute: (the width of its range, the pending items it carries)."""
    nxt = [0] * len(pending)
    out = []
    while True:
        seen: set[int] = set()
        lo, hi, carried = s, 0, []
        for src, items in enumerate(pending):
            if nxt[src] >= len(items):
                continue
            dst, p_lo, p_hi = piece(items[nxt[src]])
            if carried and (
                dst in seen
                or (lo > p_hi and hi == s and p_lo == 0)
                or (hi < p_lo and lo == 0 and p_hi == s)
            ):
                continue
            seen.add(dst)
            lo, hi = min(lo, p_lo), max(hi, p_hi)
            carried.append(items[nxt[src]])
            nxt[src] += 1
        if not carried:
            return out
        out.append((hi - lo, carried))


def compact_halo_selects(
    dim_size: int, n: int, start: int, size: int
) -> tuple[tuple[int, int], ...]:
    """Per piece of the window `ExchangeHaloCompact` concatenates for the slice
    `[start, start + size)` of a dim of `dim_size` elements cut `n` ways: (piece elements along
    the dim, selects). Each shard's piece comes from its own data or one of the permutes, chosen
    by the shard's ordinal: one select over the piece per source beyond the first (among the
    shards' distinct sources at that piece). Empty unless XLA takes the compact form
    (`slice_halo_permutes`); measured: `x[0:16]` of x f32[32, 4] on 8 devices, the permutes of
    4 and 2 rows and the own rows are two selects of [4, 4] (32 flops, with a convert and two
    compares 35 of XLA's 99); `x[16:32]`, two selects of [2, 4] (19)."""
    if n < 2 or size == 0 or dim_size % n or size % n:
        return ()
    s, out = dim_size // n, size // n
    max_halo = max(
        max(i * s - (start + i * out) for i in range(n)),
        max((start + (i + 1) * out) - (i + 1) * s for i in range(n)),
    )
    if max_halo <= 2 * out or out * 2 >= n * s:
        return ()
    # Each shard's window split at the source shards' bounds: [source, lo, hi] in the source's
    # local coordinates, in window order; the source's own index marks its own data.
    halos = []
    for i in range(n):
        lo, hi, pieces = start + i * out, start + (i + 1) * out, []
        at = lo
        while at < hi:
            src = at // s
            piece_hi = min(s, hi - src * s)
            pieces.append([src, at - src * s, piece_hi, at - lo])
            at = src * s + piece_hi
        halos.append(pieces)
    # The permutes, built greedily as `_compact` builds them: cp[i][j] is the permute bringing
    # piece j of shard i (-1: the shard's own data), with each permute's range in its source.
    pending = [[] for _ in range(n)]
    for i, pieces in enumerate(halos):
        for j, (src, _, _, offset) in enumerate(pieces):
            if src != i:
                pending[src].append((offset, i, j))
    for p in pending:
        p.sort()
    cp = [[-1] * len(pieces) for pieces in halos]
    ranges = []
    piece = lambda t: (t[1], *halos[t[1]][t[2]][1:3])  # noqa: E731
    for k, (width, carried) in enumerate(_greedy_permutes(pending, s, piece)):
        ranges.append(width)
        for _, dst, j in carried:
            cp[dst][j] = k
    out_pieces = []
    for j in range(max(len(p) for p in halos)):
        sources, widest, self_lo, self_hi = set(), 0, s, 0
        for i, pieces in enumerate(halos):
            if j >= len(pieces):
                continue
            sources.add(cp[i][j])
            if cp[i][j] >= 0:
                widest = max(widest, ranges[cp[i][j]])
            else:
                self_lo, self_hi = min(self_lo, pieces[j][1]), max(self_hi, pieces[j][2])
                widest = max(widest, self_hi - self_lo)
        out_pieces.append((widest, len(sources) - 1))
    return tuple(out_pieces)
