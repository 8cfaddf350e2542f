"""Named Dimension Analysis: DESIGN §3's acceptance examples and property tests.

Acceptance: the 2-layer MLP has 4 named dims and no conflicts; `x @ x.T` one self-conflict;
self-attention one self-conflict on the sequence per block, resolvable on the K side or the Q side;
a train step links each weight to its gradient, optimizer state and update, and offers FSDP as an
axis-clash resolution. Properties (hypothesis, on random small programs): union-find ignores edge
order, the analysis ignores the order of independent ops and the names of inputs, and reshape
refinement keeps every named dim one size and every dim the product of its atoms.
"""

from __future__ import annotations

import functools
from collections import Counter
from math import prod

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import toast_core as tc
from toast_core.analysis.nda import components


def sds(*shape) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def analyzed(fn, *args, param_argnums=None) -> tuple[tc.Program, tc.Analysis]:
    prog = tc.trace(fn, *args, param_argnums=param_argnums)
    return prog, tc.analyze(prog)


@functools.cache
def zoo(name: str, train: bool) -> tuple[tc.Program, tc.Analysis]:
    from demos import MODEL_ZOO

    w = MODEL_ZOO[name](size="tiny", train=train)
    return analyzed(w.fn, *w.args, param_argnums=w.param_argnums)


def value_id(prog: tc.Program, name: str) -> int:
    (vid,) = [v.id for v in prog.values if v.name == name or v.output_name == name]
    return vid


# --- the 2-layer MLP ------------------------------------------------------------------------------


def test_mlp_forward_has_four_named_dims_and_no_conflicts():
    prog, ana = zoo("mlp", False)
    assert len(ana.named_dims) == 4
    assert ana.conflicts == ()
    x, w1, w2 = (value_id(prog, n) for n in ("x", "params.w1", "params.w2"))
    h = prog.ops[0].results[0]  # x @ w1
    y = prog.outputs[0]
    (batch,), (d,) = ana.value_named_dims(x)
    assert ana.value_named_dims(w1) == ((d,), ana.value_named_dims(h)[1])
    (f,) = ana.value_named_dims(h)[1]
    assert ana.value_named_dims(h)[0] == (batch,)
    assert ana.value_named_dims(w2) == ((f,), ana.value_named_dims(y)[1])
    (o,) = ana.value_named_dims(y)[1]
    assert ana.value_named_dims(y)[0] == (batch,)
    assert len({batch, d, f, o}) == 4
    sizes = {ana.named_dims[c].size for c in (batch, d, f, o)}
    assert sizes == {16, 64, 128, 32}
    # D and F are contracted somewhere (reductions); the batch and output dims never are.
    assert ana.named_dims[d].has_reduction and ana.named_dims[f].has_reduction
    assert not ana.named_dims[batch].has_reduction and not ana.named_dims[o].has_reduction
    assert ana.named_dims[f].is_persistent and not ana.named_dims[batch].is_persistent
    assert ana.named_dims[batch].is_input


def test_x_times_x_transposed_has_one_self_conflict():
    prog, ana = analyzed(lambda x: x @ x.T, sds(8, 16))
    assert [c.kind for c in ana.conflicts] == ["self"]
    (conflict,) = ana.conflicts
    (c,) = conflict.named_dims
    y = prog.outputs[0]
    assert ana.value_named_dims(y) == ((c,), (c,))  # y holds x's dim 0 twice
    assert ana.value_named_dims(prog.inputs[0])[0] == (c,)
    assert conflict.sites[0].value == y
    # One side or the other: reshard x before the transpose or the matmul, or x.T before it.
    x, xt = prog.inputs[0], prog.ops[0].results[0]
    cut_uses = set()
    for option in conflict.options:
        assert len(option.cuts) == 1 and option.bytes == 8 * 16 * 4
        assert option.description.startswith("reshard")
        (e,) = option.cuts
        cut_uses.add((ana.medges[e].value, prog.ops[ana.medges[e].op].primitive))
    # At least one cut on each side: the matmul's direct operand, and the transposed path.
    assert cut_uses <= {(x, "transpose"), (x, "dot_general"), (xt, "dot_general")}
    assert (x, "dot_general") in cut_uses
    assert cut_uses & {(x, "transpose"), (xt, "dot_general")}


