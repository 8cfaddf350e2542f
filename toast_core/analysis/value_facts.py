"""The per-value fields the analysis reads, as arrays, gathered in one pass over the values.

Named dims (labels, bytes, persistence), axis clashes (outputs, persistent values) and layer
signatures (shape, dtype, role) all read a few fields of every value. Read one value at a time
(a property call, a tuple hash), that is tens of milliseconds at 20k equations; read here once,
with values of one shape and dtype sharing one label and one byte count, it is a few.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from operator import attrgetter

import numpy as np

from toast_core.ir.program import ROLES, Program, dtype_itemsize

#: `role` codes: the index of the role in `ROLES`; anything else gets `len(ROLES)`.
_ROLE_CODE = {r: i for i, r in enumerate(ROLES)}


@dataclass(frozen=True)
class ValueFacts:
    role: np.ndarray  # [values] role code: index into `ROLES` (len(ROLES) if unknown)
    is_output: np.ndarray  # [values] bool
    nbytes: np.ndarray  # [values] int64
    shape_label: np.ndarray  # [values] uint64: dense id of (shape, dtype), in first-seen order

    def role_table(self, table: dict[str, int], default: int) -> np.ndarray:
        """[values] `table[role]` (`default` for roles not in it)."""
        lookup = np.array([table.get(r, default) for r in ROLES] + [default], dtype=np.int64)
        return lookup[self.role]


def value_facts(program: Program) -> ValueFacts:
    values = program.values
    n = len(values)
    role = np.fromiter(
        map(_ROLE_CODE.get, map(attrgetter("role"), values), [len(ROLES)] * n),
        dtype=np.int64,
        count=n,
    )
    is_output = np.fromiter(
        (name is not None for name in map(attrgetter("output_name"), values)), dtype=bool, count=n
    )
    ids: dict = {}
    keys = zip(map(attrgetter("shape"), values), map(attrgetter("dtype"), values))
    label = np.fromiter((ids.setdefault(k, len(ids)) for k in keys), dtype=np.int64, count=n)
    per_label = np.array(
        [prod(shape) * dtype_itemsize(dtype) for shape, dtype in ids], dtype=np.int64
    ).reshape(-1)
    return ValueFacts(role, is_output, per_label[label], label.astype(np.uint64))
