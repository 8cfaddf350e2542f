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
    remat[blocks]=full  recompute remat group `blocks` fully (or `dots`, `dots_no_batch`, `none`)
    !remat[blocks]=full forbid that policy for the group

A value-dim reference pins the named dim that holds that dim once the pinned conflict options are
applied, so after cutting attention's sequence conflict, `q.1@model` pins the Q side only (see
`refs.py`). Forbids may be given among the pins (they start with `!`) or apart.

`constrain(space, pins)` checks them all against a decision space and returns `Constraints`: the
root state the search starts from and what it must never change or choose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from toast_core.analysis import Analysis
from toast_core.errors import PinError, bad_value
from toast_core.mesh import MeshSpec
from toast_core.strategy.refs import RefError, named_dim_parts
from toast_core.strategy.remat import POLICIES, policy_index
from toast_core.strategy.resolve import resolve
from toast_core.strategy.space import State, StrategySpace, space_of
from toast_core.strategy.strategy import Strategy

_OPTION = re.compile(r"^(!?)K(\d+)=(\d+|none)$")
_REMAT = re.compile(r"^(!?)remat\[([^\]]+)\]=(\w+)$")
_DIM = re.compile(r"^(!?)([^@]+)@([A-Za-z_]\w*(?:\+[A-Za-z_]\w*)*|-)$")


@dataclass(frozen=True, slots=True)
class Pin:
    """A parsed pin or forbid. `kind` is "dim", "option" or "remat" (`ref` the group, `policy`
    the policy); `text` is what the user wrote."""

    text: str
    kind: str
    forbid: bool
    ref: str = ""  # named dim or value-dim reference
    axes: tuple[str, ...] = ()
    conflict: int = -1
    option: int | None = None  # None with kind "option": leave unresolved
    policy: str = ""


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
    m = _REMAT.match(t)
    if m:
        if m.group(3) not in POLICIES:
            raise PinError(bad_value("pin", text, f"a remat policy: {', '.join(POLICIES)}"))
        return Pin(t, "remat", bool(m.group(1)), ref=m.group(2), policy=m.group(3))
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
            "N3@model, N3@data+model, N3@-, tokens.1@model, !N3@data, K2=1, K2=none, !K2=1 "
            "or remat[blocks]=full",
        )
    )


def parse_pins(items) -> tuple[Pin, ...]:
    """Parses pins and forbids (a text, a Pin, or an iterable of them)."""
    if items is None:
        return ()
    if isinstance(items, str | Pin):
        items = [items]
    return tuple(parse_pin(x) for x in items)


def dim_pin(ref: str, axes: tuple[str, ...] | str, forbid: bool = False) -> str:
    """The text of a pin (or forbid) of a named dim on mesh axes: `N3@data+model`, `N3@-`."""
    if isinstance(axes, str):
        axes = tuple(a for a in axes.split("+") if a and a != "-")
    return f"{'!' if forbid else ''}{ref}@{'+'.join(axes) or '-'}"


def option_pin(conflict: int, option: int | None, forbid: bool = False) -> str:
    """The text of a pin (or forbid) of a conflict option: `K2=1`, `K2=none`, `!K2=1`."""
    return f"{'!' if forbid else ''}K{conflict}={'none' if option is None else option}"


def strategy_pins(strategy: Strategy) -> list[str]:
    """A strategy's decisions written as pins (`K2=0`, then `N3@data+model`)."""
    return (
        [option_pin(k, o) for k, o in strategy.options]
        + [dim_pin(name, axes) for name, axes in strategy.shardings]
        + [remat_pin(group, policy) for group, policy in strategy.remat]
    )


def frozen_pins(ana: Analysis, strategy: Strategy) -> list[str]:
    """Pins that fix every decision of a strategy, the replicated, unresolved and keep-everything
    ones included (`N7@-`, `K3=none`, `remat[blocks]=none`), so that a search under them has
    nothing left to decide and stops at once."""
    from toast_core.strategy.remat import remat_space

    sharded = {name for name, _ in strategy.shardings}
    chosen = {k for k, _ in strategy.options}
    rematted = {g for g, _ in strategy.remat}
    return (
        strategy_pins(strategy)
        + [option_pin(c.id, None) for c in ana.conflicts if c.id not in chosen and c.options]
        + [dim_pin(d.name, ()) for d in strategy.resolution(ana).dims if d.name not in sharded]
        + [remat_pin(g, "none") for g in remat_space(ana).names if g not in rematted]
    )


