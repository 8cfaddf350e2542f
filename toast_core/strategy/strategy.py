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
from toast_core.strategy.layout import double_axis_slots, layout, strided_dims
from toast_core.strategy.resolve import Resolution, normalize_options, resolve

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Strategy:
    """Cuts (as chosen conflict options) plus named dim -> tuple of mesh axes."""

    shardings: tuple[tuple[str, tuple[str, ...]], ...] = ()
    options: tuple[tuple[int, int], ...] = ()
    name: str = ""

    # -- construction ---------------------------------------------------------------------------

    @staticmethod
    def make(
        ana: Analysis,
        shardings: Mapping | None = None,
        options=(),
        name: str = "",
    ) -> Strategy:
        """Builds a strategy, accepting named dims by name (`N3`, `N3.1`), id or label and mesh
        axes as a string or a tuple."""
        opts = normalize_options(ana, options)
        res = resolve(ana, opts)
        out: dict[str, tuple[str, ...]] = {}
        problems: list[str] = []
        unknown: list = []  # summarized in one problem, not one line each
        for key, axes in (shardings or {}).items():
            try:
                dim_name = _dim_name(ana, res, key)
            except StrategyError:
                unknown.append(key)
                continue
            if isinstance(axes, str):
                axes = (axes,)
            axes = tuple(axes or ())
            if not all(isinstance(a, str) for a in axes):
                problems.append(bad_value(f"shardings[{dim_name}]", axes, "mesh axis names"))
                continue
            if axes:
                out[dim_name] = axes
        if unknown:
            expected = (
                f"named dims N0..N{len(ana.named_dims) - 1} (or parts such as N3.1 after the "
                "chosen cuts), ids or labels"
            )
            problems.insert(0, bad_values("shardings", unknown, expected))
        if problems:
            more = f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
            raise StrategyError("; ".join(problems[:6]) + more)
        return Strategy(tuple(sorted(out.items())), opts, name)

    def with_name(self, name: str) -> Strategy:
        return Strategy(self.shardings, self.options, name)

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
        return self._masks(ana, mesh)

    def _masks(self, ana: Analysis, mesh: MeshSpec) -> np.ndarray:
        res = self.resolution(ana)
        masks = np.zeros(ana.n_fine, dtype=np.int64)
        index = {a: i for i, a in enumerate(mesh.axis_names)}
        for dim_name, axes in self.shardings:
            m = 0
            for a in axes:
                m |= 1 << index[a]
            for f in res.by_name(dim_name).fine:
                masks[f] = m
        return masks

    def validate(self, ana: Analysis, mesh: MeshSpec) -> None:
        """Raises one StrategyError listing every problem (all of them, not just the first)."""
        key = ("valid", self, mesh)
        if ana.cache.get(key):
            return
        problems: list[str] = []
        try:
            res = self.resolution(ana)
        except StrategyError as exc:
            raise StrategyError(f"strategy {self.name or ''}: {exc}") from None
        names = {d.name for d in res.dims}
        well_formed = []  # entries whose own names and axes are fine, checked together below
        for dim_name, axes in self.shardings:
            if dim_name not in names:
                problems.append(
                    bad_value("named dim", dim_name, "a named dim after the chosen cuts")
                )
                continue
            unknown = [a for a in axes if a not in mesh.axis_names]
            if unknown:
                problems.append(
                    bad_value(f"shardings[{dim_name}]", unknown[0], f"a mesh axis of {mesh}")
                )
                continue
            if len(set(axes)) != len(axes):
                problems.append(bad_value(f"shardings[{dim_name}]", axes, "distinct mesh axes"))
                continue
            size = res.by_name(dim_name).size
            ways = int(np.prod([mesh.size(a) for a in axes]))
            if size % ways:
                problems.append(
                    f"named dim {dim_name} of size {size} is not divisible by mesh axes "
                    f"{'x'.join(axes)} ({ways} ways)"
                )
                continue
            well_formed.append((dim_name, axes))
        # Clashes between entries are checked on the well-formed ones, so that one error lists
        # every problem rather than only the first kind found.
        partial = Strategy(tuple(well_formed), self.options, self.name)
        problems += partial._double_axis_problems(ana, mesh)
        if problems:
            shown = "; ".join(problems[:6])
            more = f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""
            which = f"illegal strategy {self.name!r}" if self.name else "illegal strategy"
            raise StrategyError(f"{which}: {shown}{more}")
        ana.cache[key] = True

    def _double_axis_problems(self, ana: Analysis, mesh: MeshSpec) -> list[str]:
        masks = self._masks(ana, mesh)
        lay = layout(ana)
        problems = []
        for row, a in double_axis_slots(lay.value_fine, masks, len(mesh.axis_names))[:3]:
            v = ana.program.values[row]
            problems.append(
                f"value {v.display()} would hold mesh axis {mesh.axis_names[a]!r} twice "
                f"({self.notation_of(ana, mesh, row)}): resolve its conflict or choose another axis"
            )
        if not problems:
            ways = _mask_ways(mesh)
            for vid, d in strided_dims(lay, masks, ana.fine_size, ways)[:3]:
                v = ana.program.values[vid]
                problems.append(
                    f"value {v.display()} dim {d} would shard a minor sub-factor while its major "
                    f"one is whole ({self.notation_of(ana, mesh, vid)}): a strided layout"
                )
        if not problems:
            for row, a in double_axis_slots(lay.use_fine, masks, len(mesh.axis_names))[:3]:
                opi, pos = lay.use_keys[row]
                op = ana.program.ops[opi]
                v = ana.program.values[op.operands[pos]]
                problems.append(
                    f"{op.where()} would read {v.display()} with mesh axis "
                    f"{mesh.axis_names[a]!r} on two dims: resolve the conflict there or choose "
                    "another axis"
                )
        return problems

    # -- presentation ---------------------------------------------------------------------------

    def value_axes(
        self, ana: Analysis, mesh: MeshSpec, value_id: int
    ) -> tuple[tuple[str, ...], ...]:
        """Mesh axes of each dim of a value (major sub-factors first)."""
        masks = self._masks(ana, mesh)
        dims = layout(ana).value_dim_fine[value_id]
        return tuple(_axes_of_fines(dims[d], masks, mesh) for d in range(len(dims)))

    def notation_of(self, ana: Analysis, mesh: MeshSpec, value_id: int) -> str:
        """`params.w1[N0, N1_model]` - named dims with their mesh axes as subscripts."""
        masks = self._masks(ana, mesh)
        res = self.resolution(ana)
        v = ana.program.values[value_id]
        parts = []
        for fines, size in zip(layout(ana).value_dim_fine[value_id], v.shape):
            if not fines:
                parts.append(str(size))
                continue
            sub = []
            for f in fines:
                axes = _axes_of_fines((f,), masks, mesh)
                nm = res.dims[int(res.fine_to_dim[f])].name
                sub.append(nm + ("_" + "_".join(axes) if axes else ""))
            parts.append("*".join(sub))
        return f"{v.name}[{', '.join(parts)}]"

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
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StrategyError(
                bad_value("text", str(exc), "options and shardings fields")
            ) from None
        return Strategy.make(ana, shardings, options, str(doc.get("name", "")))


def _axes_of_fines(fines, masks: np.ndarray, mesh: MeshSpec) -> tuple[str, ...]:
    out = []
    for f in fines:
        m = int(masks[f])
        out += [a for i, a in enumerate(mesh.axis_names) if m >> i & 1]
    return tuple(out)


def _dim_name(ana: Analysis, res: Resolution, key) -> str:
    names = res.names
    if isinstance(key, int | np.integer):
        key = f"N{int(key)}"
    if isinstance(key, str) and key in names:
        return key
    if isinstance(key, str):
        for nd in ana.named_dims:
            if nd.label == key and nd.name in names:
                return nd.name
    raise StrategyError(
        bad_value("shardings", key, "a named dim name (N3, or N3.1 after a cut), id or label")
    )


def _mask_ways(mesh: MeshSpec) -> np.ndarray:
    """Number of shards of every mesh-axis bitmask."""
    n = len(mesh.axis_names)
    out = np.ones(1 << n, dtype=np.int64)
    for m in range(1 << n):
        for i, size in enumerate(mesh.axis_sizes):
            if m >> i & 1:
                out[m] *= size
    return out
