"""Rematerialization groups: which forward activations a train step may recompute, and what.

A traced train step (`jax.grad` inside) is a forward part, a backward part (ops under
`transpose(` in their name stack) and an update part. A **residual** is a value the forward part
produces and the backward part reads; without remat it is live from its producer to its last
backward reader, which is what makes activations dominate memory.

**Blocks** are runs of forward ops in program order, cut where the forward starts reading the
parameters of a new layer: `params.blocks[3].attn.wq` belongs to layer 3 of group `blocks`
(Flax's `layers_3` likewise, when its parameter subtree matches `layers_0`'s); a parameter with
no layer index is a block of its own (`wte`, `Dense_0`, `ln_f`). Repeated layers form one
**remat group** and take one policy together, so a 96-layer model has one decision, not 96.

**Policies** (after `jax.checkpoint_policies`): `none` keeps every residual; `dots` keeps the
outputs of `dot_general` (like `dots_saveable`) and the values other blocks read; `full` keeps
only the values other blocks read (the block inputs); `dots_no_batch` keeps only the outputs of
matmuls without batch dims (like `dots_with_no_batch_dims_saveable`): the projections by the
weights, not attention's scores and weighted values ([B, H, S, S] and [B, H, S, Dh] per layer,
most of what `dots` keeps at long sequences), which are recomputed with the softmax. A residual not kept is recomputed in the
backward part, just before the block's first backward reader, from the kept ones: its producer
and every forward op of the block between it and kept values run again.

Worked example (GPT-2 block, `full`): the block reads `x` (kept: produced by the previous block)
and its weights; the LN, QKV matmul, attention, MLP are recomputed when the backward reaches the
block; only `x` per layer stays live across the step.

Blocks holding region ops (`scan`, `while`, `cond`) are left out: a scan stacks its own residuals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from toast_core.analysis import Analysis
from toast_core.strategy.layout import REGION_BOUNDARIES
from toast_core.strategy.memo import per_analysis

POLICIES = ("none", "dots", "full", "dots_no_batch")
#: Primitives whose outputs the `dots` policy keeps (like jax's `dots_saveable`).
SAVEABLE_DOTS = frozenset({"dot_general"})

_INDEXED = re.compile(r"^(.*?)\[(\d+)\]$")
_SUFFIXED = re.compile(r"^(.*?)_(\d+)$")


@dataclass(frozen=True)
class RematEffect:
    """What one policy does to one group: ops run in the backward (`recompute_ops`), those of
    them that the forward needs too and so run twice (`twice_ops`; the others only move), and
    residuals whose lifetime splits into [producer, fwd_end] and [bwd_start, last reader] (op
    indices; fwd_end = producer - 1 when the forward copy is no longer computed at all)."""

    recompute_ops: np.ndarray
    values: np.ndarray
    fwd_end: np.ndarray
    bwd_start: np.ndarray
    twice_ops: np.ndarray
    # Kept values the recomputation reads after their last reader: live on to `extend_to`.
    extend_values: np.ndarray
    extend_from: np.ndarray
    extend_to: np.ndarray

    @staticmethod
    def empty() -> RematEffect:
        e = np.zeros(0, dtype=np.int64)
        return RematEffect(e, e, e, e, e, e, e, e)


@dataclass(frozen=True)
class RematGroup:
    """Blocks deciding one policy together: `name` (`blocks`, `wte`), `layers` their keys."""

    name: str
    layers: tuple[str, ...]
    blocks: tuple[tuple[int, ...], ...]  # forward op indices of each block
    effects: tuple[RematEffect, ...]  # one per POLICIES entry
    residual_bytes: float  # bytes of the group's residuals (the memory at stake)


@dataclass(frozen=True)
class RematSpace:
    """The remat groups of an analysis, and where its forward and backward parts are."""

    groups: tuple[RematGroup, ...]
    first_backward: int

    def index(self, name: str) -> int | None:
        for i, g in enumerate(self.groups):
            if g.name == name:
                return i
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups)


def policy_index(policy: str) -> int | None:
    return POLICIES.index(policy) if policy in POLICIES else None


def is_backward(op) -> bool:
    return "transpose(" in op.name_stack


def _strip_params(path: str) -> list[str]:
    parts = path.split(".")
    while len(parts) > 1 and parts[0] in ("params", "param"):
        parts = parts[1:]
    return parts


def layer_of(name: str) -> tuple[str, str, tuple[str, ...]]:
    """(group, layer key, path inside the layer) of a parameter's pytree path:
    `params.blocks[3].attn.wq` -> (`blocks`, `blocks[3]`, (`attn`, `wq`))."""
    parts = _strip_params(name)
    head, rest = parts[0], tuple(parts[1:])
    m = _INDEXED.match(head) or _SUFFIXED.match(head)
    if m:
        return m.group(1), head, rest
    return head, head, rest


def _group_layers(prog) -> dict[int, tuple[str, str]]:
    """Parameter value id -> (group, layer key). Suffixed layers (`Dense_0`, `Dense_1`) are one
    group only when their parameter subtrees have the same paths and shapes."""
    raw = {}
    for vid in prog.inputs:
        v = prog.values[vid]
        if v.role != "parameter":
            continue
        raw[vid] = layer_of(v.name)
    shapes: dict[tuple[str, str], set] = {}
    for vid, (grp, key, rest) in raw.items():
        shapes.setdefault((grp, key), set()).add((rest, prog.values[vid].shape))
    # The distinct layer signatures of each group (counted once per group, not per parameter).
    sigs: dict[str, set] = {}
    for (g, _), s in shapes.items():
        sigs.setdefault(g, set()).add(frozenset(s))
    out = {}
    for vid, (grp, key, _) in raw.items():
        if grp == key:
            out[vid] = (key, key)
            continue
        indexed = _INDEXED.match(key) is not None
        out[vid] = (grp, key) if indexed or len(sigs[grp]) == 1 else (key, key)
    return out


@per_analysis(max_keys=2)
def remat_space(ana: Analysis) -> RematSpace:
    """The remat groups of `ana` (memoized; empty for a program without a backward part)."""
    prog = ana.program
    # Per op, whether it is in the backward part (asked a few hundred thousand times below).
    backward = [is_backward(op) for op in prog.ops]
    if True not in backward:
        return RematSpace((), len(prog.ops))
    first_back = backward.index(True)
    param_layer = _group_layers(prog)
    # Cut the forward into blocks where a new layer's parameters are first read.
    block_of_op = np.full(len(prog.ops), -1, dtype=np.int64)
    keys: list[tuple[str, str]] = []
    seen: dict[tuple[str, str], int] = {}
    current = -1
    for op in prog.ops[:first_back]:
        if backward[op.index]:
            continue
        for vid in op.operands:
            lay = param_layer.get(vid)
            if lay is not None and lay not in seen:
                seen[lay] = len(keys)
                keys.append(lay)
                current = seen[lay]
                break
        block_of_op[op.index] = max(current, 0)
    if not keys:
        return RematSpace((), first_back)
    _move_boundaries(prog, block_of_op, param_layer, first_back, backward)
    return RematSpace(_make_groups(prog, block_of_op, keys, first_back, backward), first_back)


def _move_boundaries(prog, block_of_op, param_layer, first_back, backward) -> None:
    """Moves each block boundary to where the fewest activation bytes cross it, between the
    last op reading the previous block's parameters and the first reading the next one's: a
    GPT block then starts at its input `x`, not at its layer norm's scale, so `full` keeps one
    [B, S, D] value per layer instead of two."""
    uses = prog.uses()
    last_reader = {}
    for v in prog.values:
        fwd = [o for o, _ in uses[v.id] if o < first_back and not backward[o]]
        if fwd:
            last_reader[v.id] = max(fwd)
    starts = [i for i in range(1, first_back) if block_of_op[i] != block_of_op[i - 1]]
    for b in starts:
        prev = int(block_of_op[b - 1])
        a = b - 1
        while (
            a > 0
            and block_of_op[a] == prev
            and not any(param_layer.get(v) is not None for v in prog.ops[a].operands)
        ):
            a -= 1
        if b - a <= 1:
            continue
        # Bytes crossing a cut before op p, for p in (a, b]: values made in [a, p) read at >= p.
        best_p, best = b, None
        for p in range(a + 1, b + 1):
            crossing = sum(
                prog.values[v].nbytes
                for o in range(a, p)
                for v in prog.ops[o].results
                if last_reader.get(v, -1) >= p
            )
            if best is None or crossing < best:
                best_p, best = p, crossing
        block_of_op[best_p:b] = block_of_op[b]


def _make_groups(prog, block_of_op, keys, first_back, backward) -> tuple[RematGroup, ...]:
    producers, uses = prog.producers(), prog.uses()
    n_blocks = len(keys)
    ops_of_block: list[list[int]] = [[] for _ in range(n_blocks)]
    for i in np.flatnonzero(block_of_op >= 0).tolist():
        ops_of_block[int(block_of_op[i])].append(i)
    has_region = [any(prog.ops[i].primitive in REGION_BOUNDARIES for i in b) for b in ops_of_block]

    def block_of_value(vid):
        p = producers[vid]
        return int(block_of_op[p]) if p is not None and p < first_back else -1

    # Residuals of each block; which are kept regardless of policy (read by another block's
    # forward, or program outputs).
    residuals: list[list[int]] = [[] for _ in range(n_blocks)]
    kept_always: set[int] = set()
    for v in prog.values:
        b = block_of_value(v.id)
        if b < 0:
            continue
        readers = [o for o, _ in uses[v.id]]
        if v.is_output or any(
            o < first_back and not backward[o] and block_of_op[o] != b for o in readers
        ):
            kept_always.add(v.id)
        if any(backward[o] for o in readers):
            residuals[b].append(v.id)

    def effect(b: int, policy: str) -> RematEffect:
        if policy == "none" or has_region[b]:
            return RematEffect.empty()
        kept = set(kept_always)
        if policy in ("dots", "dots_no_batch"):
            kept |= {
                r
                for i in ops_of_block[b]
                if prog.ops[i].primitive in SAVEABLE_DOTS
                and (policy == "dots" or not _has_batch_dims(prog.ops[i]))
                for r in prog.ops[i].results
            }
        dropped = [v for v in residuals[b] if v not in kept]
        if not dropped:
            return RematEffect.empty()
        # Forward ops of the block between the dropped residuals and kept values.
        recompute, stack = set(), [producers[v] for v in dropped]
        while stack:
            o = stack.pop()
            if o in recompute:
                continue
            recompute.add(o)
            for vid in prog.ops[o].operands:
                p = producers[vid]
                if p is None or vid in kept or block_of_value(vid) != b:
                    continue
                stack.append(p)
        twice = _needed_in_forward(prog, recompute, kept, first_back, backward)
        first_reader = min(o for v in dropped for o, _ in uses[v] if backward[o])
        fwd_end = [
            max([producers[v]] + [o for o, _ in uses[v] if not backward[o]])
            if producers[v] in twice
            else producers[v] - 1
            for v in dropped
        ]
        ext = []
        for v in sorted({v for o in recompute for v in prog.ops[o].operands}):
            p = producers[v]
            if p is None or producers[v] in recompute:
                continue  # inputs are live all step; recomputed values are new copies
            last = max(o for o, _ in uses[v])
            if last < first_reader:
                ext.append((v, last + 1, first_reader + 1))
        ext_arr = np.array(ext, dtype=np.int64).reshape(-1, 3)
        return RematEffect(
            np.array(sorted(recompute), dtype=np.int64),
            np.array(dropped, dtype=np.int64),
            np.array(fwd_end, dtype=np.int64),
            np.full(len(dropped), first_reader, dtype=np.int64),
            np.array(sorted(twice), dtype=np.int64),
            ext_arr[:, 0],
            ext_arr[:, 1],
            ext_arr[:, 2],
        )

    by_group: dict[str, list[int]] = {}
    for b, (grp, _) in enumerate(keys):
        by_group.setdefault(grp, []).append(b)
    groups = []
    for grp, blocks in by_group.items():
        effects = []
        for policy in POLICIES:
            parts = [effect(b, policy) for b in blocks]
            effects.append(
                _merge_extensions(
                    RematEffect(*(np.concatenate([getattr(e, f) for e in parts]) for f in _FIELDS))
                )
            )
        if not len(effects[-1].values):
            continue  # nothing to recompute: no decision
        res_bytes = float(sum(prog.values[v].nbytes for b in blocks for v in residuals[b]))
        groups.append(
            RematGroup(
                grp,
                tuple(keys[b][1] for b in blocks),
                tuple(tuple(ops_of_block[b]) for b in blocks),
                tuple(effects),
                res_bytes,
            )
        )
    groups.sort(key=lambda g: (-g.residual_bytes, g.name))
    return tuple(groups)


_FIELDS = (
    "recompute_ops",
    "values",
    "fwd_end",
    "bwd_start",
    "twice_ops",
    "extend_values",
    "extend_from",
    "extend_to",
)


def _has_batch_dims(op) -> bool:
    """Whether a dot_general has batch dims (attention's per-head matmuls do; projections by a
    weight do not)."""
    _, (lhs_batch, _) = op.param("dimension_numbers")
    return bool(lhs_batch)


def _needed_in_forward(prog, recompute: set, kept: set, first_back: int, backward) -> set:
    """The recomputed ops whose forward copy is still needed: a result kept, or read by a
    forward op that is itself needed (every op not recomputed is). The others compute only
    residuals; once those are recomputed, XLA removes the forward copy as dead code."""
    uses = prog.uses()
    needed: set[int] = set()
    for o in sorted(recompute, reverse=True):
        for v in prog.ops[o].results:
            if v in kept or prog.values[v].is_output:
                needed.add(o)
                break
            if any(
                r < first_back and not backward[r] and (r not in recompute or r in needed)
                for r, _ in uses[v]
            ):
                needed.add(o)
                break
    return needed


def remat_effect(space: RematSpace, remat) -> RematEffect:
    """The combined effect of (group index, policy index) pairs."""
    parts = [space.groups[g].effects[p] for g, p in remat if p]
    if not parts:
        return RematEffect.empty()
    if len(parts) == 1:
        return parts[0]
    e = RematEffect(*(np.concatenate([getattr(e, f) for e in parts]) for f in _FIELDS))
    return _merge_extensions(e)


def _merge_extensions(e: RematEffect) -> RematEffect:
    """One extension per value (the longest) when several groups' recomputations read it."""
    if len(np.unique(e.extend_values)) == len(e.extend_values):
        return e
    order = np.lexsort((-e.extend_to, e.extend_values))
    vals = e.extend_values[order]
    first = np.ones(len(vals), dtype=bool)
    first[1:] = vals[1:] != vals[:-1]
    keep = order[first]
    return RematEffect(
        e.recompute_ops,
        e.values,
        e.fwd_end,
        e.bwd_start,
        e.twice_ops,
        e.extend_values[keep],
        e.extend_from[keep],
        e.extend_to[keep],
    )
