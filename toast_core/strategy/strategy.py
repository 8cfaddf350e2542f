"""`Strategy`: a complete set of decisions - conflict options (cuts) and named dim -> mesh axes.

A strategy is frozen and hashable; it refers to an `Analysis` by named dim names (`N3`, or `N3.1`
after a cut) and conflict ids. `validate` checks it against an analysis and a mesh and reports every
problem at once: unknown names, unknown or repeated mesh axes, sizes not divisible by the mesh axes,
and any value or op that would hold one mesh axis twice (an unresolved self-conflict or axis clash).

Shardings are written in the scaling-book notation: `W[N0, N1_model]` is W with the dim of named dim
N1 sharded on mesh axis `model`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from toast_core.analysis import Analysis
from toast_core.errors import StrategyError, bad_value, bad_values
from toast_core.mesh import MeshSpec
from toast_core.strategy.refs import RefError, named_dim_parts
from toast_core.strategy.remat import POLICIES, policy_index, remat_space
from toast_core.strategy.resolve import Resolution, normalize_options, resolve
from toast_core.strategy.space import State, StrategySpace, space_of

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Strategy:
    """Cuts (as chosen conflict options) plus named dim -> tuple of mesh axes, plus a remat
    policy per remat group (`(("blocks", "full"),)`; groups left out keep everything)."""

    shardings: tuple[tuple[str, tuple[str, ...]], ...] = ()
    options: tuple[tuple[int, int], ...] = ()
    name: str = ""
    remat: tuple[tuple[str, str], ...] = ()

    # -- construction ---------------------------------------------------------------------------

    @staticmethod
    def make(
        ana: Analysis,
        shardings: Mapping | None = None,
        options=(),
        name: str = "",
        remat: Mapping | None = None,
    ) -> Strategy:
        """Builds a strategy, accepting named dims by name (`N3`, `N3.1`), id or label and mesh
        axes as a string or a tuple; `remat` maps remat group names to `none`/`dots`/`full`."""
        opts = normalize_options(ana, options)
        res = resolve(ana, opts)
        out: dict[str, tuple[str, ...]] = {}
        problems: list[str] = []
        unknown: list = []  # summarized in one problem, not one line each
        for key, axes in (shardings or {}).items():
            try:
                dim_names = _dim_names(ana, res, key)
            except StrategyError:
                unknown.append(key)
                continue
            if isinstance(axes, str):
                axes = (axes,)
            axes = tuple(axes or ())
            if not all(isinstance(a, str) for a in axes):
                problems.append(bad_value(f"shardings[{key}]", axes, "mesh axis names"))
                continue
            if axes:
                out.update((n, axes) for n in dim_names)
        remat_items = _remat_items(ana, remat, problems)
        if unknown:
            expected = (
                f"named dims N0..N{len(ana.named_dims) - 1} (or parts such as N3.1 after the "
                "chosen cuts), ids or labels"
            )
            problems.insert(0, bad_values("shardings", unknown, expected))
        if problems:
            more = f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
            raise StrategyError("; ".join(problems[:6]) + more)
        return Strategy(tuple(sorted(out.items())), opts, name, remat_items)

    def with_name(self, name: str) -> Strategy:
        return Strategy(self.shardings, self.options, name, self.remat)

    def with_remat(self, ana: Analysis, remat: Mapping | str | None) -> Strategy:
        """The same sharding with other remat policies: a mapping group -> policy, or one
        policy for every remat group of `ana` (`"full"`, `"none"`)."""
        if isinstance(remat, str):
            remat = dict.fromkeys(remat_space(ana).names, remat)
        problems: list[str] = []
        items = _remat_items(ana, remat, problems)
        if problems:
            raise StrategyError("; ".join(problems))
        return Strategy(self.shardings, self.options, self.name, items)

    def remat_policy(self, group: str) -> str:
        return dict(self.remat).get(group, "none")

    # -- queries --------------------------------------------------------------------------------

    def axes_of(self, dim_name: str) -> tuple[str, ...]:
        for n, axes in self.shardings:
            if n == dim_name:
                return axes
        return ()

    def resolution(self, ana: Analysis) -> Resolution:
        return resolve(ana, self.options)

    def fine_masks(self, ana: Analysis, mesh: MeshSpec) -> np.ndarray:
        """Mesh-axis bitmask per fine class (bit i = mesh axis i); validates first."""
        self.validate(ana, mesh)
        return space_of(ana, mesh).masks_of(self.shardings, self.options)

    def validate(self, ana: Analysis, mesh: MeshSpec) -> None:
        """Raises one StrategyError listing every problem (all of them, not just the first)."""
        problems = space_of(ana, mesh).problems(self.shardings, self.options, self.name)
        if problems:
            shown = "; ".join(problems[:6])
            more = f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
            which = f"illegal strategy {self.name!r}" if self.name else "illegal strategy"
            raise StrategyError(f"{which}: {shown}{more}")

    @staticmethod
    def from_state(space: StrategySpace, state: State, name: str = "") -> Strategy:
        """The strategy of a search state (already legal by construction)."""
        shardings = tuple(sorted(space.shardings_of(state).items()))
        remat = tuple(
            (space.remat.groups[g].name, POLICIES[p])
            for g, p in state.remat
            if POLICIES[p] != "none"
        )
        return Strategy(
            shardings, normalize_options(space.ana, state.options), name, tuple(sorted(remat))
        )

    def to_state(self, space: StrategySpace) -> State:
        """The search state of this strategy (names checked, legality not)."""
        remat = tuple(
            sorted((space.remat.index(g), policy_index(p)) for g, p in self.remat if p != "none")
        )
        return State(tuple(self.options), space.masks_of(self.shardings, self.options), remat)

    # -- presentation ---------------------------------------------------------------------------

    def value_axes(
        self, ana: Analysis, mesh: MeshSpec, value_id: int
    ) -> tuple[tuple[str, ...], ...]:
        """Mesh axes of each dim of a value (major sub-factors first)."""
        space = space_of(ana, mesh)
        return space.value_axes(space.masks_of(self.shardings, self.options), value_id)

    def notation_of(self, ana: Analysis, mesh: MeshSpec, value_id: int) -> str:
        """`params.w1[N0, N1_model]` - named dims with their mesh axes as subscripts."""
        space = space_of(ana, mesh)
        masks = space.masks_of(self.shardings, self.options)
        return space.notation(masks, self.resolution(ana), value_id)

    def value_layouts(
        self, ana: Analysis, mesh: MeshSpec, value_ids
    ) -> list[tuple[tuple[tuple[str, ...], ...], str]]:
        """(`value_axes`, `notation_of`) of each value: for many values at once, the masks are
        computed once (each single call recomputes them: ~3 ms on llama3-70b)."""
        space = space_of(ana, mesh)
        masks = space.masks_of(self.shardings, self.options)
        res = self.resolution(ana)
        return [(space.value_axes(masks, v), space.notation(masks, res, v)) for v in value_ids]

    def describe(self, ana: Analysis, mesh: MeshSpec) -> list[str]:
        """One line per program input and output in scaling-book notation."""
        prog = ana.program
        return [self.notation_of(ana, mesh, vid) for vid in prog.inputs + prog.outputs]

    # -- JSON -----------------------------------------------------------------------------------

    def to_json(self, mesh: MeshSpec | None = None, program: str = "") -> str:
        doc = {
            "schema": SCHEMA_VERSION,
            "name": self.name,
            "program": program,
            "options": [{"conflict": f"K{k}", "option": o} for k, o in self.options],
            "shardings": {n: list(axes) for n, axes in self.shardings},
        }
        if self.remat:
            doc["remat"] = dict(self.remat)
        if mesh is not None:
            doc["mesh"] = mesh.as_dict()
        return json.dumps(doc, indent=2)

    @staticmethod
    def from_json(text: str, ana: Analysis) -> Strategy:
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, TypeError) as exc:
            raise StrategyError(
                bad_value("text", str(text)[:60], f"strategy JSON ({exc})")
            ) from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_VERSION:
            got = doc.get("schema") if isinstance(doc, dict) else doc
            raise StrategyError(bad_value("schema", got, f"schema version {SCHEMA_VERSION}"))
        try:
            options = [(item["conflict"], int(item["option"])) for item in doc.get("options", [])]
            shardings = {
                k: (v,) if isinstance(v, str) else tuple(v)
                for k, v in doc.get("shardings", {}).items()
            }
            remat = dict(doc.get("remat", {}))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StrategyError(
                bad_value("text", str(exc), "options and shardings fields")
            ) from None
        return Strategy.make(ana, shardings, options, str(doc.get("name", "")), remat)


def _dim_names(ana: Analysis, res: Resolution, key) -> tuple[str, ...]:
    """The named dims (after cuts) a `shardings` key refers to (see `refs.named_dim_parts`)."""
    try:
        return tuple(d.name for d in named_dim_parts(ana, res, key))
    except RefError as exc:
        raise StrategyError(bad_value("shardings", key, exc.expected)) from None


def _remat_items(ana: Analysis, remat, problems: list[str]) -> tuple[tuple[str, str], ...]:
    """Sorted (group, policy) pairs of a remat mapping, `none` left out; problems appended."""
    if not remat:
        return ()
    if not isinstance(remat, Mapping):
        problems.append(bad_value("remat", remat, "a mapping of remat group -> policy"))
        return ()
    names = remat_space(ana).names
    out = {}
    for group, policy in remat.items():
        if group not in names:
            shown = ", ".join(names) or "none: this program has no backward part to recompute"
            problems.append(bad_value("remat", group, f"a remat group ({shown})"))
        elif policy not in POLICIES:
            problems.append(bad_value(f"remat[{group}]", policy, f"one of {', '.join(POLICIES)}"))
        elif policy != "none":
            out[group] = policy
    return tuple(sorted(out.items()))
