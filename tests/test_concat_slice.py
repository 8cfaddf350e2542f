"""Concatenate / split / slice along a sharded dim, priced as XLA's SPMD partitioner reshards them
(toast_core/cost/concat_slice.py, halo.py): all-to-alls and halo collective-permutes, not
all-gathers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from lookup import dim_name

import toast_core as tc
from toast_core.cost.halo import slice_halo_permutes
from toast_core.errors import ToastError

HW = tc.hardware("tpu-v5e")
MESH = tc.MeshSpec({"data": 2, "model": 4})
F32 = 4


# -- XLA's halo exchange, measured on the zoo (HLO of jax 0.10.2, CPU) ------------------------


@pytest.mark.parametrize(
    "dim_size, n, start, size, expected",
    [
        # GNS edge split [256, 192] -> 3 x [256, 64], 4 shards: compact, neighbour, compact.
        (192, 4, 0, 64, (32, 16)),
        (192, 4, 64, 64, (32, 32)),
        (192, 4, 128, 64, (16, 16, 16)),
        # GNS node split [64, 128] -> 2 x [64, 64].
        (128, 4, 0, 64, (32, 16)),
        (128, 4, 64, 64, (16, 16)),
        # U-Net skip splits (channels 96 -> 64 + 32, 48 -> 32 + 16).
        (96, 4, 0, 64, (24,)),
        (96, 4, 64, 32, (8, 8, 8)),
        (48, 4, 0, 32, (12,)),
        (48, 4, 32, 16, (4, 4, 4)),
    ],
)
def test_slice_halo_permutes_match_the_compiled_zoo(dim_size, n, start, size, expected):
    assert slice_halo_permutes(dim_size, n, start, size) == expected


def test_slice_halo_permutes_edge_cases():
    assert slice_halo_permutes(64, 1, 0, 32) == ()  # unsharded: nothing to exchange
    assert slice_halo_permutes(63, 4, 0, 32) is None  # uneven shards: gathered
    assert slice_halo_permutes(64, 4, 0, 64) == ()  # the whole dim: every shard is local
    assert slice_halo_permutes(8, 8, 0, 0) == ()  # empty (fuzz seed 14 #297): nothing moves
    with pytest.raises(ToastError, match="slice_halo_permutes"):
        slice_halo_permutes(64, 4, 40, 32)


def test_an_empty_slice_of_a_sharded_dim_is_searched():
    """Fuzz seed 14 #297: the gradient of `jnp.pad(v, (1, 2), mode="edge")` on a dim of 8
    sharded 8 ways takes an empty slice; pricing its halo raised a ToastError in the search."""

    def step(w, x):
        def loss(w):
            return jnp.mean(jnp.pad(x @ w, [(0, 0), (1, 2)], mode="edge"))

        return w - 0.1 * jax.grad(loss)(w)

    args = (jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((16, 8), jnp.float32))
    ana = tc.analyze(tc.trace(step, *args))
    mesh = tc.MeshSpec({"data": 8})
    for strategy, _ in tc.baselines.all(ana, mesh).values():
        if strategy is not None:
            tc.estimate(ana, strategy, mesh, "tpu-v5e")
    tc.search(ana, mesh, "tpu-v5e", budget_s=None, num_simulations=24, seed=0)


# -- the cost model on a small program --------------------------------------------------------


def step(params, x):
    """Two column-parallel projections concatenated on the sharded dim, then a row-parallel
    projection of the concatenation: the GNS message pattern. Its gradient splits the
    concatenation's gradient back (a split on the sharded dim)."""

    def loss(p):
        a = x @ p["w1"]  # [B, 32]
        b = x @ p["w2"]  # [B, 32]
        h = jnp.concatenate([a, b], axis=1)  # [B, 64]
        return jnp.sum((h @ p["w3"]) ** 2)

    return jax.grad(loss)(params)


