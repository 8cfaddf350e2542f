"""A `Workload`: one JAX function plus example arguments, the unit the explorer shards.

Small sizes carry concrete arrays so the program can run and be checked numerically; real sizes
carry `jax.ShapeDtypeStruct` pytrees so a 175B-parameter model can be traced without allocating.
`Init` lets each model file build both from one init function.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True, eq=False)  # identity eq/hash: `args` holds arrays, which can't compare
class Workload:
    """A program to shard: `fn(*args)`, with the persistent args (params, optimizer state) named.

    Train steps return their updated persistent args in `param_argnums` order and then the
    scalar loss, e.g. `(params, opt_state, loss)`, so a sharding for an input can be reused for
    the matching output; forwards return the model output.
    """

    name: str  # zoo key, e.g. "gpt"
    description: str  # one line for the UI
    fn: Callable  # the JAX function to shard (a train step or forward), pure, jit-able
    args: tuple  # example args: concrete arrays (small sizes) or ShapeDtypeStructs (real sizes)
    param_argnums: tuple[int, ...] = (0,)  # positional args holding params / optimizer state
    config: object = None  # the config dataclass instance used
    int_bounds: Mapping[str, int] | None = None  # leaf key name -> exclusive bound for random ints

    @property
    def is_concrete(self) -> bool:
        """True when every leaf of `args` is a real array (nothing to invent)."""
        return all(isinstance(x, jax.Array | np.ndarray) for x in jax.tree.leaves(self.args))

    def concrete_args(self, seed: int = 0) -> tuple:
        """Arrays with the structure of `args`, so abstract workloads can also be run.

        Floats are drawn from N(0, 0.02) like a fresh init; integer leaves are uniform in
        [0, bound), where bound is `int_bounds[key]` for the leaf's last pytree key (e.g.
        "tokens" -> vocab) and 2 otherwise, so token ids and edge indices stay in range.
        """
        if self.is_concrete:
            return self.args
        paths_leaves, treedef = jax.tree.flatten_with_path(self.args)
        rng = np.random.default_rng(seed)
        bounds = self.int_bounds or {}
        leaves = [_random_leaf(rng, x, bounds.get(_last_key(path), 2)) for path, x in paths_leaves]
        return jax.tree.unflatten(treedef, leaves)


def _last_key(path: tuple) -> str:
    if not path:
        return ""
    k = path[-1]
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def _random_leaf(rng: np.random.Generator, leaf: Any, int_bound: int) -> jax.Array:
    dtype = jnp.dtype(leaf.dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(0.02 * rng.standard_normal(leaf.shape, np.float32), dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(rng.integers(0, int_bound, leaf.shape), dtype)
    return jnp.zeros(leaf.shape, dtype)


def resolve_config(factory: str, sizes: Mapping[str, Any], size: str, overrides: dict) -> Any:
    """The named config with `overrides` applied; bad names fail here, not deep in a trace."""
    if size not in sizes:
        raise ValueError(f"{factory}: expected size in {tuple(sizes)}, got size={size!r}")
    base = sizes[size]
    known = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"{factory}: unknown config field(s) {unknown}; "
            f"{type(base).__name__} has {sorted(known)}"
        )
    return dataclasses.replace(base, **overrides)


class Init:
    """Initial arrays for a model: drawn from a seeded NumPy generator, or shapes only.

    With `abstract=True` every method returns a `jax.ShapeDtypeStruct`, so one init function
    serves tiny and 175B configs and real sizes never allocate. NumPy rather than `jax.random`
    because a jitted init spends seconds compiling threefry per draw (and an eager one compiles
    once per shape); building a small model should be instant.
    """

    def __init__(self, abstract: bool = False, dtype: str = "float32", seed: int = 0):
        self.abstract = abstract
        self.dtype = jnp.dtype(dtype)
        self._rng = np.random.default_rng(seed)

    def _make(self, shape: tuple[int, ...], dtype: Any, draw: Callable) -> Any:
        dtype = jnp.dtype(dtype or self.dtype)
        if self.abstract:
            return jax.ShapeDtypeStruct(tuple(shape), dtype)
        return jnp.asarray(draw(tuple(shape)), dtype)

    def normal(self, shape: tuple[int, ...], std: float = 1.0, dtype: Any = None) -> Any:
        return self._make(shape, dtype, lambda s: std * self._rng.standard_normal(s, np.float32))

    def uniform(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        return self._make(shape, dtype, lambda s: self._rng.random(s, np.float32))

    def randint(self, shape: tuple[int, ...], high: int) -> Any:
        """int32 ids uniform in [0, high)."""
        return self._make(shape, jnp.int32, lambda s: self._rng.integers(0, high, s, np.int32))

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        return self._make(shape, dtype, np.zeros)

    def ones(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        return self._make(shape, dtype, np.ones)

    def run(self, fn: Callable, *args: Any) -> Any:
        """`fn(*args)` jitted (one compile, not one per shape), or its shapes when abstract."""
        return jax.eval_shape(fn, *args) if self.abstract else jax.jit(fn)(*args)


def bind(fn: Callable, **static: Any) -> Callable:
    """`fn` with keyword config closed over, keeping its name for the UI.

    Not `functools.partial` (no `__name__`) nor `functools.wraps` (its `__wrapped__` would make
    `inspect.signature`, and so `jax.jit`, see the hidden keyword parameters).
    """

    def bound(*args):
        return fn(*args, **static)

    bound.__name__ = bound.__qualname__ = fn.__name__
    # Positional parameter names (params, opt_state, batch) name the traced values in the UI.
    sig = inspect.signature(fn)
    bound.__signature__ = sig.replace(
        parameters=[p for p in sig.parameters.values() if p.kind != p.KEYWORD_ONLY]
    )
    bound.__doc__ = fn.__doc__
    return bound
