"""Predicted flops of gathers and scatters against XLA's `cost_analysis()` (issue 14, fuzz seed
16's small programs): the index bookkeeping XLA's partitioner adds to a gather whose indexed dim
is sharded and the fill mask of `jnp.take` counted on its shards (`masked_gather.py`), gathers in
loop fusion (`fusion._with_fused_gathers`), a one-window scatter (`flops.scatter_flops`)."""

import jax
import jax.numpy as jnp
import pytest
from xla_flops import predicted_and_compiled, unsharded_flops

F32 = jnp.float32


def lookup(rows: int, width: int, k: int):
    return {
        "x": jax.ShapeDtypeStruct((rows, width), F32),
        "i": jax.ShapeDtypeStruct((k,), jnp.int32),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rows", "axes"),
    [
        (4, {"data": 4}),  # one local row, the dim cut over the whole mesh (fuzz seed 16 #1357)
        (8, {"data": 4}),  # two local rows: the offset subtract per index
        (8, {"data": 2, "model": 2}),  # a dim cut over some mesh axes: the offset looked up
    ],
)
def test_a_gather_along_a_sharded_dim_tests_each_index_against_the_local_rows(rows, axes):
    """`x[i]` with x's rows sharded (the masked rule): a clamp, two compares, an or (and the
    offset subtract) per index, and a select per result element before the all-reduce; the
    unsharded gather counts none of it (0.48 of XLA before)."""
    predicted, compiled = predicted_and_compiled(
        lambda b: b["x"][b["i"]], (lookup(rows, 16, 1),), axes
    )
    assert predicted == compiled


@pytest.mark.slow
def test_a_take_with_fill_masks_on_its_result_shard_and_tests_every_index():
    """Fuzz seed 16 #1410: `jnp.take(x, i, axis=1)` with x's rows on 8 devices: each device
    selects its 8 result elements and tests the bounds of the one index (3 flops), 11 flops,
    not the global 67 / 8."""

    def fn(b):
        return jnp.take(b["x"], b["i"], axis=1)

    predicted, compiled = predicted_and_compiled(fn, (lookup(64, 32, 1),), {"data": 8})
    assert predicted == compiled


def fan_out_through_a_gather(x, i):  # one index: a dynamic-slice
    v = x * x
    g = v[i]
    return v / (1.0 + x), jnp.stack([g, jnp.tanh(g)], axis=1).sum(), jnp.where(g > 0.1, g, 0.0)


def take_read_twice(x, i):
    g = jnp.take(x * 2.0 + 1.0, i, axis=0)
    return g.sum(axis=1), jnp.maximum(g, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fn", "k"),
    [(fan_out_through_a_gather, 1), (fan_out_through_a_gather, 3), (take_read_twice, 3)],
)
def test_a_gather_fuses_its_cheap_producers_as_xla_does(fn, k):
    """Fuzz seed 16 #16: a gather of one index (a dynamic-slice) is fused into every loop reading
    it with the cheap ops making its operand and index, computed there over their whole shape:
    `x * x` read by a division and by `v[i]`, which two loops read, is computed three times
    (0.68 of XLA before). A gather of several indices is one fusion with its producers, its
    fill mask fused into each reader (`fusion._with_fused_gathers`)."""
    args = (jax.ShapeDtypeStruct((8, 4), F32), jax.ShapeDtypeStruct((k,), jnp.int32))
    predicted, compiled = unsharded_flops(fn, *args)
    assert predicted == compiled


SCATTERS = {
    "add_rows": (lambda x, i, u: x.at[i].add(u), (8, 16), (1, 16), 1),
    "set_rows": (lambda x, i, u: x.at[i].set(u), (8, 16), (1, 16), 1),
    "add_rank4": (lambda x, i, u: x.at[i].add(u), (4, 32, 2, 2), (1, 32, 2, 2), 1),
    "add_two_windows": (lambda x, i, u: x.at[i].add(u), (8, 16), (2, 16), 2),
    "set_two_windows": (lambda x, i, u: x.at[i].set(u), (8, 16), (2, 16), 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCATTERS))
