"""Repeated layers, found by structure: signatures equal for the same dim of every repeated layer.

A 96-layer transformer has 96 copies of each weight dim. Deciding each copy separately makes the
search 96 times wider for nothing: the best plan shards every layer alike. So the analysis gives
each named dim (and each fine class, for the search's decision units) a **signature**, equal for
the same dim of repeated layers, and the search decides a whole signature at once.

Names cannot carry this. A hand-written model calls its parameters `blocks[3].attn.wq`, but Flax
linen calls them `Block_3` (or whatever `name=` says), NNX and Equinox `blocks.layers[3]` or
`blocks[3]`, a Haiku-style dict `layer3`; and the ops inside a library layer all report the same
source line (`flax/linen/linear.py`), so a query projection and a key projection look alike by
where they were written. The signature is therefore built from the program's **structure** only:
the op sequence, shapes, dtypes and roles around each value, never its name.

**Signatures by rounds of neighbourhood hashing.** Round 0 labels every op by its rule
(primitive, params, operand and result shapes), dtypes, source line and call path (digits dropped),
and every value by its shape, dtype and role, plus its producer's label, or for an input (a
parameter, optimizer state, data) the labels and operand positions of the ops reading it. Each
further round relabels each op from its operands' and results' labels (by position), and each
value from its producer and its uses (Weisfeiler-Lehman colour refinement on the def-use graph).
After r rounds a value's label describes everything within r ops of it: round 0 cannot tell `wq`
from `wk` when both feed the same library matmul, a later round can (one ends up the left operand
of `q @ k.T`, the other the right). A class (fine class or named dim) gets, per round, the sum of
hashed (value label, dim, sub-factor) of its value atoms: an order-free multiset hash.

**Balanced refinement.** Deeper rounds tell roles apart, but they also see past the layer: the
first layer reads the embedding and the last one feeds the final norm, so at some depth the first
and last copies of a dim stop looking like the middle ones. Classes are therefore grouped by their
round-0 signature, and each group is split by the next round's signature only when at least two
of the parts keep two members or more: a split into roles of repeated layers (`wq` of every layer
apart from `wk` of every layer, with a lone final norm beside them) is kept; a split peeling a
first or last layer off the others (one part of several members, the rest single) is not, and
neither is a split into singletons (layer 0 and layer 1 of a two-layer model), so the group stays
whole. That is what makes the number of decisions the same at 2 and 96 layers.

**Chains.** Classes of one group that meet in one value are not repeated layers side by side but
links of one chain (the hidden dims of stacked same-shape dense layers: `w2[F1, F2]`). Deciding
them at once could never shard them, and Megatron alternates column and row splits along such a
chain, so they are decided one by one (`apart_if_chained`).

Worked example: a 4-layer Flax LM, the param-side D of the q, k and v kernels (12 fine classes).
Round 0 groups all 12 (same shape, same library matmul). A later round splits them into q, k and
v, 4 each: kept. A deeper one peels layer 0 off each (its input is the embedding): rejected. The
search decides 3 units at any depth (`tests/test_layers.py` checks 2 against 4 layers).

`nn.scan`-style stacked layers need none of this: their weights are one array with a layer dim.
"""

from __future__ import annotations

import re
from collections import defaultdict
from operator import attrgetter

import numpy as np

from toast_core.analysis.arrays import unique
from toast_core.analysis.nda import NdaResult
from toast_core.analysis.value_facts import ValueFacts, value_facts
from toast_core.ir.program import Program

#: Neighbourhood rounds: enough to tell q, k and v projections apart through a library Dense
#: (matmul, bias add, reshape, attention matmul).
ROUNDS = 6

_DIGITS = re.compile(r"\d+")
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_ROLE = {"input": 1, "parameter": 2, "state": 3, "constant": 4, "literal": 5, "intermediate": 6}


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a cheap, well-spread 64-bit hash of each entry."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        return x ^ (x >> np.uint64(31))


_PAIR_K = np.uint64(0x9E3779B97F4A7C15)


def _pair(a, b) -> np.ndarray:
    """A hash of the ordered pair (a, b)."""
    with np.errstate(over="ignore"):
        return _mix(_mix(a) + _PAIR_K * _mix(np.asarray(b, dtype=np.uint64)))


