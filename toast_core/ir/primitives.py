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
#: The param of a `while_start` or `scan_start` naming what its loop computes beyond its
#: operands (a digest of its condition and body, `trace._loop_identity`): two loops equal in it
#: and in their operands are one loop to XLA's CSE (`simplify._same_loop`).
LOOP_IDENTITY = "loop_identity"

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
        "stop_gradient sub tan tanh xor zeta"
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
    "atan atan2 cbrt cos erf exp expm1 log log1p pow rsqrt sin sqrt tan tanh".split()
)
#: Transcendentals XLA keeps fused into every reader like cheap ops (measured on the CPU).
DUPLICATED_TRANSCENDENTAL = frozenset({"sin", "cos", "tan"})
#: Elementwise functions XLA expands into several flops and transcendentals per element
#: (special functions, inverse and hyperbolic trigonometry; counts in `cost/flops.py`).
EXPANDED_TRANSCENDENTAL = frozenset(
    (
        "acos acosh asin asinh atanh bessel_i0e bessel_i1e cosh digamma erf_inv erfc exp2 igamma "
        "igamma_grad_a igammac lgamma logistic nextafter polygamma random_gamma_grad "
        "regularized_incomplete_beta sinh zeta"
    ).split()
)

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

#: The products of arrays: dots and convolutions (XLA emits them apart from loop fusions).
MATMULS = frozenset({"dot_general", "conv_general_dilated"})
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

#: Scatters that combine their updates with the operand (one flop per update element).
COMBINING_SCATTERS = frozenset(
    {"scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"}
)
#: Every scatter: the combining ones and the overwriting `scatter`.
SCATTERS = COMBINING_SCATTERS | {"scatter"}

# --- windows, stacking, randomness -----------------------------------------------------------------

#: Windowed reductions (pooling); `reduce_window` is the generic one with a body.
REDUCE_WINDOWS = frozenset(
    {"reduce_window", "reduce_window_sum", "reduce_window_max", "reduce_window_min"}
)
#: Key-array plumbing of `jax.random` (keys in, keys or key data out).
RANDOM_KEYS = frozenset(
    {
        "random_clone",
        "random_fold_in",
        "random_seed",
        "random_split",
        "random_unwrap",
        "random_wrap",
    }
)
#: Ops that create data from nothing (no operand dims to link).
CREATION = frozenset({"empty", "empty2", "iota", "rng_bit_generator", "rng_uniform"})


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
