"""References to named dims, as users write them, resolved in one place.

Strategies (`Strategy.make`, JSON) and pins accept the same references:

    3, "N3"           named dim N3: all its parts after the chosen cuts
    "N3.1"            part 1 of N3 after the cuts
    "1024 (x.1)"      a named dim by its label
    "tokens.1"        the named dim holding dim 1 of the value `tokens` (any value name or pytree
                      path, `params.blocks[0].mlp.w_fc.1`; `:k` picks sub-factor k of a split dim)

A value-dim reference names the part that holds that dim under the chosen options, so after
cutting attention's sequence conflict `q.1` is the Q side only.
"""

from __future__ import annotations

import re

import numpy as np

from toast_core.analysis import Analysis
from toast_core.errors import StrategyError
from toast_core.strategy.resolve import Resolution, ResolvedDim


def parent_name(dim_name: str) -> str:
    """The named dim a part belongs to: `N3.1` -> `N3` (a whole named dim is its own parent)."""
    return dim_name.split(".", 1)[0]


class RefError(Exception):
    """A reference that names nothing; `expected` says what would have been accepted."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


def named_dim_parts(ana: Analysis, res: Resolution, ref) -> tuple[ResolvedDim, ...]:
    """The named dims (after the cuts of `res`) that `ref` refers to; raises RefError."""
    if isinstance(ref, int | np.integer) and not isinstance(ref, bool):
        ref = f"N{int(ref)}"
    if not isinstance(ref, str):
        raise RefError("a named dim name (N3, or N3.1 after a cut), id, label or value dim")
    if re.fullmatch(r"N\d+", ref):
        base = int(ref[1:])
        if base >= len(ana.named_dims):
            raise RefError(f"a named dim N0..N{len(ana.named_dims) - 1}")
        return res.parts(base)
    if re.fullmatch(r"N\d+\.\d+", ref):
        try:
            return (res.by_name(ref),)
        except StrategyError:
            raise RefError("a named dim part that exists under the chosen options") from None
    for nd in ana.named_dims:
        if nd.label == ref:
            return res.parts(nd.id)
    m = re.fullmatch(r"(.+)\.(\d+)(?::(\d+))?", ref)
    if m:
        name, dim, sub = m.group(1), int(m.group(2)), int(m.group(3) or 0)
        for v in _values_named(ana, name):
            atoms = ana.nda.value_atoms[v.id]
            if dim >= len(atoms) or sub >= len(atoms[dim]):
                raise RefError(f"a dim of {v.display()} that can be sharded")
            fine = int(ana.fine_of_atom[atoms[dim][sub]])
            return (res.dims[int(res.fine_to_dim[fine])],)
    raise RefError("a named dim (N3), a label, or a value dim such as tokens.1")


def _values_named(ana: Analysis, name: str) -> list:
    """The value a reference names: by its full name or output name, else by a unique trailing
    part of an input's pytree path (`tokens` for `batch.tokens`; `w_fc` is ambiguous across
    layers)."""
    values = ana.program.values
    exact = [v for v in values if v.name == name or v.output_name == name]
    if exact:
        return exact[:1]
    inputs = [values[i] for i in ana.program.inputs]
    tail = [v for v in inputs if v.name.endswith("." + name) or v.name.endswith("]" + name)]
    if len(tail) > 1:
        shown = ", ".join(v.name for v in tail[:4]) + (", ..." if len(tail) > 4 else "")
        raise RefError(f"a unique value name (`{name}` matches {shown})")
    return tail