def _program():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (16, 32)),
        "w2": jax.random.normal(k[1], (16, 32)),
        "w3": jax.random.normal(k[2], (64, 8)),
    }
    x = jax.random.normal(k[3], (32, 16))
    ana = tc.analyze(tc.trace(step, params, x, param_argnums=(0,)))
    return ana, (params, x)


def _megatron(ana):
    """w1, w2 column-parallel, w3 row-parallel, their gradients alike."""
    dims = {}
    for prefix in ("params", "out"):
        dims[dim_name(ana, f"{prefix}.w1", 1)] = "model"
        dims[dim_name(ana, f"{prefix}.w2", 1)] = "model"
        dims[dim_name(ana, f"{prefix}.w3", 0)] = "model"
    return tc.Strategy.make(ana, dims)


def _by_kind(report, primitive: str, prog) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in report.collectives:
        if prog.ops[c.op].primitive == primitive:
            out[c.kind] = out.get(c.kind, 0) + 1
    return out


def test_concatenate_on_a_sharded_dim_moves_shards_by_all_to_all():
    ana, _ = _program()
    report = tc.estimate(ana, _megatron(ana), MESH, HW)
    # Each operand's shards move to the batch dim, then the result's move back: 3 all-to-alls,
    # each of a local buffer (a, b: [32, 32/4]; h: [32, 64/4]).
    assert _by_kind(report, "concatenate", ana.program) == {"all-to-all": 3}
    got = sorted(
        c.result_bytes
        for c in report.collectives
        if ana.program.ops[c.op].primitive == "concatenate"
    )
    assert got == [32 * 8 * F32, 32 * 8 * F32, 32 * 16 * F32]


def test_split_on_a_sharded_dim_exchanges_halos():
    ana, _ = _program()
    report = tc.estimate(ana, _megatron(ana), MESH, HW)
    halos = [c for c in report.collectives if ana.program.ops[c.op].primitive == "split"]
    assert {c.kind for c in halos} == {"collective-permute"}
    want = slice_halo_permutes(64, 4, 0, 32) + slice_halo_permutes(64, 4, 32, 32)
    # Columns of the local [32, 16] gradient shard, 32 rows of f32 each.
    assert sorted(c.bytes for c in halos) == sorted(32 * s * F32 for s in want)
    assert not [c for c in report.collectives if c.kind == "all-gather"]


def test_concatenate_into_a_replicated_result_gathers_the_result_once():
    ana, _ = _program()
    # w3's input dim left whole: the concatenation's dim 1 is replicated.
    s = tc.Strategy.make(
        ana, {dim_name(ana, "params.w1", 1): "model", dim_name(ana, "params.w2", 1): "model"}
    )
    report = tc.estimate(ana, s, MESH, HW)
    fwd = [
        (c.kind, c.bytes)
        for c in report.collectives
        if ana.program.ops[c.op].primitive == "concatenate"
    ]
    assert sorted(fwd) == [
        ("all-gather", 32 * 64 * F32),
        ("all-to-all", 32 * 32 * F32),
        ("all-to-all", 32 * 32 * F32),
    ]


@pytest.mark.slow
def test_concatenate_and_split_collectives_match_xla():
    ana, args = _program()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(step, args, ana, _megatron(ana), mesh, HW, check_numerics=False)
    for kind in ("all-to-all", "collective-permute", "all-gather"):
        assert check.predicted_collective_ops_target.get(kind, 0) == (
            check.compiled_collective_ops_target.get(kind, 0)
        ), kind
        assert check.predicted_collective_bytes.get(kind, 0) == pytest.approx(
            check.compiled_collective_bytes.get(kind, 0)
        ), kind


def window(params, x):
    """A column-parallel projection, a window of its columns, a row-parallel projection."""
    y = x @ params["w1"]  # [B, 64]
    return y[:, 16:48] @ params["w2"]  # [B, 32] @ [32, 8]


