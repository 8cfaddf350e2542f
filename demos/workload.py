"""A `Workload`: one JAX function plus example arguments, the unit the explorer shards.

Small sizes carry concrete arrays so the program can run and be checked numerically; real sizes
carry `jax.ShapeDtypeStruct` pytrees so a 175B-parameter model can be traced without allocating.
The helpers below let each model file build both from one init function via `jax.eval_shape`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class Workload:
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
        keys = jax.random.split(jax.random.PRNGKey(seed), max(len(paths_leaves), 1))
        bounds = self.int_bounds or {}
        leaves = [
            _random_leaf(k, leaf, bounds.get(_last_key(path), 2))
            for k, (path, leaf) in zip(keys, paths_leaves)
        ]
        return jax.tree.unflatten(treedef, leaves)


def _last_key(path: tuple) -> str:
    if not path:
        return ""
    k = path[-1]
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def _random_leaf(key: jax.Array, leaf: Any, int_bound: int) -> jax.Array:
    dtype = jnp.dtype(leaf.dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return (0.02 * jax.random.normal(key, leaf.shape, jnp.float32)).astype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jax.random.randint(key, leaf.shape, 0, int_bound, dtype)
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


def build(init: Callable[[jax.Array], Any], abstract: bool, seed: int = 0) -> Any:
    """`init(PRNGKey(seed))`, or only its shapes when `abstract` (real sizes never allocate).

    Jitted when concrete: run eagerly, each random draw of a new shape compiles on its own,
    which made small inits take seconds.
    """
    key = jax.random.PRNGKey(seed)
    return jax.eval_shape(init, key) if abstract else jax.jit(init)(key)


def bind(fn: Callable, **static: Any) -> Callable:
    """`fn` with keyword config closed over, keeping its name for the UI.

    Not `functools.partial` (no `__name__`) nor `functools.wraps` (its `__wrapped__` would make
    `inspect.signature`, and so `jax.jit`, see the hidden keyword parameters).
    """

    def bound(*args):
        return fn(*args, **static)

    bound.__name__ = bound.__qualname__ = fn.__name__
    bound.__doc__ = fn.__doc__
    return bound