def test_an_mlp_with_no_sharing_has_no_self_conflict():
    _, ana = analyzed(lambda x, y: x @ y.T, sds(8, 16), sds(4, 16), param_argnums=())
    assert ana.conflicts == ()


# --- self-attention -------------------------------------------------------------------------------


def attention_ancestry(prog: tc.Program, n_blocks: int) -> list[frozenset]:
    """For each value, the (block, weight) pairs among wq/wk/wv that it depends on."""
    tags = {
        value_id(prog, f"params.blocks[{b}].attn.{w}"): (b, w)
        for b in range(n_blocks)
        for w in ("wq", "wk", "wv")
    }
    anc = [frozenset([tags[v.id]]) if v.id in tags else frozenset() for v in prog.values]
    for op in prog.ops:
        merged = frozenset().union(*(anc[i] for i in op.operands))
        for r in op.results:
            anc[r] = merged
    return anc


def option_sides(ana: tc.Analysis, anc: list[frozenset], block: int, option) -> set[str]:
    """Which of q, k, v a cut value comes from alone (values mixing them are neither side)."""
    sides = set()
    for e in option.cuts:
        weights = {w for b, w in anc[ana.medges[e].value] if b == block}
        if len(weights) == 1:
            sides |= weights
    return sides


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_attention_has_one_sequence_self_conflict_per_block_with_k_and_q_side_options(train):
    prog, ana = zoo("gpt", train)
    selfs = [c for c in ana.conflicts if c.kind == "self"]
    assert len(selfs) == 2  # GPT tiny has 2 layers
    tokens = value_id(prog, "tokens" if not train else "batch.tokens")
    (seq,) = ana.value_named_dims(tokens)[1]
    assert ana.named_dims[seq].size == 32
    anc = attention_ancestry(prog, 2)
    blocks = []
    for conflict in selfs:
        assert conflict.named_dims == (seq,)
        scores = conflict.sites[0].value
        assert prog.values[scores].shape == (8, 4, 32, 32)  # [B, H, S, S]
        block = max(b for b, _ in anc[scores])
        blocks.append(block)
        sides = [option_sides(ana, anc, block, o) for o in conflict.options]
        assert {"wk", "wv"} in sides, f"no option gathers K and V: {sides}"
        assert {"wq"} in sides, f"no option reshards the Q side: {sides}"
        for option in conflict.options:
            _assert_option_separates(ana, conflict, option)
    assert sorted(blocks) == [0, 1]


def _assert_option_separates(ana: tc.Analysis, conflict, option) -> None:
    """After the cuts, the clashing value's two atoms of the named dim are in different parts."""
    nda = ana.nda
    edges = np.array(
        [(e.value_atom, e.use_atom) for e in nda.medges if e.id not in option.cuts], dtype=np.int64
    ).reshape(-1, 2)
    labels = components(len(nda.atom_size), edges)
    (c,) = conflict.named_dims
    site = conflict.sites[0].value
    atoms = [a for dim in nda.value_atoms[site] for a in dim if ana.atom_dim[a] == c]
    assert len(atoms) == 2 and labels[atoms[0]] != labels[atoms[1]]


# --- train steps ----------------------------------------------------------------------------------


def gradient_of(prog: tc.Program, mu_out: int, mu_in: int) -> int:
    """The gradient read by Adam's `mu' = b1 * mu + (1 - b1) * g` (the add's other product)."""
    producers = prog.producers()
    add = prog.ops[producers[mu_out]]
    assert add.primitive == "add"
    for term in add.operands:
        mul = prog.ops[producers[term]]
        if mu_in not in mul.operands:
            (grad,) = [i for i in mul.operands if prog.values[i].shape == prog.values[mu_in].shape]
            return grad
    raise AssertionError("no gradient term in the mu update")