def _window_program():
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {"w1": jax.random.normal(k[0], (16, 64)), "w2": jax.random.normal(k[1], (32, 8))}
    x = jax.random.normal(k[2], (32, 16))
    ana = tc.analyze(tc.trace(window, params, x, param_argnums=(0,)))
    s = tc.Strategy.make(
        ana, {dim_name(ana, "params.w1", 1): "model", dim_name(ana, "params.w2", 0): "model"}
    )
    return ana, s, (params, x)


def test_slice_of_a_sharded_dim_exchanges_halos_with_both_neighbours():
    ana, s, _ = _window_program()
    report = tc.estimate(ana, s, MESH, HW)
    got = [(c.kind, c.bytes) for c in report.collectives if c.kind != "all-reduce"]
    # 16 columns per shard, 8 per result shard starting at 16: 8 columns from each side.
    assert slice_halo_permutes(64, 4, 16, 32) == (8, 8)
    assert got == [("collective-permute", 32 * 8 * F32)] * 2


@pytest.mark.slow
def test_slice_collectives_match_xla():
    ana, s, args = _window_program()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(window, args, ana, s, mesh, HW, check_numerics=False)
    assert check.predicted_collective_ops_target == check.compiled_collective_ops_target
    assert check.predicted_collective_bytes == pytest.approx(check.compiled_collective_bytes)


def test_incremental_evaluation_prices_them_like_the_full_evaluator():
    """A delta re-prices the concatenate's and the split's values through the evaluator's own
    code, restricted to those values (cost/incremental.py)."""
    from toast_core.cost import evaluator
    from toast_core.cost.incremental import Incremental

    ana, _ = _program()
    ev = evaluator(ana, MESH, HW)
    masks = _megatron(ana).fine_masks(ana, MESH)
    for k in range(1, int(np.count_nonzero(masks)) + 1):
        parent = masks.copy()
        parent[np.flatnonzero(masks)[:k]] = 0  # the megatron plan less its first k shardings
        inc = Incremental(ev)
        inc.score(parent)
        limit, inc.tab.full_limit = inc.tab.full_limit, float("inf")
        try:
            got = inc.score(masks, parent)
        finally:
            inc.tab.full_limit = limit
        assert inc.delta_evaluations == 1
        assert got.comm_s == pytest.approx(ev.score(masks).comm_s, rel=1e-12)


def split_after_partial_sum(params, x):
    """A row-parallel projection (a partial sum over `model`) split in two, each piece read by a
    row-parallel projection sharded like it (the U-Net's skip splits of a conv's output)."""
    y = x @ params["w1"]  # [B, 64], partial over model
    a, b = jnp.split(y, 2, axis=1)
    return jnp.tanh(a) @ params["wa"] + jnp.tanh(b) @ params["wb"]


def _split_program():
    k = jax.random.split(jax.random.PRNGKey(2), 4)
    params = {
        "w1": jax.random.normal(k[0], (16, 64)),
        "wa": jax.random.normal(k[1], (32, 8)),
        "wb": jax.random.normal(k[2], (32, 8)),
    }
    x = jax.random.normal(k[3], (32, 16))
    ana = tc.analyze(tc.trace(split_after_partial_sum, params, x, param_argnums=(0,)))
    s = tc.Strategy.make(
        ana, {dim_name(ana, f"params.{w}", 0): "model" for w in ("w1", "wa", "wb")}
    )
    return ana, s, (params, x)


def test_a_partial_sum_read_only_by_a_split_of_sharded_pieces_is_reduce_scattered():
    """XLA gives the partial sum the pieces' sharding: a reduce-scatter onto the split dim (TPU,
    GPU; all-reduce and dynamic-slice on CPU), then the halos; not an all-reduce."""
    ana, s, _ = _split_program()
    report = tc.estimate(ana, s, MESH, HW)
    y_id = ana.program.ops[0].results[0]
    (y,) = [c for c in report.collectives if c.value == y_id and c.kind != "collective-permute"]
    assert (y.kind, y.mesh_axes, y.bytes) == ("reduce-scatter", ("model",), 32 * 64 * F32)


