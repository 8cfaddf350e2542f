"""The legality rules of a strategy, in one place, in a whole and an incremental form.

A strategy is legal on a mesh when

1. every named dim it shards exists under its chosen conflict options, names mesh axes of the
   mesh, each once, and its size is divisible by their shard count (no silent padding);
2. no value and no operand use holds one mesh axis on two dims (an unresolved self-conflict or
   axis clash: `scores[S_model, T_model]` cannot be laid out);
3. no dim split into sub-factors (`[D]` read as `[H, Dh]`) shards a minor sub-factor while a
   more major one is not completely split: that would be a strided layout, which no
   `PartitionSpec` expresses;
4. no named dim that a known XLA limitation forbids on this mesh is sharded
   (`StrategySpace.blocked`: a convolution's spatial dims on a mesh with several mesh axes).

`strategy_problems` checks a whole strategy and returns every problem (the error lists them
together). `why_illegal_shard` checks one search step, "add mesh axis a to unit u", against the
same rules from the state's masks and what depends on the unit alone (`ShardCheck`), and
`legal_shards` every step of a state at once, so that the search can never build a state that
`Strategy.validate` would reject.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from toast_core.errors import StrategyError, bad_value

if TYPE_CHECKING:
    from toast_core.strategy.space import StrategySpace, Unit

#: At most this many problems of each kind are spelled out in one error.
SHOWN_PER_KIND = 3


# -- the rules, on arrays ------------------------------------------------------------------------


def indivisible(size: int, ways: int) -> bool:
    """Rule 1: a dim of `size` cannot be split `ways` ways evenly."""
    return size % ways != 0


def double_axis_rows(matrix: sp.csr_matrix, bits: np.ndarray) -> list[tuple[int, int]]:
    """Rule 2: (row, mesh axis) pairs where a row of `matrix` (a value or a use, counting its
    atoms per fine class) would hold one mesh axis twice; `bits` is `MeshAxes.bits(masks)`."""
    out = []
    for a in range(len(bits)):
        counts = matrix @ bits[a]
        for row in np.flatnonzero(counts > 1.5).tolist():
            out.append((row, a))
    return out


def strided_rows(split_fines: np.ndarray, masks_ext: np.ndarray, sizes_ext, ways) -> np.ndarray:
    """Rule 3: which split dims (rows of `split_fines`, fine classes major first, padded with a
    class of mask 0 and size 1) would be strided under the masks."""
    return strided_masks(masks_ext[split_fines], sizes_ext[split_fines], ways)


def strided_masks(m: np.ndarray, sizes: np.ndarray, ways) -> np.ndarray:
    """Rule 3 on the masks `m` and sizes of split dims' sub-factors (rows, major first)."""
    whole = ways[m] == sizes  # the sub-factor is completely split
    # A sub-factor k > 0 may be sharded only if every more major one is completely split.
    major_whole = np.logical_and.accumulate(whole, axis=1)
    return ((m[:, 1:] != 0) & ~major_whole[:, :-1]).any(axis=1)


# -- the whole form ------------------------------------------------------------------------------


def strategy_problems(space: StrategySpace, shardings, options, name: str = "") -> list[str]:
    """Every problem of the strategy (shardings: named dim name -> mesh axes; options: chosen
    conflict options), rules 1-3; an empty list when it is legal."""
    try:
        res = space.resolution(options)
    except StrategyError as exc:
        raise StrategyError(f"strategy {name or ''}: {exc}") from None
    mesh, ax = space.mesh, space.axes
    problems: list[str] = []
    well_formed = []  # entries whose own names and axes are fine, checked together below
    for dim_name, axes in shardings:
        if dim_name not in res.names:
            problems.append(bad_value("named dim", dim_name, "a named dim after the chosen cuts"))
            continue
        unknown = [a for a in axes if a not in ax.names]
        if unknown:
            problems.append(
                bad_value(f"shardings[{dim_name}]", unknown[0], f"a mesh axis of {mesh}")
            )
            continue
        if len(set(axes)) != len(axes):
            problems.append(bad_value(f"shardings[{dim_name}]", axes, "distinct mesh axes"))
            continue
        size = res.by_name(dim_name).size
        ways = int(ax.ways[ax.mask(axes)])
        if indivisible(size, ways):
            problems.append(
                f"named dim {dim_name} of size {size} is not divisible by mesh axes "
                f"{'x'.join(axes)} ({ways} ways)"
            )
            continue
        well_formed.append((dim_name, axes))
    # Clashes between entries are checked on the well-formed ones, so that one error lists
    # every problem rather than only the first kind found.
    masks = space.masks_of(well_formed, options)
    problems += _blocked_problems(space, masks, res)
    problems += _layout_problems(space, masks, res)
    return problems