@pytest.mark.parametrize(
    "weight", ["blocks[0].mlp.w_fc", "blocks[1].attn.wq", "wte", "blocks[0].ln1.scale"]
)
def test_a_weight_shares_named_dims_with_its_gradient_adam_state_and_update(weight):
    prog, ana = zoo("gpt", True)
    w = value_id(prog, f"params.{weight}")
    mu_in, nu_in = (
        value_id(prog, f"opt_state.mu.{weight}"),
        value_id(prog, f"opt_state.nu.{weight}"),
    )
    new_w = value_id(prog, f"out[0].{weight}")
    mu_out, nu_out = value_id(prog, f"out[1].mu.{weight}"), value_id(prog, f"out[1].nu.{weight}")
    grad = gradient_of(prog, mu_out, mu_in)
    assert prog.values[grad].role == "intermediate"
    dims = ana.value_named_dims(w)
    for other in (mu_in, nu_in, new_w, mu_out, nu_out, grad):
        assert ana.value_named_dims(other) == dims, prog.values[other].name
    assert all(ana.named_dims[c].is_persistent for dim in dims for c in dim)


def test_decision_space_is_much_smaller_than_the_tensor_dims():
    ratios = {}
    for name in ("mlp", "gpt"):
        _, ana = zoo(name, True)
        s = ana.summary()
        ratios[name] = s["tensor_dims"] / s["named_dims"]
        print(f"{name} train step: {s['tensor_dims']} tensor dims -> {s['named_dims']} named dims"
              f" ({ratios[name]:.0f}x), {s['conflicts']} conflicts")  # fmt: skip
    assert ratios["mlp"] >= 10
    assert ratios["gpt"] >= 100  # measured: 2111 tensor dims -> 12 named dims


def test_train_steps_have_axis_clashes_for_parameter_dims_and_the_forward_mlp_none():
    _, forward = zoo("mlp", False)
    assert not [c for c in forward.conflicts if c.kind == "axis_clash"]
    for name in ("mlp", "gpt"):
        prog, ana = zoo(name, True)
        clashes = [c for c in ana.conflicts if c.kind == "axis_clash"]
        assert clashes, name
        for c in clashes:
            param_dim, *data_dims = c.named_dims
            assert ana.named_dims[param_dim].is_persistent
            assert all(ana.named_dims[d].is_input for d in data_dims)
            assert (min(param_dim, data_dims[0]), max(param_dim, data_dims[0])) in ana.cooccurrence
            assert c.options


def test_fsdp_is_an_axis_clash_option_of_the_mlp_train_step():
    """Cutting w1 at its uses and the gradient at the update keeps w1, its new value and nothing
    holding the batch in one named dim: w1's dims may then share the batch's mesh axis."""
    prog, ana = zoo("mlp", True)
    w1, new_w1, x = (value_id(prog, n) for n in ("params.w1", "out[0].w1", "batch.x"))
    (batch,) = ana.value_named_dims(x)[0]
    nda = ana.nda
    (hidden,) = ana.value_named_dims(w1)[1]
    (clash,) = [c for c in ana.conflicts if c.kind == "axis_clash" and c.named_dims[0] == hidden]
    assert batch in clash.named_dims
    for option in clash.options:
        cut_uses = {
            (ana.medges[e].value, prog.ops[ana.medges[e].op].primitive) for e in option.cuts
        }
        assert (w1, "dot_general") in cut_uses  # all-gather w1 before the forward matmul
        edges = np.array(
            [(e.value_atom, e.use_atom) for e in nda.medges if e.id not in option.cuts],
            dtype=np.int64,
        ).reshape(-1, 2)
        labels = components(len(nda.atom_size), edges)
        part = labels[nda.value_atoms[w1][1][0]]
        assert labels[nda.value_atoms[new_w1][1][0]] == part
        for v in prog.values:
            atoms = [a for dim in nda.value_atoms[v.id] for a in dim]
            if any(labels[a] == part for a in atoms):
                assert batch not in {int(ana.atom_dim[a]) for a in atoms}, v.name