@pytest.mark.slow
def test_a_split_partial_sum_matches_xla():
    ana, s, args = _split_program()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(split_after_partial_sum, args, ana, s, mesh, HW)
    assert check.numerics_ok
    assert check.compiled_collective_ops_target["reduce-scatter"] == 1
    assert check.predicted_collective_ops_target == check.compiled_collective_ops_target
    assert check.step_time_ratio == pytest.approx(1.0, abs=0.1)


def test_incremental_prices_the_split_partial_sum_like_the_full_evaluator():
    """Sharding the pieces' readers last (the reduce-scatter appears only then) or first, every
    delta equals a full evaluation."""
    from toast_core.cost import evaluator
    from toast_core.cost.incremental import Incremental

    ana, s, _ = _split_program()
    ev = evaluator(ana, MESH, HW)
    target = s.fine_masks(ana, MESH)
    for order in (np.flatnonzero(target), np.flatnonzero(target)[::-1]):
        masks = np.zeros_like(target)
        inc = Incremental(ev)
        inc.tab.full_limit = float("inf")
        inc.score(masks)
        for f in order:
            parent = masks.copy()
            masks[f] = target[f]
            assert inc.score(masks, parent).comm_s == pytest.approx(
                ev.score(masks).comm_s, rel=1e-12
            )
        assert inc.full_evaluations == 1


def head_rows(params, x):
    """A window of rows of a value no plan shards there (it comes whole from tanh(x)), read by a
    projection whose rows are sharded: fuzz seed 15 #58's `v5[:3]` of a replicated `v5`."""
    y = jnp.tanh(x)[0:4]  # [4, 16] of [8, 16]
    return y @ params["w"]


def _head_rows_program():
    k = jax.random.split(jax.random.PRNGKey(3), 2)
    params = {"w": jax.random.normal(k[0], (16, 8))}
    x = jax.random.normal(k[1], (8, 16))
    ana = tc.analyze(tc.trace(head_rows, params, x, param_argnums=(0,)))
    (sl,) = [op for op in ana.program.ops if op.primitive == "slice"]
    (rows,) = ana.value_named_dims(sl.results[0])[0]
    return ana, tc.Strategy.make(ana, {f"N{rows}": "model"}), (params, x)


def test_slicing_a_whole_dim_into_sharded_rows_exchanges_halos():
    """XLA slices the whole operand locally to the result's sharding, then exchanges the same
    halos as for a sharded operand: 8 rows in 4 shards of 2, result shards of 1 row."""
    ana, s, _ = _head_rows_program()
    report = tc.estimate(ana, s, MESH, HW)
    got = sorted((c.kind, c.mesh_axes, c.bytes) for c in report.collectives)
    assert slice_halo_permutes(8, 4, 0, 4) == (2, 1)
    row = 16 * F32
    assert got == [
        ("collective-permute", ("model",), 1 * row),
        ("collective-permute", ("model",), 2 * row),
    ]


def test_slicing_a_whole_dim_into_unsharded_rows_moves_nothing():
    ana, _, _ = _head_rows_program()
    report = tc.estimate(ana, tc.Strategy.make(ana, {}), MESH, HW)
    assert not report.collectives


@pytest.mark.slow
def test_slicing_a_whole_dim_into_sharded_rows_matches_xla():
    ana, s, args = _head_rows_program()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(head_rows, args, ana, s, mesh, HW)
    assert check.numerics_ok
    assert check.compiled_collective_bytes["collective-permute"] == 3 * 16 * F32
    assert check.predicted_collective_bytes == pytest.approx(check.compiled_collective_bytes)


def cat_whole(params, x):
    """Two whole [6, 8] values concatenated on dim 1 into a result read by a projection whose
    input dim is sharded (fuzz seed 15 #979); and a stack of two [8] rows read alike."""
    h = x @ params["w"]  # [6, 8]
    y = jnp.concatenate([h, jnp.tanh(h)], axis=1)  # [6, 16]
    z = jnp.stack([h[0], jnp.sin(h[1])])  # [2, 8]
    return y @ params["u"], z.T @ params["v"]