def _blocked_problems(space: StrategySpace, masks: np.ndarray, res) -> list[str]:
    """Rule 4: named dims sharded although a known XLA limitation forbids it on this mesh."""
    out = []
    for d in res.dims:
        hit = next((f for f in d.fine if f in space.blocked and masks[f]), None)
        if hit is not None:
            out.append(
                f"named dim {d.name} must stay replicated on this mesh: {space.blocked[hit]}"
            )
    return out[:SHOWN_PER_KIND]


def _layout_problems(space: StrategySpace, masks: np.ndarray, res) -> list[str]:
    """Rules 2 and 3 on fine-class masks, in the order values, strided splits, uses."""
    ana, lay, ax = space.ana, space.layout, space.axes
    bits = ax.bits(masks)
    problems = []
    for row, a in double_axis_rows(lay.value_fine, bits)[:SHOWN_PER_KIND]:
        v = ana.program.values[row]
        problems.append(
            f"value {v.display()} would hold mesh axis {ax.names[a]!r} twice "
            f"({space.notation(masks, res, row)}): resolve its conflict or choose another axis"
        )
    if not problems and len(lay.split_fines):
        ext = np.append(masks, 0)
        sizes = np.append(ana.fine_size, 1)
        bad = np.flatnonzero(strided_rows(lay.split_fines, ext, sizes, ax.ways))
        for i in bad[:SHOWN_PER_KIND].tolist():
            vid, d = lay.split_owners[i]
            v = ana.program.values[vid]
            problems.append(
                f"value {v.display()} dim {d} would shard a minor sub-factor while its major "
                f"one is whole ({space.notation(masks, res, vid)}): a strided layout"
            )
    if not problems:
        for row, a in double_axis_rows(lay.use_fine, bits)[:SHOWN_PER_KIND]:
            opi, pos = lay.use_keys[row]
            op = ana.program.ops[opi]
            v = ana.program.values[op.operands[pos]]
            problems.append(
                f"{op.where()} would read {v.display()} with mesh axis {ax.names[a]!r} on two "
                "dims: resolve the conflict there or choose another axis"
            )
    return problems


# -- the incremental form ------------------------------------------------------------------------


def why_illegal_shard(
    space: StrategySpace, masks: np.ndarray, unit: Unit, a: int, forbidden: int = 0
) -> str | None:
    """None if adding mesh axis `a` to every fine class of `unit` keeps the state legal, else
    the reason; `forbidden` is the mesh axes the user forbids on the unit. The search calls
    this for every candidate step, so what depends on the unit alone is computed once
    (`ShardCheck`)."""
    return why_illegal_check(space, masks, space.shard_check(unit.fines), unit.size, a, forbidden)


def why_illegal_check(
    space: StrategySpace, masks: np.ndarray, chk: ShardCheck, size: int, a: int, forbidden: int
) -> str | None:
    """`why_illegal_shard` of the unit of `chk` and `size` (the search keeps both per unit)."""
    ax = space.axes
    bit = 1 << a
    if int(masks[chk.first]) & bit:
        return "already on that mesh axis"
    if forbidden & bit:
        return "forbidden by the user"
    if chk.blocked:
        return "a known XLA limitation keeps it replicated on this mesh"
    # Rule 1 for every distinct mask among the unit's parts (after a resolution, parts of
    # different named dims with one signature may already hold different mesh axes).
    for m in sorted(set(masks[chk.fines].tolist())):
        if indivisible(size, int(ax.ways[m | bit])):
            return f"size {size} is not divisible by {int(ax.ways[m | bit])} shards"
    # Rule 2. With the unit's own atoms at most once per row, a row breaks the rule exactly
    # when it already holds the mesh axis: when some fine class it holds (a neighbour of the
    # unit) does.
    if chk.holds_twice or int(np.bitwise_or.reduce(masks[chk.neighbors])) & bit:
        return "a value or op would hold that mesh axis twice"
    if chk.split_index.shape[1]:
        looked_up = chk.split_table[chk.split_base + masks[chk.split_index]]
        if int(np.bitwise_or.reduce(strided_axes(looked_up, ax.n))) & bit:
            return "it would shard a minor sub-factor of a split dim (strided)"
    return None