# --- regions --------------------------------------------------------------------------------------


def test_scan_links_carries_and_slices_and_keeps_stacked_dims_apart():
    def scan_program(c, xs):
        return jax.lax.scan(lambda carry, x: (carry * x, jnp.sin(x)), c, xs)

    prog, ana = analyzed(scan_program, sds(3), sds(5, 3), param_argnums=())
    c, xs = prog.inputs
    final, ys = prog.outputs
    (carry,) = ana.value_named_dims(c)[0]
    # The carry, the per-iteration slice x = xs[i] and y = sin(x) all share one named dim.
    assert ana.value_named_dims(final) == ((carry,),)
    assert ana.value_named_dims(xs)[1] == (carry,) and ana.value_named_dims(ys)[1] == (carry,)
    # The stacked dims of xs and ys are their own named dims (iterations are sequential).
    (stacked_in,), (stacked_out,) = ana.value_named_dims(xs)[0], ana.value_named_dims(ys)[0]
    assert len({carry, stacked_in, stacked_out}) == 3
    assert ana.named_dims[stacked_in].replication_ops == (0,)  # scan_start needs it whole
    assert len(ana.named_dims) == 3 and ana.conflicts == ()


def test_gpt_scan_has_one_attention_self_conflict_for_its_one_body():
    prog, ana = zoo("gpt-scan", False)
    selfs = [c for c in ana.conflicts if c.kind == "self"]
    assert len(selfs) == 1
    (seq,) = ana.value_named_dims(value_id(prog, "tokens"))[1]
    assert selfs[0].named_dims == (seq,)
    assert any(op.primitive == "scan_start" for op in prog.ops)


# --- random programs ------------------------------------------------------------------------------

SIZES = (2, 3, 4, 6)


def factorizations(n: int, draw) -> tuple[int, ...]:
    """A random ordered factorization of n into factors > 1 (prime factors shuffled, grouped)."""
    primes, m, p = [], n, 2
    while m > 1:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    order = draw(st.permutations(primes))
    cuts = draw(st.sets(st.integers(1, max(len(order) - 1, 1)), max_size=3))
    groups, start = [], 0
    for c in sorted(cuts) + [len(order)]:
        if c > start:
            groups.append(prod(order[start:c]))
            start = c
    return tuple(groups)


# Step kinds, reshapes weighted up. A "roundtrip" adds x to x reshaped there and back, so one
# value is read whole and split by another factorization (refinement, or a reshape conflict).
KINDS = ["tanh", "scale", "add_self", "transpose", "reshape", "reshape", "roundtrip", "roundtrip",
         "dot", "sum"]  # fmt: skip


@st.composite
def chains(draw, max_steps: int = 6):
    """A chain of ops on one input: (input shape, steps). Steps: ("tanh",), ("scale",),
    ("add_self",), ("transpose", perm), ("reshape", shape), ("roundtrip", shape),
    ("dot", n_out), ("sum", axis)."""
    shape = tuple(draw(st.lists(st.sampled_from(SIZES), min_size=2, max_size=3)))
    steps, cur = [], shape
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(KINDS))
        if kind == "transpose" and len(cur) > 1:
            perm = tuple(draw(st.permutations(range(len(cur)))))
            steps.append((kind, perm))
            cur = tuple(cur[p] for p in perm)
        elif kind == "reshape":
            new = factorizations(prod(cur), draw)
            steps.append((kind, new))
            cur = new
        elif kind == "roundtrip":
            steps.append((kind, factorizations(prod(cur), draw)))
        elif kind == "dot":
            n_out = draw(st.sampled_from(SIZES))
            steps.append((kind, n_out))
            cur = cur[:-1] + (n_out,)
        elif kind == "sum" and len(cur) > 1:
            axis = draw(st.integers(0, len(cur) - 1))
            steps.append((kind, axis))
            cur = cur[:axis] + cur[axis + 1 :]
        elif kind in ("tanh", "scale", "add_self"):
            steps.append((kind,))
    return shape, tuple(steps)