def test_a_one_window_scatter_tests_its_bounds_and_selects(name):
    """Fuzz seed 16 #1347: a scatter of one update window is a dynamic-update-slice that tests
    the window's bounds (4 x rank - 1) and selects per update element; XLA also recomputes the
    index normalization in the test's fusion (`gather_fusion._one_window`, seed 17 #812)."""
    fn, x_shape, u_shape, k = SCATTERS[name]
    args = (
        jax.ShapeDtypeStruct(x_shape, F32),
        jax.ShapeDtypeStruct((k,), jnp.int32),
        jax.ShapeDtypeStruct(u_shape, F32),
    )
    predicted, compiled = unsharded_flops(fn, *args)
    assert predicted == compiled


@pytest.mark.slow
def test_a_scatter_along_a_sharded_dim_combines_every_update_it_holds():
    """Fuzz seed 31 #37: `x.at[i].add(u)` with x's rows on 4 devices: each device combines all
    the updates it holds (those landing in other rows are dropped after the combine is counted)
    and moves each index into its rows; the global count over the cut said a quarter."""

    def fn(b):
        return b["x"].at[b["i"]].add(jnp.tanh(b["x"][b["i"]]))

    args = (
        {
            "x": jax.ShapeDtypeStruct((4, 4, 16, 4), F32),
            "i": jax.ShapeDtypeStruct((4,), jnp.int32),
        },
    )
    predicted, compiled = predicted_and_compiled(fn, args, {"data": 4})
    assert predicted == pytest.approx(compiled, rel=0.05)


@pytest.mark.slow
def test_a_one_window_scatter_is_computed_in_each_loop_reading_it():
    """Fuzz seed 31 #37: a one-window scatter is a dynamic-update-slice that XLA fuses into each
    loop reading it, its select and add computed in each (0.80 of XLA before)."""

    def fn(x, i):
        v = x.at[:, :, i].add(jnp.tanh(x[:, :, i]))
        return x * v, v[:, :, 1:]

    args = (jax.ShapeDtypeStruct((4, 16, 4), F32), jax.ShapeDtypeStruct((1,), jnp.int32))
    predicted, compiled = unsharded_flops(fn, *args)
    assert predicted == pytest.approx(compiled, abs=6.0)  # the index normalization's copies


@pytest.mark.slow
@pytest.mark.parametrize(
    "update",
    [
        lambda v, i: v.at[:, i].add(jnp.tanh(v[:, i])),
        lambda v, i: v.at[:, i].multiply(jnp.exp(v[:, i])),
        lambda v, i: v.at[:, i].set(jnp.tanh(v[:, i])),
    ],
)
def test_an_expensive_update_read_from_a_one_window_scatters_operand_fuses_into_it(update):
    """Fuzz seed 19 #505: `v.at[:, i].add(tanh(v[:, i]))` is one dynamic-update-slice fusion
    with the slice and the tanh, which XLA fuses in (the update is placed once: no reuse), so
    `v = x * 2` is computed once, for the operand; rooting the tanh apart computed it again in
    the tanh's fusion (241 of XLA's 157 flops, the 3 left the index normalization's copies)."""

    def fn(x, i):
        return update(x * 2.0, i)

    args = (jax.ShapeDtypeStruct((7, 3, 4), F32), jax.ShapeDtypeStruct((1,), jnp.int32))
    predicted, compiled = unsharded_flops(fn, *args)
    assert predicted == pytest.approx(compiled, abs=6.0)


@pytest.mark.parametrize(("shape", "xla"), [((4, 2, 8), 473), ((4, 3, 8), 569)])
def test_a_masked_window_of_a_splat_is_one_select(shape, xla):
    """Fuzz seed 19 #274: the gradient of `mean(v.at[:, i].set(tanh(v[:, i])))` gathers the
    cotangent's `1 / n` splat at `i` and scatters a splat of ids: XLA's simplifier makes each
    masked window a select of scalars (`flops._uniform`), counted per window element before
    (540 and 636 flops)."""

    def fn(x, i):
        def loss(x):
            v = jnp.sin(x)
            return jnp.mean(v.at[:, i].set(jnp.tanh(v[:, i])))

        return jax.grad(loss)(x)

    args = (jax.ShapeDtypeStruct(shape, F32), jax.ShapeDtypeStruct((1,), jnp.int32))
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == xla
    assert predicted == pytest.approx(compiled, abs=6.0)  # the index normalization's copies


def top_k_route(x):
    """fuzz `_route`: softmax gates kept on each row's top 2 (a MoE router)."""
    gates = jax.nn.softmax(x, axis=-1)
    _, idx = jax.lax.top_k(gates, 2)
    mask = jnp.sum(jax.nn.one_hot(idx, x.shape[-1], dtype=gates.dtype), axis=-2)
    return gates * mask