def strided_axes(looked_up: np.ndarray, n_axes: int) -> np.ndarray:
    """Rule 3 for every mesh axis at once: per split dim (columns of `looked_up`, the
    `ShardCheck.split_table` entries of its sub-factors under the state's masks, major first),
    the mesh axes whose addition to the unit would shard a minor sub-factor while a more major
    one is not completely split."""
    every = (1 << n_axes) - 1
    not_whole = looked_up[0] & every  # mesh axes leaving some more major sub-factor partial
    out = not_whole & (looked_up[1] >> n_axes)
    for k in range(2, len(looked_up)):
        not_whole |= looked_up[k - 1] & every
        out |= not_whole & (looked_up[k] >> n_axes)
    return out


class UnitTable:
    """What `legal_shards` needs of a tuple of units (one per resolution), whatever the state,
    as flat segments (one per unit, in unit order) that a few NumPy reductions fold per unit:

    * `static`: the mesh axes no state allows (forbidden by the user; all of them for a unit
      with a blocked class or atoms held twice);
    * rule 1: `indivisible[u * 2**n + m]`, the mesh axes whose addition to mask m leaves unit
      u's size indivisible, looked up for each part (`part_fines`, `part_base`);
    * rule 2: `near`, the fine classes sharing a value or a use with the unit (its own
      included): a mesh axis any of them holds would appear twice in that row;
    * rule 3: the split dims each unit touches (`ShardCheck.split_table`, stacked)."""

    def __init__(self, space: StrategySpace, units, forbidden: list[int]) -> None:
        checks = [space.shard_check(u.fines) for u in units]
        n, ax = len(units), space.axes
        self.n_units = n
        every = (1 << ax.n) - 1
        self.first = np.array([c.first for c in checks], dtype=np.int64)
        self.static = np.array(
            [f | (every if c.blocked or c.holds_twice else 0) for c, f in zip(checks, forbidden)],
            dtype=np.int64,
        )
        # Rule 1: bits a with size % ways[m | a] != 0, per unit and mask m.
        n_masks = 1 << ax.n
        size = np.array([u.size for u in units], dtype=np.int64)
        bad = np.zeros((n, n_masks), dtype=np.int64)
        for a in range(ax.n):
            ways = ax.ways[np.arange(n_masks) | (1 << a)].astype(np.int64)
            bad |= np.where(size[:, None] % ways[None, :] != 0, 1 << a, 0)
        self.indivisible = bad.ravel()
        self.part_fines, self.part_starts = _segments([c.fines for c in checks])
        self.part_base = np.repeat(
            np.arange(n, dtype=np.int64) * n_masks, [len(c.fines) for c in checks]
        )
        # Rule 2 (a unit touching no row gets its first class: `masks[first]` is refused anyway).
        near = [c.neighbors if len(c.neighbors) else c.fines[:1] for c in checks]
        self.near, self.near_starts = _segments(near)
        # Rule 3's split dims of every unit that touches some, stacked (`split_units`, each
        # unit's rows from `split_starts`): `legal_shards` tests them all, on every mesh axis,
        # at once.
        split = [(i, c) for i, c in enumerate(checks) if c.split_index.shape[1]]
        self.split_units = np.array([i for i, _ in split], dtype=np.int64)
        if split:
            self.split_table = np.concatenate([c.split_table for _, c in split])
            offsets = np.cumsum([0] + [len(c.split_table) for _, c in split[:-1]])
            self.split_base = np.concatenate(
                [c.split_base + o for (_, c), o in zip(split, offsets.tolist())], axis=1
            )
            self.split_index = np.concatenate([c.split_index for _, c in split], axis=1)
            _, self.split_starts = _segments([c.split_index[0] for _, c in split])


