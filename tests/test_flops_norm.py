"""Predicted per-device flops of normalizations and reductions (softmax, log_softmax, var, max)
against XLA's `cost_analysis()` (fuzz seed 17's misses, issue 14): each test holds the ratio
predicted / compiled of `tc.validate` on a data-parallel plan within 5 %."""

import jax
import jax.numpy as jnp
import pytest
from xla_flops import predicted_and_compiled

F32 = jnp.float32


def flops_ratio(fn, args, axes: dict[str, int]) -> float:
    """predicted / compiled flops per device of `fn` under the data-parallel baseline on `axes`."""
    predicted, compiled = predicted_and_compiled(fn, args, axes)
    return predicted / compiled


def _shifted_exp(v):
    """A softmax's numerator: `exp(v - max(v))` over the last dim."""
    return jnp.exp(v - jax.lax.stop_gradient(jnp.max(v, axis=-1, keepdims=True)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, fn",
    [
        ("a scaled input", lambda b: _shifted_exp(b["x"] * 2.0)),
        ("an input minus a size-1 broadcast", lambda b: _shifted_exp(b["x"] - b["c"])),
        (
            "softmax of log_softmax (seed 17 #994)",
            lambda b: jax.nn.softmax(jax.nn.log_softmax(b["x"])),
        ),
    ],
)
def test_a_cheap_producer_of_a_max_and_its_exp_shift_is_computed_in_both(name, fn):
    """XLA:CPU (jaxlib 0.10.2) fuses an effectively-unary producer into the max's loop and into
    the exp's: its flops count twice (the model counted them once, 0.74-0.81 of XLA's)."""
    args = ({"x": jax.ShapeDtypeStruct((64, 8), F32), "c": jax.ShapeDtypeStruct((64, 1), F32)},)
    assert flops_ratio(fn, args, {"data": 2}) == pytest.approx(1.0, abs=0.05), name


@pytest.mark.slow
def test_a_producer_of_two_arrays_feeding_a_max_and_its_shift_is_computed_once():
    """`x * y` reads two arrays and one of its paths leaves the fusions (the max, kept apart):
    XLA computes it once; the test above must not make it twice."""
    args = ({"x": jax.ShapeDtypeStruct((64, 8), F32), "y": jax.ShapeDtypeStruct((64, 8), F32)},)
    ratio = flops_ratio(lambda b: _shifted_exp(b["x"] * b["y"]), args, {"data": 2})
    assert ratio == pytest.approx(1.0, abs=0.05)


def test_var_ddof_guard_folds_to_the_computed_case():
    """`jnp.var`'s `where(N - ddof > 0, s, nan)` has a predicate of literals alone: the select
    is its second case (no compile: the rewiring the flop count uses)."""
    from toast_core.cost.constant_scalars import chosen_case, constant_scalars, literal_scalar
    from toast_core.ir import trace

    prog = trace(lambda x: jnp.var(x, axis=0), jax.ShapeDtypeStruct((16, 8), F32))
    (select,) = [op for op in prog.ops if op.primitive == "select_n"]
    (div,) = [op for op in prog.ops if op.primitive == "div" and op.results[0] in select.operands]
    assert chosen_case(select, constant_scalars(prog)) == div.results[0]
    assert literal_scalar("lit(TypedInt(0, dtype=int32))") == 0.0
    assert literal_scalar("lit(True)") is True
    assert literal_scalar("x") is None


@pytest.mark.slow
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("grad", [False, True])
def test_var_counts_no_ddof_select(axis, grad):
    """XLA folds the ddof guard's select (measured: `var(x[16, 12, 8], axis=0)` is 6,144 flops);
    counting it put the forward at 1.10 and the gradient at 1.27 of XLA's flops on 2x4 with the
    reduced dim sharded."""

    def fn(b):
        if grad:
            return jax.grad(lambda x: jnp.sum(jnp.var(x, axis=axis) ** 2))(b["x"])
        return jnp.var(b["x"], axis=axis)

    args = ({"x": jax.ShapeDtypeStruct((16, 12, 8), F32)},)
    assert flops_ratio(fn, args, {"data": 2, "model": 4}) == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("reduce", [jnp.max, jnp.min])
def test_a_max_gradient_converts_its_mask_once(reduce):
    """The gradient of `max(x, 0)`: `convert(x == max)` is summed (the tie count) and multiplied
    by the cotangent, a select after XLA's simplifier; the convert is computed in the sum's loop
    alone (measured: 9,216 flops on [16, 12, 8]; counted in both loops, 1.17 of XLA's)."""

    def fn(b):
        return jax.grad(lambda x: jnp.sum(reduce(x, axis=0) ** 2))(b["x"])

    args = ({"x": jax.ShapeDtypeStruct((16, 12, 8), F32)},)
    assert flops_ratio(fn, args, {"data": 2, "model": 4}) == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow
def test_a_softmax_gradient_scales_the_reciprocal_not_the_rows():
    """The gradient of `sum(softmax(x, 0) ** 2)`: the cotangent `2 * p` is read by a multiply
    with a size-1 broadcast and by a division by the spread sum; XLA moves the 2 onto the [12, 8]
    reciprocal (measured 17,184 flops on one device; scaling `p` counted 20,160, 1.17)."""

    def fn(b):
        return jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=0) ** 2))(b["x"])

    args = ({"x": jax.ShapeDtypeStruct((16, 12, 8), F32)},)
    assert flops_ratio(fn, args, {"data": 1}) == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow
def test_a_softmax_over_a_cut_dim_computes_the_reciprocal_on_every_device():
    """`softmax(x, 0)` with dim 0 cut 8 ways: the sums are all-reduced and every device computes
    `1 / sum` over all [12, 8] of them (measured 864 flops per device; the division's 8-way share
    of the reciprocal counted 780, 0.90)."""
    args = ({"x": jax.ShapeDtypeStruct((16, 12, 8), F32)},)
    ratio = flops_ratio(lambda b: jax.nn.softmax(b["x"], axis=0), args, {"data": 2, "model": 4})
    assert ratio == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, axes",
    [((6, 4, 4, 8), {"data": 2, "model": 3}), ((8, 16, 12, 2), {"data": 8})],
)
def test_a_softmax_over_a_dim_cut_to_one_row_divides_without_a_reciprocal(shape, axes):
    """`softmax(x, 0)` with dim 0 cut to one row per device: the sums' broadcast onto the rows
    only adds a size-1 dim, a bitcast after XLA's simplifier, and the device divides by the
    all-reduced sums directly (measured 512 flops per device on [6, 4, 4, 8] over 6 devices,
    fuzz seed 19 #1814; counting the reciprocal said 640, 1.25)."""
    args = ({"x": jax.ShapeDtypeStruct(shape, F32)},)
    ratio = flops_ratio(lambda b: jax.nn.softmax(b["x"], axis=0), args, axes)
    assert ratio == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("axis", [0, 1])
def test_a_partitioned_softmax_gradient_divides_the_scaled_rows(axis):
    """On 8 devices (dim 0 cut 8 ways) XLA keeps the gradient's `(2 * p) / s` a real divide with
    the 2 on the rows, and moves it onto the broadcast's source only in the multiply's loop
    (measured 2,784 and 2,336 flops per device; moving it for both readers counted 0.94 and
    0.93 of them)."""

    def fn(b):
        return jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=axis) ** 2))(b["x"])

    args = ({"x": jax.ShapeDtypeStruct((16, 12, 8), F32)},)
    assert flops_ratio(fn, args, {"data": 2, "model": 4}) == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, fn, axes",
    [
        ((1024, 4), lambda b: jax.nn.log_softmax(b["x"], axis=1), {"data": 1}),
        (
            (16, 32, 4, 2),
            lambda b: jax.nn.log_softmax(jnp.cumsum(b["x"], axis=2), axis=2),
            {"data": 1},
        ),
        ((1024, 8), lambda b: jax.nn.log_softmax(2.0 * b["x"], axis=1), {"data": 2}),
        ((256, 64), lambda b: jax.nn.log_softmax(b["x"], axis=1), {"data": 2}),
    ],
)
def test_a_library_max_stores_its_shifted_operand(shape, fn, axes):
    """XLA:CPU runs a max over at least 4,096 local elements as a library call that also
    returns `x - max(x)`: log_softmax's shifted rows are computed once, not in the exp's loop
    and the final subtract's (measured: 14,336 flops on [1024, 4], counted 18,432, 1.29; the
    cumsum then log_softmax of issue 14, 26,624 counted 30,720)."""
    args = ({"x": jax.ShapeDtypeStruct(shape, F32)},)
    assert flops_ratio(fn, args, axes) == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
def test_a_max_over_a_cut_dim_leaves_its_shift_to_each_reader():
    """With the reduced dim cut the max is all-reduced before the subtract: no library call
    returns the shift, and XLA computes it in both loops (measured 40,960 flops per device for
    `log_softmax(x[256, 64], 0)` with dim 0 cut in 2)."""
    args = ({"x": jax.ShapeDtypeStruct((256, 64), F32)},)
    fn = lambda b: jax.nn.log_softmax(b["x"], axis=0)  # noqa: E731
    assert flops_ratio(fn, args, {"data": 2}) == pytest.approx(1.0, abs=0.02)
