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