def remat_pin(group: str, policy: str, forbid: bool = False) -> str:
    """The text of a remat pin (or forbid): `remat[blocks]=full`, `!remat[blocks]=dots`."""
    return f"{'!' if forbid else ''}remat[{group}]={policy}"


@dataclass(frozen=True)
class Constraints:
    """Pins and forbids applied to a decision space: where the search starts and what it may
    not change (pinned fine classes, fixed conflicts) or choose (forbidden axes and options)."""

    pins: tuple[Pin, ...]
    forbids: tuple[Pin, ...]
    root: State
    pinned_fines: frozenset[int]
    forbidden_axes: dict  # fine class -> forbidden mesh-axis bits
    fixed_conflicts: frozenset[int]
    forbidden_options: frozenset[tuple[int, int]]
    fixed_remat: frozenset[int] = frozenset()  # remat groups whose policy a pin fixes
    forbidden_remat: frozenset[tuple[int, int]] = frozenset()  # (group, policy index)

    def forbidden_bits(self, fines) -> int:
        """The mesh axes forbidden on any of these fine classes."""
        if not self.forbidden_axes:
            return 0
        out = 0
        for f in fines:
            out |= self.forbidden_axes.get(f, 0)
        return out

    def admits(self, state: State) -> bool:
        """Whether a state (e.g. a baseline's) honours every pin and forbid."""
        root = self.root
        chosen = set(state.options)
        if any(k in self.fixed_conflicts for k, o in chosen if (k, o) not in root.options):
            return False
        if chosen & self.forbidden_options or not set(root.options) <= chosen:
            return False
        remat = dict(state.remat)
        if any(remat.get(g, 0) != dict(root.remat).get(g, 0) for g in self.fixed_remat):
            return False
        if any(remat.get(g, 0) == p for g, p in self.forbidden_remat):
            return False
        fines = np.fromiter(self.pinned_fines, dtype=np.int64, count=len(self.pinned_fines))
        if len(fines) and np.any(state.masks[fines] != root.masks[fines]):
            return False
        return all(not (int(state.masks[f]) & bits) for f, bits in self.forbidden_axes.items())


def constrain(space: StrategySpace, pins=(), forbids=()) -> Constraints:
    """Checks pins and forbids against `space` and applies them; every error is a PinError that
    names the pin (unknown names, contradictions, illegal together)."""
    ana = space.ana
    parsed = parse_pins(pins)
    forbids = parse_pins(forbids)
    for f in forbids:
        if not f.forbid:
            raise PinError(f"`{f.text}` is a pin: pass it in pins (forbids start with !)")
    forbids = tuple(p for p in parsed if p.forbid) + forbids
    pins = tuple(p for p in parsed if not p.forbid)
    # Conflict options first: they decide which named dims exist.
    chosen: dict[int, tuple[int | None, Pin]] = {}
    for p in pins:
        if p.kind != "option":
            continue
        if p.conflict >= len(ana.conflicts):
            raise PinError(f"pin `{p.text}` names conflict K{p.conflict}, which does not exist")
        c = ana.conflicts[p.conflict]
        if p.option is not None and p.option >= len(c.options):
            raise PinError(f"pin `{p.text}`: conflict {c.name} has {len(c.options)} options")
        if c.id in chosen and chosen[c.id][0] != p.option:
            raise PinError(f"contradictory pins `{chosen[c.id][1].text}` and `{p.text}`")
        chosen[c.id] = (p.option, p)
    forbidden_options = set()
    for f in forbids:
        if f.kind != "option":
            continue
        if f.conflict >= len(ana.conflicts):
            raise PinError(f"forbid `{f.text}` names conflict K{f.conflict}, which does not exist")
        n = len(ana.conflicts[f.conflict].options)
        if f.option >= n:
            raise PinError(f"forbid `{f.text}`: conflict K{f.conflict} has {n} options")
        if f.conflict in chosen and chosen[f.conflict][0] == f.option:
            raise PinError(f"pin `{chosen[f.conflict][1].text}` contradicts forbid `{f.text}`")
        forbidden_options.add((f.conflict, f.option))
    root_options = tuple(sorted((k, o) for k, (o, _) in chosen.items() if o is not None))
    res = resolve(ana, root_options)
    masks = np.zeros(ana.n_fine, dtype=np.int64)
    owner: dict[int, Pin] = {}
    for p in pins:
        if p.kind != "dim":
            continue
        m = _mask(space, p)
        for f in _fines(ana, res, p):
            if f in owner and int(masks[f]) != m:
                raise PinError(f"contradictory pins `{owner[f].text}` and `{p.text}`")
            owner[f] = p
            masks[f] = m
    forbidden_axes: dict[int, int] = {}
    for fb in forbids:
        if fb.kind != "dim":
            continue
        bit = _mask(space, fb)
        for f in _fines(ana, res, fb):
            if f in owner and int(masks[f]) & bit:
                raise PinError(f"pin `{owner[f].text}` contradicts forbid `{fb.text}`")
            forbidden_axes[f] = forbidden_axes.get(f, 0) | bit
    root_remat, fixed_remat, forbidden_remat = _remat_constraints(space, pins, forbids)
    root = State(root_options, masks, root_remat)
    problems = space.problems(tuple(sorted(space.shardings_of(root).items())), root_options)
    if problems:
        texts = ", ".join(f"`{p.text}`" for p in pins)
        shown = "; ".join(problems[:6]) + (
            f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
        )
        raise PinError(f"pins {texts} are impossible together: illegal strategy: {shown}")
    return Constraints(
        pins,
        forbids,
        root,
        frozenset(owner),
        forbidden_axes,
        frozenset(chosen),
        frozenset(forbidden_options),
        fixed_remat,
        forbidden_remat,
    )