def weight_shapes(shape, steps) -> list[tuple[int, int]]:
    out, cur = [], shape
    for step in steps:
        if step[0] == "dot":
            out.append((cur[-1], step[1]))
        cur = _next_shape(cur, step)
    return out


def _next_shape(cur, step):
    kind = step[0]
    if kind == "transpose":
        return tuple(cur[p] for p in step[1])
    if kind == "reshape":
        return step[1]
    if kind == "dot":
        return cur[:-1] + (step[1],)
    if kind == "sum":
        return cur[: step[1]] + cur[step[1] + 1 :]
    return cur


def apply_step(x, step, weights):
    kind = step[0]
    if kind == "tanh":
        return jnp.tanh(x)
    if kind == "scale":
        return x * 2.0
    if kind == "add_self":
        return x + x
    if kind == "transpose":
        return jax.lax.transpose(x, step[1])
    if kind == "reshape":
        return jax.lax.reshape(x, step[1])
    if kind == "roundtrip":
        return x + jax.lax.reshape(jax.lax.reshape(x, step[1]), x.shape)
    if kind == "dot":
        return x @ weights.pop(0)
    return x.sum(step[1])


def interleaved(chain_list, order):
    """fn(params, *xs) running several chains, their steps interleaved in `order` (chain ids)."""

    def fn(params, *xs):
        xs = list(xs)
        weights = [list(ws) for ws in params]
        pos = [0] * len(chain_list)
        for c in order:
            xs[c] = apply_step(xs[c], chain_list[c][1][pos[c]], weights[c])
            pos[c] += 1
        return tuple(xs)

    args = (
        [[sds(*s) for s in weight_shapes(*chain)] for chain in chain_list],
        *[sds(*chain[0]) for chain in chain_list],
    )
    return fn, args


def partition(prog: tc.Program, ana: tc.Analysis, rename=lambda name: name) -> Counter:
    """Named dims as a multiset of member sets, values keyed independently of their ids: inputs
    by (renamed) name, other values by the inputs they depend on and their order among those."""
    deps: list[frozenset] = [frozenset()] * len(prog.values)
    for vid in prog.inputs:
        deps[vid] = frozenset([rename(prog.values[vid].name)])
    for op in prog.ops:
        merged = frozenset().union(*(deps[i] for i in op.operands))
        for r in op.results:
            deps[r] = merged
    seen: Counter = Counter()
    key = {}
    for v in prog.values:
        if v.id in prog.inputs:
            key[v.id] = deps[v.id]
        else:
            key[v.id] = (deps[v.id], seen[deps[v.id]])
            seen[deps[v.id]] += 1
    return Counter(frozenset((key[v], d, s) for v, d, s in nd.members) for nd in ana.named_dims)


def assert_refinement_invariants(prog: tc.Program, ana: tc.Analysis) -> None:
    nda = ana.nda
    for nd in ana.named_dims:
        assert {int(nda.atom_size[a]) for a in nd.atoms} == {nd.size}
    for v in prog.values:
        for d, atoms in enumerate(nda.value_atoms[v.id]):
            assert prod(int(nda.atom_size[a]) for a in atoms) == v.shape[d], (v.name, d)
    failed = {(op, pos, d) for _, op, pos, d in nda.reshape_sites}
    for (op, pos), dims in nda.use_atoms.items():
        shape = prog.values[prog.ops[op].operands[pos]].shape
        for d, atoms in enumerate(dims):
            assert prod(int(nda.atom_size[a]) for a in atoms) == shape[d] or (op, pos, d) in failed


