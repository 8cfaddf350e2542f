"""Primitive families: the one place that says which primitive names belong together.

The factor rules (`analysis/rules.py`), the flop counts (`cost/flops.py`) and loop fusion
(`cost/fusion.py`) each need to know "is this a reduction?", "is this elementwise?", "is this a
region boundary?". Each family is written here once, as names only; what a family *means* to a
module (its factors, its flops) stays in that module's registry.

`registrar` builds the decorator those registries use: one small function per primitive, keyed by
name, and registering a name twice is an error (a second rule would silently win otherwise).
"""

from __future__ import annotations

from collections.abc import Callable

from toast_core.errors import ToastError

# --- region pseudo-ops (written by trace.py around scan / while / cond bodies) -------------------

SCAN_START, SCAN_END = "scan_start", "scan_end"
WHILE_START, WHILE_END = "while_start", "while_end"
COND_START, COND_END = "cond_start", "cond_end"
#: Pseudo-ops that only mark region boundaries: no work, no memory traffic.
REGION_BOUNDARIES = frozenset({SCAN_START, SCAN_END, WHILE_START, WHILE_END, COND_START, COND_END})

# --- elementwise maps ----------------------------------------------------------------------------

#: Elementwise maps: result dim d ~ operand dim d. Includes the no-op copies below.
ELEMENTWISE = frozenset(
    (
        "abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt ceil "
        "clamp clz complex conj convert_element_type copy copy_p cos cosh device_put digamma div eq "
        "erf erf_inv erfc exp exp2 expm1 floor ge gt igamma igamma_grad_a igammac imag integer_pow "
        "is_finite le lgamma log log1p logistic lt max min mul ne neg nextafter not "
        "optimization_barrier or polygamma population_count pow random_gamma_grad real "
        "reduce_precision regularized_incomplete_beta rem round rsqrt select_n sharding_constraint "
        "shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square "
        "stop_gradient sub tan tanh threefry2x32 xor zeta"
    ).split()
)
#: Elementwise ops that compute nothing (copies, annotations, barriers): zero flops.
NO_OP_ELEMENTWISE = frozenset(
    {
        "copy",
        "copy_p",
        "device_put",
        "optimization_barrier",
        "sharding_constraint",
        "stop_gradient",
    }
)
#: One transcendental evaluation per element (XLA's `transcendentals` count), no flops.
TRANSCENDENTAL = frozenset(
    "acos acosh asin asinh atan atan2 atanh cbrt cos cosh erf erfc exp expm1 log log1p pow rsqrt "
    "sin sinh sqrt tan tanh".split()
)
#: Transcendentals XLA keeps fused into every reader like cheap ops (measured on the CPU).
DUPLICATED_TRANSCENDENTAL = frozenset({"sin", "cos", "tan"})
#: Elementwise functions XLA expands into several flops and transcendentals per element.
EXPANDED_TRANSCENDENTAL = frozenset({"logistic", "exp2", "erf_inv", "lgamma"})

# --- reductions and scans ------------------------------------------------------------------------

#: Reductions over `axes` with a monoid (one flop per element folded in).
REDUCTIONS = frozenset(
    {
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "reduce_xor",
    }
)
#: Reductions XLA fuses with the elementwise producers feeding them. Not the boolean ones: XLA's
#: CPU backend rewrites `reduce_and` (jnp.all) into a reduce-window tree reading a materialized
#: predicate (measured on jaxlib 0.10.2, `jnp.all(x * 2 + 1 > .5, axis=1)`).
FUSED_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"})
#: Index-returning reductions over `axes` (compare and select both index and value).
ARG_REDUCTIONS = frozenset({"argmax", "argmin"})
#: Prefix scans along `axis`.
CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})

# --- layout ----------------------------------------------------------------------------------------

#: Layout ops XLA fuses into loops along with elementwise maps (they move no extra bytes there).
FUSIBLE_LAYOUT = frozenset(
    {
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "transpose",
        "iota",
        "slice",
        "concatenate",
        "pad",
        "dynamic_slice",
        "rev",
    }
)

# --- gather and scatter (jax spells the combining scatters with a hyphen) ------------------------

#: Scatters that add their updates into the operand.
SCATTER_ADDS = frozenset({"scatter-add", "scatter_add"})


def registrar(table: dict, what: str) -> Callable:
    """The `@register("name", ...)` decorator of one registry `table`: each name maps to the
    decorated function; a name registered twice raises (`what` names the registry in the error)."""

    def register(*names: str) -> Callable:
        def decorate(fn: Callable) -> Callable:
            for name in names:
                if name in table:
                    raise ToastError(
                        f"{what}: primitive {name!r} registered twice, by "
                        f"{table[name].__name__} and {fn.__name__}"
                    )
                table[name] = fn
            return fn

        return decorate

    return register