def _remat_constraints(space: StrategySpace, pins, forbids):
    """(root remat pairs, pinned groups, forbidden (group, policy) pairs) of the remat pins."""
    chosen: dict[int, Pin] = {}
    forbidden: dict[tuple[int, int], Pin] = {}
    for p in list(pins) + list(forbids):
        if p.kind != "remat":
            continue
        g = space.remat.index(p.ref)
        if g is None:
            what = "forbid" if p.forbid else "pin"
            names = ", ".join(space.remat.names) or "none (no backward part to recompute)"
            raise PinError(f"{what} `{p.text}` names remat group {p.ref!r}; groups: {names}")
        pol = policy_index(p.policy)
        if p.forbid:
            forbidden[(g, pol)] = p
        elif g in chosen and chosen[g].policy != p.policy:
            raise PinError(f"contradictory pins `{chosen[g].text}` and `{p.text}`")
        else:
            chosen[g] = p
    for (g, pol), f in forbidden.items():
        if g in chosen and policy_index(chosen[g].policy) == pol:
            raise PinError(f"pin `{chosen[g].text}` contradicts forbid `{f.text}`")
    root = tuple(
        sorted((g, policy_index(p.policy)) for g, p in chosen.items() if p.policy != "none")
    )
    return root, frozenset(chosen), frozenset(forbidden)


def _mask(space: StrategySpace, p: Pin) -> int:
    what = "pin" if not p.forbid else "forbid"
    for a in p.axes:
        if a not in space.axes.names:
            raise PinError(f"{what} `{p.text}`: {a!r} is not a mesh axis of {space.mesh}")
    return space.axes.mask(p.axes)


def _fines(ana: Analysis, res, p: Pin) -> tuple[int, ...]:
    try:
        parts = named_dim_parts(ana, res, p.ref)
    except RefError as exc:
        raise PinError(bad_value("pin", p.text, exc.expected)) from None
    return tuple(f for d in parts for f in d.fine)


def check_pins(ana: Analysis, mesh: MeshSpec, pins=(), forbids=()) -> Strategy:
    """Checks pins and forbids without searching; returns the pinned starting strategy.

    Raises `PinError` naming the pin when one cannot be parsed, names nothing, or contradicts
    another pin, a forbid, or the mesh (divisibility, a mesh axis held twice).
    """
    space = space_of(ana, mesh)
    return Strategy.from_state(space, constrain(space, pins, forbids).root, "pins")