@given(st.integers(2, 40).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=60),
    st.randoms(use_true_random=False),
)))  # fmt: skip
def test_union_find_ignores_edge_order_and_direction(case):
    n, edges, rng = case
    base = components(n, np.array(edges, dtype=np.int64).reshape(-1, 2))
    shuffled = [(b, a) if rng.random() < 0.5 else (a, b) for a, b in edges]
    rng.shuffle(shuffled)
    again = components(n, np.array(shuffled, dtype=np.int64).reshape(-1, 2))
    assert base.tolist() == again.tolist()
    # Against a plain reference: nodes are together iff connected.
    reach = {i: {i} for i in range(n)}
    for a, b in edges:
        merged = reach[a] | reach[b]
        for node in merged:
            reach[node] = merged
    for i in range(n):
        assert {j for j in range(n) if base[j] == base[i]} == reach[i]


def test_union_find_ignores_the_order_of_real_m_edges():
    _, ana = zoo("gpt", True)
    edges = np.array([(e.value_atom, e.use_atom) for e in ana.medges], dtype=np.int64)
    base = components(len(ana.nda.atom_size), edges)
    rng = np.random.default_rng(0)
    for _ in range(3):
        perm = edges[rng.permutation(len(edges))]
        assert np.array_equal(components(len(ana.nda.atom_size), perm[:, ::-1]), base)


@given(chains(), chains(), st.randoms(use_true_random=False))
def test_analysis_ignores_the_order_of_independent_ops(a, b, rng):
    order = [0] * len(a[1]) + [1] * len(b[1])
    shuffled = list(order)
    rng.shuffle(shuffled)
    results = []
    for o in (order, shuffled):
        fn, args = interleaved([a, b], o)
        prog, ana = analyzed(fn, *args)
        results.append(partition(prog, ana))
    assert results[0] == results[1]


@given(chains())
def test_analysis_ignores_argument_and_pytree_key_names(chain):
    shape, steps = chain
    n_w = len(weight_shapes(shape, steps))

    def body(weights, x):
        ws = list(weights)
        for step in steps:
            x = apply_step(x, step, ws)
        return x

    def named(params, x):
        return body([params[f"w{i}"] for i in range(n_w)], x)

    # Other argument names, and keys whose sorted order reverses the leaves.
    def renamed(weights_by_key, data):
        return body([weights_by_key[f"z{n_w - i:02d}"] for i in range(n_w)], data)

    ws = weight_shapes(shape, steps)
    p1, a1 = analyzed(named, {f"w{i}": sds(*s) for i, s in enumerate(ws)}, sds(*shape))
    p2, a2 = analyzed(renamed, {f"z{n_w - i:02d}": sds(*s) for i, s in enumerate(ws)}, sds(*shape))
    back = {f"weights_by_key.z{n_w - i:02d}": f"params.w{i}" for i in range(n_w)}
    back["data"] = "x"
    assert partition(p1, a1) == partition(p2, a2, rename=lambda n: back.get(n, n))
    assert len(a1.conflicts) == len(a2.conflicts)


@given(chains(max_steps=8))
def test_reshape_refinement_keeps_sizes_consistent(chain):
    fn, args = interleaved([chain], [0] * len(chain[1]))
    prog, ana = analyzed(fn, *args)
    assert_refinement_invariants(prog, ana)


def test_refinement_splits_a_dim_used_two_ways():
    """x[8, 6] is read whole by one op and as [2, 4, 6] by a reshape: x.0 splits into (2, 4)
    everywhere it flows, and the coarse use gets both sub-factors."""

    def fn(x):
        return jnp.tanh(x), x.reshape(2, 4, 6).sum(1)

    prog, ana = analyzed(fn, sds(8, 6))
    x = prog.inputs[0]
    assert [len(atoms) for atoms in ana.nda.value_atoms[x]] == [2, 1]
    tanh_out = prog.outputs[0]
    assert ana.value_named_dims(tanh_out) == ana.value_named_dims(x)
    assert_refinement_invariants(prog, ana)
    assert not [c for c in ana.conflicts if c.kind == "reshape"]