def _segments(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The arrays `parts` end to end, and where each starts (for `ufunc.reduceat`)."""
    lengths = np.array([len(p) for p in parts], dtype=np.int64)
    starts = np.zeros(len(parts), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    return flat, starts


def legal_shards(space: StrategySpace, masks: np.ndarray, table: UnitTable) -> np.ndarray:
    """[units, mesh axes]: whether adding the mesh axis to the unit keeps the state legal, for
    every unit of `table` at once: `why_illegal_shard`'s rules on arrays (the tree lists every
    legal shard of each new node, on the search's hot path; tests/test_legality_incremental.py
    checks the two agree). Rules 1 and 2 fold into one mask of refused mesh axes per unit."""
    ax = space.axes
    bits = np.int64(1) << np.arange(ax.n, dtype=np.int64)
    if not table.n_units:
        return np.zeros((0, ax.n), dtype=bool)
    refused = table.static | masks[table.first]
    refused |= np.bitwise_or.reduceat(
        table.indivisible[table.part_base + masks[table.part_fines]], table.part_starts
    )
    refused |= np.bitwise_or.reduceat(masks[table.near], table.near_starts)
    # Rule 3: every split dim a unit touches, for every mesh axis.
    if len(table.split_units):
        looked_up = table.split_table[table.split_base + masks[table.split_index]]
        strided = strided_axes(looked_up, ax.n)
        by_unit = np.bitwise_or.reduceat(strided, table.split_starts)
        refused[table.split_units] = refused[table.split_units] | by_unit
    return (refused[:, None] & bits) == 0


class ShardCheck:
    """What `why_illegal_shard` needs of one unit, whatever the state: its fine classes, the
    rows (values, uses) holding them with their atom counts, the fine classes those rows hold
    (its neighbours), and the split dims they touch (`split_table`)."""

    __slots__ = (
        "fines",
        "first",
        "blocked",
        "value_rows",
        "value_add",
        "use_rows",
        "use_add",
        "holds_twice",
        "neighbors",
        "split_index",
        "split_table",
        "split_base",
    )

    def __init__(self, space: StrategySpace, fines: tuple[int, ...]) -> None:
        self.fines = np.asarray(fines, dtype=np.int64)
        self.first = fines[0]
        self.blocked = bool(space.blocked) and any(f in space.blocked for f in fines)
        (self.value_rows, self.value_add), (self.use_rows, self.use_add) = space.touch(fines)
        # Some value or use holds the unit's atoms twice: any mesh axis would appear twice.
        self.holds_twice = bool(
            (len(self.value_add) and self.value_add.max() > 1.5)
            or (len(self.use_add) and self.use_add.max() > 1.5)
        )
        lay = space.layout  # incidence entries are atom counts, so every stored one is > 0
        self.neighbors = np.union1d(
            lay.value_fine[self.value_rows].indices, lay.use_fine[self.use_rows].indices
        ).astype(np.int64)
        split_fines = space.layout.split_fines[space.splits_touching(fines)]
        n_fine = len(space.fine_size_ext) - 1  # index n_fine is the padding class
        pad = (split_fines == n_fine).T  # [sub-factors, split dims], like the rest
        self.split_index = np.where(pad, 0, split_fines.T)
        table = _split_table(
            space.axes,
            np.isin(split_fines.T, self.fines),
            pad,
            space.fine_size_ext[split_fines.T],
        )
        self.split_table = table.ravel()
        width, rows, n_masks = table.shape
        self.split_base = np.arange(width * rows, dtype=np.int64).reshape(width, rows) * n_masks


def _split_table(ax, in_unit: np.ndarray, pad: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """[sub-factors, split dims, masks]: for each sub-factor of a split dim holding mask m,
    once the unit adds a mesh axis a: bit a set if the sub-factor is then not completely split
    (ways != size), and bits `ax.n` and up all set if it is then sharded at all (whatever a:
    the unit's own classes gain a mesh axis). The padding is whole and unsharded whatever the
    state (its mask reads as 0)."""
    n_masks = 1 << ax.n
    every = n_masks - 1
    m = np.arange(n_masks, dtype=np.int64)
    partial_in = np.zeros(sizes.shape + (n_masks,), dtype=np.int64)
    for a in range(ax.n):
        partial_in |= np.where(ax.ways[m | (1 << a)] != sizes[..., None], 1 << a, 0)
    partial_out = np.where(ax.ways[m] != sizes[..., None], every, 0)
    partial = np.where(in_unit[..., None], partial_in, partial_out)
    partial = np.where(pad[..., None], 0, partial)
    sharded = in_unit[..., None] | ((m != 0) & ~pad[..., None])
    return partial | np.where(sharded, every << ax.n, 0)