@pytest.mark.slow
def test_a_softmax_read_by_top_k_and_a_loop_is_recomputed_in_the_loop():
    """Fuzz seed 17 #1021, #1511: the gates `e * (1 / sum(e))` are stored for the TopK custom
    call and computed again in the loop masking them, since `e = exp(x - max)`, read by the sum
    and the division, is a stored buffer (`fusion._stored_apart`): 0.93 of XLA before. (XLA:CPU
    counts the TopK custom call as -1 flop, as `unsharded_flops` does.)"""
    predicted, compiled = unsharded_flops(top_k_route, jax.ShapeDtypeStruct((64, 8), F32))
    assert predicted == compiled


@pytest.mark.slow
@pytest.mark.parametrize(("rows", "ways"), [(8, 8), (16, 8), (64, 2)])
def test_an_argmax_over_a_sharded_dim_reduces_again_after_the_gather(rows, ways):
    """Fuzz seed 17 #146: `argmax(x, axis=0)` with x's rows on the mesh: each device reduces
    its rows, all-gathers the partial maxima and indices and reduces those again, with the
    index offsets (`arg_reduce.py`); the flop rule spread over the shards was 0.13 of XLA's."""
    x = jax.ShapeDtypeStruct((rows, 16), F32)
    predicted, compiled = predicted_and_compiled(
        lambda b: jnp.argmax(b, axis=0), (x,), {"data": ways}
    )
    assert predicted == compiled


@pytest.mark.slow
def test_a_fill_mode_gather_along_a_sharded_dim_normalizes_its_indices_twice():
    """Fuzz seed 17 #979: `take_along_axis(x, i, axis=0)` with x's rows on 2 devices: the
    masked gather and, after the all-reduce, the fill mask are two fusions, each normalizing
    the indices (`masked_gather.py`); 0.82 of XLA's flops before."""

    def fn(b):
        return jnp.take_along_axis(b["x"], b["i"], axis=0)

    args = {"x": jax.ShapeDtypeStruct((4, 16), F32), "i": jax.ShapeDtypeStruct((2, 16), jnp.int32)}
    predicted, compiled = predicted_and_compiled(fn, (args,), {"data": 2, "model": 3})
    assert predicted == compiled


def leaky(x):
    return jnp.where(x > 0, x, 0.01 * x)


#: Fuzz seed 19's gather misses, as (fn, argument shapes and dtypes, XLA's flops on jaxlib
#: 0.10.2, the model's before): each program's XLA count is asserted too.
GATHER_FUSIONS = {
    # #233: `abs(x)` read by `x - abs(x)` and a take_along's gather fusion is computed in both,
    # not once more for the gather (`gather_fusion._gather_fusions`)
    "operand_read_by_a_gather_and_a_loop": (
        lambda x, i: (jnp.take_along_axis(jnp.abs(x), i, axis=0), x - jnp.abs(x)),
        (((8, 4, 4), F32), ((2, 4, 4), jnp.int32)),
        608,
    ),
    # #120: an argmax is a fusion of its own (a variadic reduce read through a
    # get-tuple-element), which blocks the all-paths test of the leaky ReLU feeding it and the
    # loop reading its index: the leaky ReLU is stored once
    "argmax_index_read_by_the_argmax_operand_loop": (
        lambda x: leaky(x) + jnp.argmax(leaky(x), axis=1, keepdims=True).astype(F32),
        (((16, 8), F32),),
        1536,
    ),
    "take_along_its_argmax": (
        lambda x: jax.nn.silu(
            jnp.take_along_axis(leaky(x), jnp.argmax(leaky(x), axis=3, keepdims=True), axis=3)
        ),
        (((4, 16, 4, 4), F32),),
        12800,
    ),
    # #294: the gradient of a gather, a scatter-add into zeros, added to the other gradient:
    # XLA scatters into that gradient, the add is gone (`simplify._scatter_into_addend`)
    "gather_gradient_added_to_another": (
        lambda w, x, i: jax.grad(
            lambda w: jnp.sum(jnp.take_along_axis(w, i, axis=0)) + jnp.sum(jnp.tanh(w * x))
        )(w),
        (((32, 8), F32), ((32, 8), F32), ((4, 8), jnp.int32)),
        1408,
    ),
    "row_gather_gradient_added_to_another": (
        lambda w, x, i: jax.grad(lambda w: jnp.sum(w[i] ** 2) + jnp.sum(jnp.tanh(w * x)))(w),
        (((32, 8), F32), ((32, 8), F32), ((4,), jnp.int32)),
        1368,
    ),
    # #294: `einsum("a,a->", u, v)`'s gradient `dot_general(1.0, v)` is `v` (`simplify.
    # _scaled_by_one`)
    "scalar_cotangent_seed_of_a_dot": (
        lambda u, v: jax.grad(lambda u: jnp.einsum("a,a->", u, v) + jnp.einsum("a,a->", u, u))(u),
        (((32,), F32), ((32,), F32)),
        64,
    ),
    # #1645: a gathered and scattered multiply is computed in both fusions, the tanh it reads
    # once, and what makes the tanh with it (`gather_fusion.gather_copies`)
    "gathered_clip_of_a_gelu": (
        lambda x, i: (lambda v: v.at[i].add(jnp.tanh(v[i])))(3.0 * jnp.tanh(jax.nn.gelu(x) / 3.0)),
        (((64,), F32), ((3,), jnp.int32)),
        725,
    ),
    # ...all of a cheap chain in both
    "gathered_cheap_chain": (
        lambda x, i: (lambda v: v.at[i].add(jnp.tanh(v[i])))(3.0 * (x * x + 1.0)),
        (((64,), F32), ((3,), jnp.int32)),
        405,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GATHER_FUSIONS))