def test_incompatible_reshapes_become_a_reshape_conflict():
    """x[4, 6] -> [6, 4] cannot be refined: that use is resharded, recorded as a conflict."""

    def fn(x, y):
        return x.reshape(2, 3, 4).reshape(6, 4) + y

    prog, ana = analyzed(fn, sds(6, 4), sds(6, 4), param_argnums=())
    assert_refinement_invariants(prog, ana)

    def clash(x):
        a = x.reshape(4, 6)  # splits 24 as 4 x 6
        return a, jnp.tanh(x).reshape(6, 4)  # and as 6 x 4: no common ordered refinement

    prog, ana = analyzed(clash, sds(24))
    kinds = Counter(c.kind for c in ana.conflicts)
    assert kinds["reshape"] >= 1
    (site,) = {s.value for c in ana.conflicts if c.kind == "reshape" for s in c.sites}
    assert prog.values[site].shape == (24,)
    assert_refinement_invariants(prog, ana)


@pytest.mark.parametrize(
    "scale",
    [lambda p: p["a"] * p["b"], lambda p: jnp.where(p["a"] > 0.1, p["a"], p["b"])],
    ids=["times_scalar", "where_scalar"],
)
def test_programs_with_more_ops_than_atoms_analyze(scale):
    """Regression (fuzzer): a gradient through mostly scalar ops has more ops than atoms; the
    per-named-dim op lists once overflowed their encoding and `analyze` raised IndexError."""
    p = {"a": jnp.ones((2,)), "b": jnp.float32(0.5)}
    x = jnp.ones((2,))

    def step(p, x):
        return jax.grad(lambda p: jnp.minimum(jnp.dot(x, scale(p)), 0.3))(p)

    prog = tc.trace(step, p, x)
    ana = tc.analyze(prog)
    assert len(prog.ops) > len(ana.nda.atom_size)
    for nd in ana.named_dims:  # every listed op really owns an atom of that kind in the dim
        for kind, ops in (("reduction", nd.reduction_ops), ("replicate", nd.replication_ops)):
            owned = {int(ana.nda.atom_owner[a]) for a in nd.atoms if ana.nda.atom_kind[a] == kind}
            assert set(ops) == owned
    assert any(nd.reduction_ops for nd in ana.named_dims)  # the dot's contraction over a


def _link_by_link_nda(prog: tc.Program):
    """Reference NDA: every link aligned in program order through the factor forest (what
    `run_nda` replays for refined components only): (atom sizes, kinds, owners, value atoms,
    use atoms, op atoms, M-edge rows, reshape sites)."""
    from toast_core.analysis.nda import _FactorForest
    from toast_core.analysis.rules import factors_of

    forest = _FactorForest()
    shapes = [v.shape for v in prog.values]
    produced = {vid for op in prog.ops for vid in op.results}
    value_dims = [
        None
        if v.id in produced
        else [[forest.new(s, "pass", -1)] if s > 1 else [] for s in v.shape]
        for v in prog.values
    ]
    use_dims, op_factors = {}, []
    for op in prog.ops:
        rule = factors_of(op, [shapes[v] for v in op.operands], [shapes[v] for v in op.results])
        ids = forest.new_many(rule.sizes, rule.kinds, op.index)
        op_factors.append(ids)
        for pos, dims in enumerate(rule.operands):
            use_dims[(op.index, pos)] = [[ids[f] for f in d] for d in dims]
        for vid, dims in zip(op.results, rule.results):
            value_dims[vid] = [[ids[f] for f in d] for d in dims]
    failed = set()
    for op in prog.ops:
        for pos, vid in enumerate(op.operands):
            for d, vdim in enumerate(value_dims[vid]):
                udim = use_dims[(op.index, pos)][d]
                if (vdim or udim) and not forest.align(vdim, udim):
                    failed.add((vid, op.index, pos, d))
    value_atoms = tuple(tuple(map(forest.leaves, dims)) for dims in value_dims)
    use_atoms = {k: tuple(map(forest.leaves, dims)) for k, dims in use_dims.items()}
    rows = []
    for op in prog.ops:
        for pos, vid in enumerate(op.operands):
            for d, (va, ua) in enumerate(zip(value_atoms[vid], use_atoms[(op.index, pos)])):
                if (vid, op.index, pos, d) not in failed:
                    for sub, (a, b) in enumerate(zip(va, ua)):
                        rows.append((len(rows), vid, op.index, pos, d, sub, a, b))
    return (
        forest.size,
        forest.kind,
        forest.owner,
        value_atoms,
        use_atoms,
        tuple(map(forest.leaves, op_factors)),
        rows,
        sorted(failed),
    )