def _segments(owner: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, owners in order, start of each owner's run): the grouping `_segment_sum` needs,
    computed once per owner array."""
    owner = np.asarray(owner)
    order = np.argsort(owner, kind="stable")
    sorted_owner = owner[order]
    starts = np.flatnonzero(np.r_[True, sorted_owner[1:] != sorted_owner[:-1]])
    return order, sorted_owner, starts


def _segment_sum(items: np.ndarray, owner, n: int) -> np.ndarray:
    """[..., n]: the wrap-around sum of `items` ([..., k]) per owner (0 where an owner has none);
    `owner` is an array or its `_segments`."""
    order, sorted_owner, starts = owner if isinstance(owner, tuple) else _segments(owner)
    out = np.zeros(items.shape[:-1] + (n,), dtype=np.uint64)
    if order.size == 0:
        return out
    with np.errstate(over="ignore"):
        sums = np.add.reduceat(items[..., order], starts, axis=-1)
    out[..., sorted_owner[starts]] = sums
    return out


def _labels(keys) -> np.ndarray:
    """Dense ids of hashable keys in first-seen order (deterministic across runs)."""
    ids: dict = {}
    return np.fromiter((ids.setdefault(k, len(ids)) for k in keys), dtype=np.uint64)


def value_signatures(
    program: Program, nda: NdaResult, facts: ValueFacts | None = None, rounds: int = ROUNDS
) -> np.ndarray:
    """[rounds + 1, values] uint64: each value's structural label after 0..rounds rounds.

    `nda` (the program's `NdaResult`) gives the def-use graph as arrays and numbers each op's
    rule (primitive, params, operand and result shapes), which saves hashing them again;
    `facts` (`value_facts(program)`, made if not given) each value's shape, dtype and role."""
    facts = value_facts(program) if facts is None else facts
    values, ops = program.values, program.ops
    n_values, n_ops = len(values), len(ops)
    use_op, use_val = nda.use_op, nda.use_value
    use_pos = nda.use_position.astype(np.uint64)
    n_results = np.diff(nda.result_start)
    res_op = np.repeat(np.arange(n_ops), n_results)
    res_pos = (np.arange(len(res_op)) - np.repeat(nda.result_start[:-1], n_results)).astype(
        np.uint64
    )
    res_val = nda.result_value
    by_use_op, by_res_op, by_use_val = _segments(use_op), _segments(res_op), _segments(use_val)
    value_label = facts.shape_label
    with np.errstate(over="ignore"):
        op_label = _mix(
            _pair(
                _pair(np.asarray(nda.op_rule, dtype=np.uint64), _labels(op.source for op in ops)),
                _call_path_labels(ops),
            )
            + _segment_sum(_pair(use_pos, value_label[use_val]), by_use_op, n_ops)
            + _segment_sum(
                _pair(res_pos + np.uint64(1 << 20), value_label[res_val]), by_res_op, n_ops
            )
        )
    role = (facts.role_table(_ROLE, 7) * 2 + facts.is_output).astype(np.uint64)
    sig = np.zeros((rounds + 1, n_values), dtype=np.uint64)
    base = _pair(value_label, role)
    produced = np.zeros(n_values, dtype=np.uint64)
    # Not the result index: the results of one region op (a scan's saved activations) differ by
    # position only, and round 0 keeps alike what the same op produces at the same shape.
    produced[res_val] = op_label[res_op]
    # An input (parameter, optimizer state, data) has no producer: it is known by its readers,
    # the ops and operand positions using it, which tell a stacked `wq` from a stacked `wk`.
    is_input = np.ones(n_values, dtype=bool)
    is_input[res_val] = False
    readers = _segment_sum(_pair(op_label[use_op], use_pos), by_use_val, n_values)
    produced[is_input] = readers[is_input]
    sig[0] = _pair(base, produced)
    # `_pair(a, b)` mixes both sides; the positions are the same every round, so mixed once.
    use_pos_mixed, res_pos_mixed = _mix(use_pos), _mix(res_pos + np.uint64(1 << 20))
    use_pos_scaled, res_pos_scaled = _PAIR_K * _mix(use_pos), _PAIR_K * _mix(res_pos)
    for r in range(1, rounds + 1):
        prev = sig[r - 1]
        with np.errstate(over="ignore"):
            op_sig = _mix(
                op_label
                + _segment_sum(
                    _mix(use_pos_mixed + _PAIR_K * _mix(prev[use_val])), by_use_op, n_ops
                )
                + _segment_sum(
                    _mix(res_pos_mixed + _PAIR_K * _mix(prev[res_val])), by_res_op, n_ops
                )
            )
            from_producer = np.zeros(n_values, dtype=np.uint64)
            from_producer[res_val] = _mix(_mix(op_sig[res_op]) + res_pos_scaled)
            from_uses = _segment_sum(
                _mix(_mix(op_sig[use_op]) + use_pos_scaled), by_use_val, n_values
            )
            sig[r] = _mix(prev + _pair(from_producer, from_uses))
    return sig


def _call_path_labels(ops) -> np.ndarray:
    """Op -> dense id of its call path with digits dropped (`blocks_3/attn` as `blocks_#/attn`),
    in first-seen order; each distinct path is rewritten once."""
    ids: dict = {}
    of_path: dict = {}
    out = []
    for path in map(attrgetter("call_path"), ops):
        label = of_path.get(path)
        if label is None:
            key = tuple(_DIGITS.sub("#", c) for c in path)
            label = of_path[path] = ids.setdefault(key, len(ids))
        out.append(label)
    return np.array(out, dtype=np.uint64)


def class_signatures(
    value_sig: np.ndarray, value: np.ndarray, dim: np.ndarray, sub: np.ndarray, cls, n: int
) -> np.ndarray:
    """[rounds + 1, n]: per class, the multiset hash of its value atoms (value, dim, sub-factor)
    given as parallel arrays with the class `cls` of each (classes without value atoms get 0)."""
    where = _mix(np.asarray(dim, dtype=np.uint64) * np.uint64(1 << 16) + sub.astype(np.uint64))
    return _segment_sum(_pair(value_sig[:, value], where), np.asarray(cls), n)


def balanced_refinement(sigs: np.ndarray) -> np.ndarray:
    """[n] uint64 from [rounds + 1, n]: round-0 groups, split by each next round's signature only
    where every part keeps at least two members (see the module essay)."""
    group = sigs[0].copy()
    for r in range(1, len(sigs)):
        key = _pair(group, sigs[r])
        _, of_group = np.unique(group, return_inverse=True)
        keys, of_key, key_count = np.unique(key, return_inverse=True, return_counts=True)
        key_group = np.zeros(len(keys), dtype=np.int64)
        key_group[of_key] = of_group
        n_groups = of_group.max(initial=-1) + 1
        repeated = np.bincount(key_group, weights=key_count >= 2, minlength=n_groups)
        split = repeated >= 2
        group = np.where(split[of_group], key, group)
    return group


def apart_if_chained(sig: np.ndarray, value: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """`sig` with every member of a chained group made unique: a group two of whose classes
    meet in one value (the hidden dims of a stack of same-shape dense layers: `w2[F1, F2]` holds
    the dims of layers 1 and 2). Deciding such a group at once could never shard it (the value
    would hold one mesh axis twice), and it is not how such stacks are sharded (Megatron
    alternates column and row splits), so its classes are decided one by one."""
    value, cls = np.asarray(value, dtype=np.int64), np.asarray(cls, dtype=np.int64)
    n_cls = int(cls.max(initial=-1)) + 1
    pairs = unique(value * n_cls + cls)  # (value, class) held, each once
    held_value, held_cls = pairs // max(n_cls, 1), pairs % max(n_cls, 1)
    groups, group = np.unique(sig[held_cls], return_inverse=True)
    # (value, group) pairs holding more than one class of the group.
    codes, count = np.unique(held_value * len(groups) + group, return_counts=True)
    if not (count > 1).any():
        return sig
    bad = groups[unique(codes[count > 1] % len(groups))]
    out = sig.copy()
    members = np.isin(sig, bad)
    out[members] = _pair(sig[members], np.flatnonzero(members).astype(np.uint64) + np.uint64(1))
    return out


def fine_signatures(ana) -> np.ndarray:
    """[fine classes] uint64 of an `Analysis`: equal for the same dim of repeated layers."""
    value, dim, sub, atom = ana.nda.value_slots.T
    sigs = class_signatures(
        ana.value_signatures,
        value,
        dim,
        sub,
        ana.fine_of_atom[atom],
        ana.n_fine,
    )
    return apart_if_chained(balanced_refinement(sigs), value, ana.fine_of_atom[atom])


def layer_groups(value_sig, value, dim, sub, cls, named, conflicts):
    """(dim groups, conflict groups): named dims with equal structural signatures, and conflicts
    of one kind over grouped named dims with equal option bytes. `value_sig` is the program's
    `value_signatures`; `value`, `dim`, `sub`, `cls` are its value atoms with the named dim of
    each."""
    sig = balanced_refinement(class_signatures(value_sig, value, dim, sub, cls, len(named)))
    sig = apart_if_chained(sig, value, cls)
    has_values = np.zeros(len(named), dtype=bool)
    has_values[cls] = True
    by_sig: dict[tuple, list[int]] = defaultdict(list)
    for nd in named:
        if has_values[nd.id]:
            by_sig[(nd.size, int(sig[nd.id]))].append(nd.id)
    dim_groups = tuple(tuple(g) for g in by_sig.values() if len(g) > 1)
    group_of = {d: i for i, g in enumerate(dim_groups) for d in g}
    dim_key = {
        nd.id: ("group", group_of[nd.id]) if nd.id in group_of else ("single", nd.id)
        for nd in named
    }
    by_conflict: dict[tuple, list[int]] = defaultdict(list)
    for c in conflicts:
        # An axis clash is characterised by its parameter dim; the data dims are shared by all.
        dims = c.named_dims[:1] if c.kind == "axis_clash" else c.named_dims
        key = (c.kind, tuple(dim_key[d] for d in dims), tuple(o.bytes for o in c.options))
        if c.kind == "axis_clash" and dim_key[dims[0]][0] == "single":
            key = ("single", c.id)
        by_conflict[key].append(c.id)
    conflict_groups = tuple(tuple(g) for g in by_conflict.values() if len(g) > 1)
    return dim_groups, conflict_groups
