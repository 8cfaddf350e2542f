"""Our own IR: a frozen, JAX-free, straight-line program of values and ops.

`trace` (the only module that touches jaxpr objects) produces a `Program`; everything downstream
(analysis, cost, search, the explorer) reads this IR only. Nested calls (`jit`, `custom_jvp_call`,
`remat`...) are inlined, keeping the call name in `Op.call_path` for display. Regions (`scan`,
`while`, `cond`) are flattened into a `*_start` op, the body ops (with a `trip_count` multiplier for
cost), and a `*_end` op, whose factor rules link the region's carries and slices to its outer
operands and results.

Shapes are written `[B, S, D]`; a value's `name` comes from its pytree path when it is an input or
output (`params.blocks[3].attn.wq`), otherwise from its defining primitive (`dot_general#42`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, cached_property
from math import prod

import numpy as np

#: Value roles. Persistent values (parameters, optimizer state) are what FSDP/ZeRO shard.
ROLES = ("input", "parameter", "state", "constant", "literal", "intermediate")


@cache
def dtype_itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (`float32`, `bfloat16`, `int32`, `bool`, ...)."""
    if dtype in ("bool", "pred"):
        return 1
    if dtype in ("key<fry>", "key"):
        return 8
    if dtype.startswith("key<"):  # rbg and unsafe_rbg keys are four uint32 words
        return 16
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        import ml_dtypes  # bfloat16, float8 variants

        return int(np.dtype(getattr(ml_dtypes, dtype)).itemsize)


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value: input, parameter, constant, intermediate or output."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    role: str
    name: str
    source: str = ""
    output_name: str | None = None
    updates: int | None = None  # an output: the persistent input it replaces (same path, shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * dtype_itemsize(self.dtype)

    @property
    def is_output(self) -> bool:
        return self.output_name is not None

    @property
    def is_persistent(self) -> bool:
        """Parameters and optimizer state live across steps (what FSDP/ZeRO shard)."""
        return self.role in ("parameter", "state")

    def display(self) -> str:
        return f"{self.name}{list(self.shape)}"


@dataclass(frozen=True, slots=True)
class Op:
    """One primitive application. `operands`/`results` are value ids."""

    index: int
    primitive: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    params: tuple[tuple[str, object], ...] = ()
    source: str = ""
    name_stack: str = ""
    call_path: tuple[str, ...] = ()
    trip_count: int = 1
    region_depth: int = 0

    def param(self, key: str, default: object = None) -> object:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def where(self) -> str:
        """Human location: `dot_general at model.py:42`."""
        call = f" in {'/'.join(self.call_path)}" if self.call_path else ""
        loc = f" at {self.source}" if self.source else ""
        return f"{self.primitive}{call}{loc}"


@dataclass(frozen=True)
class Program:
    """A traced program. `inputs`/`outputs` are value ids in flattened pytree order."""

    name: str
    values: tuple[Value, ...]
    ops: tuple[Op, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    diagnostics: tuple[str, ...] = ()
    # Opaque handle back to the traced JAX objects (used only by toast_core.apply to re-run the
    # program with sharding constraints). Excluded from equality and hashing.
    handle: object = field(default=None, compare=False, hash=False, repr=False)

    @property
    def n_tensor_dims(self) -> int:
        """Number of (value, dim) pairs: the size of the naive per-tensor decision space."""
        return sum(v.rank for v in self.values if v.role != "literal")

    def value(self, value_id: int) -> Value:
        return self.values[value_id]

    def uses(self) -> list[list[tuple[int, int]]]:
        """For each value id, the (op index, operand position) pairs that use it."""
        return self._uses

    @cached_property
    def _uses(self) -> list[list[tuple[int, int]]]:
        out: list[list[tuple[int, int]]] = [[] for _ in self.values]
        for op in self.ops:
            for pos, vid in enumerate(op.operands):
                out[vid].append((op.index, pos))
        return out

    def producers(self) -> list[int | None]:
        """For each value id, the index of the op defining it (None for inputs and constants)."""
        return self._producers

    @cached_property
    def _producers(self) -> list[int | None]:
        out: list[int | None] = [None] * len(self.values)
        for op in self.ops:
            for vid in op.results:
                out[vid] = op.index
        return out