def _cat_whole_program():
    k = jax.random.split(jax.random.PRNGKey(4), 5)
    params = {
        "w": jax.random.normal(k[0], (4, 8)),
        "u": jax.random.normal(k[1], (16, 3)),
        "v": jax.random.normal(k[2], (2, 3)),
    }
    x = jax.random.normal(k[3], (6, 4))
    ana = tc.analyze(tc.trace(cat_whole, params, x, param_argnums=(0,)))
    s = tc.Strategy.make(
        ana, {dim_name(ana, "params.u", 0): "data", dim_name(ana, "params.v", 0): "data"}
    )
    return ana, s, (params, x)


def test_concatenating_whole_operands_into_a_sharded_dim_moves_the_result_by_all_to_all():
    """XLA concatenates sharded on another dim (a local slice), then one all-to-all of the local
    result moves the shards onto the concatenated dim: [6, 16] / 2 and [2, 8] / 2; a stack
    first moves each operand's local [8] by an all-to-all."""
    ana, s, _ = _cat_whole_program()
    report = tc.estimate(ana, s, MESH, HW)
    got = sorted(
        (c.kind, c.mesh_axes, c.result_bytes)
        for c in report.collectives
        if ana.program.ops[c.op].primitive in ("concatenate", "stack")
    )
    assert got == [
        ("all-to-all", ("data",), 8 * F32),
        ("all-to-all", ("data",), 8 * F32),
        ("all-to-all", ("data",), 8 * F32),
        ("all-to-all", ("data",), 6 * 8 * F32),
    ]


@pytest.mark.slow
def test_concatenating_whole_operands_into_a_sharded_dim_matches_xla():
    ana, s, args = _cat_whole_program()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(cat_whole, args, ana, s, mesh, HW)
    assert check.numerics_ok
    assert check.compiled_collective_bytes["all-to-all"] == (3 * 8 + 6 * 8) * F32
    assert check.predicted_collective_bytes == pytest.approx(check.compiled_collective_bytes)


def evens_odds(x):
    """`x[::2]` and `x[1::2]` of rows sharded 4 ways (the levels of `associative_scan`)."""
    y = jnp.tanh(x)
    return y[::2] * 2.0, y[1::2]


def _evens_odds_program(results_sharded: bool):
    x = jax.random.normal(jax.random.PRNGKey(6), (16, 4))
    ana = tc.analyze(tc.trace(evens_odds, x))
    prog = ana.program
    (tanh,) = [op for op in prog.ops if op.primitive == "tanh"]
    dims = {f"N{ana.value_named_dims(tanh.results[0])[0][0]}": "model"}
    if results_sharded:
        for op in prog.ops:
            if op.primitive == "slice":
                dims[f"N{ana.value_named_dims(op.results[0])[0][0]}"] = "model"
    return ana, tc.Strategy.make(ana, dims), (x,)


def test_a_strided_slice_of_sharded_rows_gathers_the_result_not_the_operand():
    """Each shard of 4 rows takes its own even (odd) rows: a result left whole is gathered
    (8 rows of 4 f32, not the operand's 16); a result sharded alike needs nothing."""
    ana, s, _ = _evens_odds_program(results_sharded=False)
    got = sorted((c.kind, c.bytes) for c in tc.estimate(ana, s, MESH, HW).collectives)
    assert got == [("all-gather", 8 * 4 * F32)] * 2
    ana, s, _ = _evens_odds_program(results_sharded=True)
    assert not tc.estimate(ana, s, MESH, HW).collectives


@pytest.mark.slow
@pytest.mark.parametrize("results_sharded", [False, True])
def test_strided_slice_collectives_match_xla(results_sharded):
    ana, s, args = _evens_odds_program(results_sharded)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    check = tc.validate(evens_odds, args, ana, s, mesh, HW)
    assert check.numerics_ok
    assert check.predicted_collective_bytes == pytest.approx(check.compiled_collective_bytes)
