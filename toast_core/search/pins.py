"""Pins and forbids: decisions the user fixes or excludes before the search.

One small syntax, shared by the API, the CLI and the explorer:

    N3@model            shard named dim N3 on mesh axis `model` (exactly these axes)
    N3@data+model       on both axes (major first)
    N3@-                keep N3 replicated
    tokens.1@model      the named dim holding dim 1 of the value `tokens` (any value or pytree
                        path: `params.blocks[0].mlp.w_fc.1`; `:k` picks sub-factor k of a split dim)
    !N3@data            forbid N3 (and every part of it after cuts) on `data`
    K2=1                resolve conflict K2 with its option 1
    K2=none             leave conflict K2 unresolved
    !K2=1               forbid option 1 of K2

A value-dim reference pins the named dim that holds that dim once the pinned conflict options are
applied, so after cutting attention's sequence conflict, `q.1@model` pins the Q side only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toast_core.analysis import Analysis
from toast_core.errors import PinError, StrategyError, bad_value

_OPTION = re.compile(r"^(!?)K(\d+)=(\d+|none)$")
_DIM = re.compile(r"^(!?)([^@]+)@([A-Za-z_]\w*(?:\+[A-Za-z_]\w*)*|-)$")


@dataclass(frozen=True, slots=True)
class Pin:
    """A parsed pin or forbid. `kind` is "dim" or "option"; `text` is what the user wrote."""

    text: str
    kind: str
    forbid: bool
    ref: str = ""  # named dim or value-dim reference
    axes: tuple[str, ...] = ()
    conflict: int = -1
    option: int | None = None  # None with kind "option": leave unresolved


def parse_pin(text: str) -> Pin:
    """Parses one pin or forbid (see the module docstring); errors name the text."""
    if isinstance(text, Pin):
        return text
    if not isinstance(text, str) or not text.strip():
        raise PinError(bad_value("pin", text, "a pin such as N3@model, !N3@data or K2=1"))
    t = text.strip().replace(" ", "")
    m = _OPTION.match(t)
    if m:
        option = None if m.group(3) == "none" else int(m.group(3))
        if m.group(1) and option is None:
            raise PinError(bad_value("pin", text, "a forbid of one option, such as !K2=1"))
        return Pin(t, "option", bool(m.group(1)), conflict=int(m.group(2)), option=option)
    m = _DIM.match(t)
    if m:
        axes = () if m.group(3) == "-" else tuple(m.group(3).split("+"))
        if m.group(1) and len(axes) != 1:
            raise PinError(bad_value("pin", text, "a forbid of one mesh axis, such as !N3@data"))
        return Pin(t, "dim", bool(m.group(1)), ref=m.group(2), axes=axes)
    raise PinError(
        bad_value(
            "pin",
            text,
            "N3@model, N3@data+model, N3@-, tokens.1@model, !N3@data, K2=1, K2=none or !K2=1",
        )
    )


def parse_pins(items) -> tuple[Pin, ...]:
    if items is None:
        return ()
    if isinstance(items, str | Pin):
        items = [items]
    return tuple(parse_pin(x) for x in items)


def reference_fines(ana: Analysis, ref: str, options, pin_text: str) -> tuple[int, ...]:
    """Fine classes of the named dim a pin refers to (under the pinned options)."""
    from toast_core.strategy import resolve

    res = resolve(ana, options)
    if re.fullmatch(r"N\d+", ref):
        base = int(ref[1:])
        if base >= len(ana.named_dims):
            raise PinError(
                bad_value("pin", pin_text, f"a named dim N0..N{len(ana.named_dims) - 1}")
            )
        return tuple(f for d in res.dims if d.parent == base for f in d.fine)
    if re.fullmatch(r"N\d+\.\d+", ref):
        try:
            return res.by_name(ref).fine
        except StrategyError:
            raise PinError(
                bad_value("pin", pin_text, "a named dim part that exists under the pinned options")
            ) from None
    for nd in ana.named_dims:
        if nd.label == ref:
            return tuple(f for d in res.dims if d.parent == nd.id for f in d.fine)
    m = re.fullmatch(r"(.+)\.(\d+)(?::(\d+))?", ref)
    if m:
        name, dim, sub = m.group(1), int(m.group(2)), int(m.group(3) or 0)
        for v in _values_named(ana, name, pin_text):
            atoms = ana.nda.value_atoms[v.id]
            if dim >= len(atoms) or sub >= len(atoms[dim]):
                raise PinError(
                    bad_value("pin", pin_text, f"a dim of {v.display()} that can be sharded")
                )
            fine = int(ana.fine_of_atom[atoms[dim][sub]])
            return res.dims[int(res.fine_to_dim[fine])].fine
    raise PinError(
        bad_value("pin", pin_text, "a named dim (N3), a label, or a value dim such as tokens.1")
    )


def _values_named(ana: Analysis, name: str, pin_text: str) -> list:
    """The value a pin names: by its full name or output name, else by a unique trailing part of
    an input's pytree path (`tokens` for `batch.tokens`, `w_fc` is ambiguous across layers)."""
    values = ana.program.values
    exact = [v for v in values if v.name == name or v.output_name == name]
    if exact:
        return exact[:1]
    inputs = [values[i] for i in ana.program.inputs]
    tail = [v for v in inputs if v.name.endswith("." + name) or v.name.endswith("]" + name)]
    if len(tail) > 1:
        shown = ", ".join(v.name for v in tail[:4]) + (", ..." if len(tail) > 4 else "")
        raise PinError(
            bad_value("pin", pin_text, f"a unique value name (`{name}` matches {shown})")
        )
    return tail