@pytest.mark.parametrize("name", ["gpt", "llama", "unet"])
def test_vectorized_nda_matches_a_link_by_link_pass(name):
    """`run_nda` replays only the refined components: its atoms, M-edges and reshape sites are
    exactly those of aligning every link in program order."""
    prog, ana = zoo(name, True)
    nda = ana.nda
    size, kind, owner, value_atoms, use_atoms, op_atoms, rows, failed = _link_by_link_nda(prog)
    assert nda.atom_size.tolist() == size and list(nda.atom_kind) == kind
    assert nda.atom_owner.tolist() == owner
    assert nda.value_atoms == value_atoms and nda.use_atoms == use_atoms
    assert nda.op_atoms == op_atoms
    assert nda.medge_table.tolist() == [list(r) for r in rows]
    assert list(nda.reshape_sites) == failed
    assert all(
        nda.value_dim(v, d) == value_atoms[v][d]
        for v in range(0, len(value_atoms), 7)
        for d in range(len(value_atoms[v]))
    )


def test_vectorized_nda_matches_a_link_by_link_pass_with_reshape_conflicts():
    def clash(x, y):
        a = x.reshape(4, 6) * 2.0
        b = jnp.tanh(x).reshape(6, 4)
        return a.sum() + b.sum() + (x.reshape(2, 12) @ y).sum()

    prog, ana = analyzed(clash, sds(24), sds(12, 3), param_argnums=())
    size, kind, owner, value_atoms, use_atoms, op_atoms, rows, failed = _link_by_link_nda(prog)
    assert failed and list(ana.nda.reshape_sites) == failed
    assert ana.nda.atom_size.tolist() == size and ana.nda.value_atoms == value_atoms
    assert ana.nda.use_atoms == use_atoms and ana.nda.op_atoms == op_atoms
    assert ana.nda.medge_table.tolist() == [list(r) for r in rows]


# --- local max-flows ------------------------------------------------------------------------------


def _conflict_options(name: str, size: str) -> list:
    from demos import MODEL_ZOO

    w = MODEL_ZOO[name](size=size, train=True)
    ana = tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))
    return [(c.kind, c.named_dims, [(o.cuts, o.bytes) for o in c.options]) for c in ana.conflicts]


@pytest.mark.parametrize("name,size", [("gpt", "small"), ("llama", "tiny")])
def test_conflict_options_do_not_depend_on_the_search_radius(name, size, monkeypatch):
    """Self-conflict cuts are found on balls around each conflict, batched: the options are
    those of whole-graph max-flows whether the first ball is too small (radius 1: every ball's
    cut reaches its rim and the radius doubles), the default, or the whole graph, and whether
    the balls are solved together or one by one."""
    from toast_core.analysis import conflicts

    found = []
    for radius, hops, flow_limit in [(1 << 20, 1 << 20, 1), (1, 1, 1 << 30), (8, 16, 1 << 30)]:
        monkeypatch.setattr(conflicts.ClassGraph, "RADIUS", radius)
        monkeypatch.setattr(conflicts.ClassGraph, "HOPS", hops)
        monkeypatch.setattr(conflicts, "_FLOW_LIMIT", flow_limit)
        found.append(_conflict_options(name, size))
    assert any(kind == "self" and options for kind, _, options in found[0])
    assert found[1] == found[0] and found[2] == found[0]