def test_gathers_argmaxes_and_their_gradients_count_as_xla_counts_them(name):
    fn, shapes, xla = GATHER_FUSIONS[name]
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == xla
    assert predicted == compiled


def _take_along_read_by_a_gather(b):
    v = jnp.take_along_axis(b["x"], b["i"], axis=0)
    return jnp.take_along_axis(v, b["j"], axis=0), v * 2.0 + 1.0, v[b["k"]].T


TAKE_ALONG_READ_BY_A_GATHER = {
    "x": jax.ShapeDtypeStruct((8, 16, 2), F32),
    "i": jax.ShapeDtypeStruct((3, 16, 2), jnp.int32),
    "j": jax.ShapeDtypeStruct((2, 16, 2), jnp.int32),
    "k": jax.ShapeDtypeStruct((1,), jnp.int32),
}


@pytest.mark.slow
def test_a_fill_mask_is_computed_in_the_gathers_reading_it():
    """Fuzz seed 19 #1149: a `take_along_axis` read by a second one, a loop and a row gather
    (a dynamic-slice in two loops): XLA computes its fill mask in 4 fusions, the second
    gather's among them, and its index normalization in those and the raw gather's
    (`gather_fusion._gathered`): 2,947 flops; 1,315 with the mask stored once."""
    predicted, compiled = unsharded_flops(_take_along_read_by_a_gather, TAKE_ALONG_READ_BY_A_GATHER)
    assert compiled == 2947
    assert predicted == compiled


@pytest.mark.slow
def test_a_fill_mask_in_several_fusions_after_a_masked_gather():
    """The same with the gathered rows on 2 devices: the partitioned lookup once, the fill mask
    and the index normalization in each fusion reading the all-reduced result (`masked_gather.
    masked_gather_flops`' `mask_fusions`): 3,620 flops per device; 2,276 before."""
    args = (TAKE_ALONG_READ_BY_A_GATHER,)
    predicted, compiled = predicted_and_compiled(
        _take_along_read_by_a_gather, args, {"data": 2, "model": 3}
    )
    assert compiled == 3620
    assert predicted == compiled


def _take_along(x, i):
    return jnp.take_along_axis(x, i, axis=0)


#: A fill mask read by several fusions, as (fn of x[8, 16] and i[4, 16], XLA's flops on
#: jaxlib 0.10.2): duplicated only when it fuses on every path to its readers.
FILL_MASK_PATHS = {
    # through the argmax's index into the second gather: once; 1,632 when duplicated
    "gathered_at_its_argmax": (
        lambda x, i: _take_along(
            _take_along(x, i), jnp.argmax(_take_along(x, i), 0, keepdims=True)
        ),
        992,
    ),
    # an argmax and a gather on no common path: in both fusions; 1,104 before
    "read_by_an_argmax_and_a_gather": (
        lambda x, i: (_take_along(_take_along(x, i), i[:2]), jnp.argmax(_take_along(x, i), 0)),
        1744,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FILL_MASK_PATHS))
