"""Shared test helpers: find values and named dims of an analysis by name."""

from __future__ import annotations

import toast_core as tc


def value_id(ana: tc.Analysis, name: str) -> int:
    """Id of the value with this pytree-path or output name."""
    for v in ana.program.values:
        if v.name == name or v.output_name == name:
            return v.id
    raise AssertionError(f"no value {name}")


def dim_name(ana: tc.Analysis, value: str, dim: int) -> str:
    """Name of the (uncut) named dim holding dim `dim` of `value`."""
    (d,) = ana.value_named_dims(value_id(ana, value))[dim]
    return f"N{d}"