def test_a_fill_mask_is_duplicated_only_when_it_fuses_on_every_path(name):
    fn, xla = FILL_MASK_PATHS[name]
    args = (jax.ShapeDtypeStruct((8, 16), F32), jax.ShapeDtypeStruct((4, 16), jnp.int32))
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == xla
    assert predicted == compiled


@pytest.mark.slow
def test_a_fill_mask_goes_with_its_reader_into_the_gathers_computing_it_again():
    """Fuzz seed 19 #435: `v = take_along_axis(x, i)[..., None] * w` read by a scatter-multiply
    and by the gather of its update: XLA computes `v` in the scatter operand's loop and in the
    gather's fusion, the fill mask with it in both, and the index normalization in those and
    the raw gather's (`gather_fusion._with_gathers`): 866 flops; 546 with the mask once."""

    def fn(x, i, w, j):
        v = jnp.take_along_axis(x, i, axis=1)[..., None] * w
        return v.at[:, j].multiply(jnp.tanh(v[:, j]))

    args = [
        jax.ShapeDtypeStruct(shape, dtype)
        for shape, dtype in (((4, 8), F32), ((4, 8), jnp.int32), ((4,), F32), ((3,), jnp.int32))
    ]
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == 866
    assert predicted == compiled


def _scatter_then_add(kind: int):
    """Three sums reading `scatter + tanh(x)`: the add folded into the scatter's operand."""

    def fn(x, u, i):
        a, b = jnp.sin(x), jnp.tanh(x)
        if kind == 0:  # a scatter into zeros added to a, then b added
            g = (a + jnp.zeros_like(x).at[i].add(u)) + b
        elif kind == 1:  # a scatter into a itself, then b added
            g = a.at[i].add(u) + b
        else:  # written thrice: XLA's simplifier meets the scatter read thrice, before CSE
            s = jnp.zeros_like(x).at[i].add(u)
            return tuple(jnp.sum(((a + s) + b) * w, 0) for w in (1.0, x, b))
        return jnp.sum(g, 0), jnp.sum(g * x, 0), jnp.sum(g * g * x, 0)

    return fn


@pytest.mark.parametrize("kind, xla", [(0, 1353), (1, 1353), (2, 2121)])
def test_an_add_after_a_scatter_is_folded_into_the_scatters_operand(kind, xla):
    """`scatter_add(a, i, u) + b` is `scatter_add(a + b, i, u)` (`fusion._added_into_scatter`):
    `b`'s producers are computed once, in the fusion making the scatter's operand (fuzz seed 19
    #1654, 1.32 of XLA's flops: the checkpointed `sin * tanh`'s backward counted in each of 5
    fusions of a batchnorm's gradient)."""
    F32 = jnp.float32
    args = (
        jax.ShapeDtypeStruct((24, 8), F32),
        jax.ShapeDtypeStruct((3, 8), F32),
        jax.ShapeDtypeStruct((3,), jnp.int32),
    )
    predicted, compiled = unsharded_flops(_scatter_then_add(kind), *args)
    assert compiled == xla
    assert predicted == compiled


def _halved_thrice(v):
    return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5), (0, v))[1]


#: A `jnp.take` fill mask read by a fusion and by what does not fuse it, as (fn of x[24, 16],
#: i[4], w[4, 4]; XLA's flops on jaxlib 0.10.2). Broadcast along the result's offset dims, the
#: mask's select is effectively unary to XLA (`gather_fusion._unary_mask`): duplicated into
#: every loop reading it besides the fusion stored for the dot or the output.
UNARY_FILL_MASKS = {
    # fuzz seed 19 #1112: read by a dot and `v * v`; 984 with the mask once
    "take_read_by_a_dot_and_a_loop": (
        lambda x, i, w: (jnp.take(x, i, axis=1) @ w, jnp.take(x, i, axis=1) ** 2),
        1116,
    ),
    # an output and a loop: in both; 216 once
    "take_read_by_the_output_and_a_loop": (
        lambda x, i, w: (jnp.take(x, i, axis=1), jnp.sin(jnp.take(x, i, axis=1)) + 1.0),
        348,
    ),
    # a dot reads the select in the gather's order, a while loop transposed: two stored fusions
    # (fuzz seed 19 #1104); 1,214 with one
    "take_read_by_a_dot_a_loop_and_a_while": (
        lambda x, i, w: (
            jnp.take(x, i, axis=1) @ w,
            jnp.take(x, i, axis=1) ** 2,
            _halved_thrice(jnp.take(x, i, axis=1)),
        ),
        1334,
    ),
    # the output transposed too: 888 with one
    "take_read_by_a_dot_and_the_output": (
        lambda x, i, w: (jnp.take(x, i, axis=1) @ w, jnp.take(x, i, axis=1)),
        1020,
    ),
    # rows, in the gather's order already: one stored fusion for both
    "rows_read_by_a_dot_a_loop_and_a_while": (
        lambda x, i, w: (
            w @ jnp.take(x, i, axis=0),
            jnp.take(x, i, axis=0) ** 2,
            _halved_thrice(jnp.take(x, i, axis=0)),
        ),
        830,
    ),
    # along size-1 offset dims only the mask is a bitcast, a second array: once
    "take_of_one_column": (
        lambda x, i, w: (jnp.take(x[:, :1], i, axis=0).T @ w[:, :3], jnp.take(x[:, :1], i, 0) ** 2),
        96,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(UNARY_FILL_MASKS))
def test_a_broadcast_fill_mask_is_duplicated_as_a_unary_op(name):
    fn, xla = UNARY_FILL_MASKS[name]
    args = (
        jax.ShapeDtypeStruct((24, 16), F32),
        jax.ShapeDtypeStruct((4,), jnp.int32),
        jax.ShapeDtypeStruct((4, 4), F32),
    )
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == xla
    assert predicted == compiled


def _updated_in_place(v, i):
    """`v.at[:, i].set(tanh(v[:, i]))`: a one-window scatter whose update slices its operand."""
    return v.at[:, i].set(jnp.tanh(v[:, i]))


#: (fn of x[8, 16] and i[1], XLA's flops on jaxlib 0.10.2)
IN_PLACE_UPDATES = {
    "log_softmax": (lambda x, i: _updated_in_place(jax.nn.log_softmax(x, axis=0), i), 631),
    "cheap_chain": (lambda x, i: _updated_in_place(x * 2.0 + 1.0, i), 279),
    "cheap_chain_read_again": (
        lambda x, i: (lambda v: (_updated_in_place(v, i), v * 3.0))(x * 2.0 + 1.0),
        663,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(IN_PLACE_UPDATES))
def test_a_buffer_updated_in_place_from_a_slice_of_itself_is_stored(name):
    """Fuzz seed 19 #728: a one-window scatter is a dynamic-update-slice, which writes each
    element of its operand and its update once (`fusion._places_once`): the tanh fuses into
    the update and the operand is computed once, stored (`x * 2 + 1` twice before: 533 of
    XLA's 279 flops; the log_softmax's `x - max` 3 times, 885 of 631). The model is 5 short:
    XLA's index normalization in the slice and the update, priced once."""
    fn, xla = IN_PLACE_UPDATES[name]
    args = (jax.ShapeDtypeStruct((8, 16), F32), jax.ShapeDtypeStruct((1,), jnp.int32))
    predicted, compiled = unsharded_flops(fn, *args)
    assert compiled == xla
    assert predicted == pytest.approx(compiled, abs=5.0)  # the index normalization's copies


def _rows_updated_in_place(b):
    v = b["x"] * 2.0 + 1.0
    return v.at[b["i"]].set(jnp.tanh(v[b["i"]]))


def _columns_updated_in_place(b):
    v = b["x"] * 2.0 + 1.0
    return v.at[:, b["i"]].set(jnp.tanh(v[:, b["i"]]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fn", "xla"),
    [
        (_columns_updated_in_place, 147),  # rows cut: in place on each device, `v` stored once
        (_rows_updated_in_place, 328),  # the indexed dim cut: updated whole, then sliced
    ],
)
def test_a_buffer_updated_in_place_on_its_shards(fn, xla):
    """The same rule on x[8, 16] with its rows on 2 devices (`fusion._places_once`): a scatter
    along the uncut columns updates each shard in place (273 predicted before); one along the
    cut rows is a dynamic-update-slice of the whole `v` under a dynamic-slice of the device's
    rows, `v` computed in that fusion too (fuzz seed 19 #1582)."""
    args = ({"x": jax.ShapeDtypeStruct((8, 16), F32), "i": jax.ShapeDtypeStruct((1,), jnp.int32)},)
    predicted, compiled = predicted_and_compiled(fn, args, {"data": 2})
    assert compiled == xla
    assert predicted == pytest.approx(compiled, abs=5.0)  # the index normalization's copies
