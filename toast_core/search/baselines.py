"""Textbook strategies built from tactics, in the same framework as the search.

A tactic is "shard this named dim on these mesh axes if that is legal, then let the named dims
carry it": because a named dim already groups every tensor dim that must be sharded alike, sharding
the batch named dim of the data input *is* data parallelism through the whole program.

* `replicated`: nothing sharded.
* `data_parallel`: the batch named dim (dim 0 of the largest data input) on every mesh axis.
* `megatron`: on the model axis (`model`/`tensor`/`tp`/`mp`, else the last mesh axis), greedily
  the parameter named dims other than the model (residual) dim, largest first: MLP hidden dims,
  attention heads, vocabulary.
* `fsdp`: data parallel, plus every parameter named dim's axis-clash conflict resolved by its
  cheapest cut (weights gathered at use, gradients reduce-scattered) and the parameter side sharded
  on the batch's mesh axes, largest first, one dim per parameter (ZeRO-3).
* `dp_megatron`: batch on the data axes (all but the model axis), Megatron on the model axis.
* `fsdp_megatron`: dp_megatron, plus ZeRO-3 over the data axes (each parameter also divided
  over them along its largest dim, gathered at use): Megatron-DeepSpeed's layout for GPT-3.
* `expert_parallel` (mixture of experts): batch on the data axes, the expert dim (leading dim of
  the 3-D expert weights) on the model axis.
* `sequence_parallel`: batch on the data axes, the sequence dim (dim 1 of the token input) on the
  model axis, with attention's sequence conflicts resolved by resharding one side (the gathered
  K/V option when it is legal).

Each returns a Strategy, or None when the model's structure does not allow it; `all`
also says why.
"""

from __future__ import annotations

from itertools import combinations
from math import prod

from toast_core.analysis import Analysis
from toast_core.errors import StrategyError
from toast_core.mesh import MeshSpec
from toast_core.strategy import Strategy, Unit, resolve, space_of
from toast_core.strategy.legality import why_illegal_shard
from toast_core.strategy.memo import per_analysis
from toast_core.strategy.refs import RefError, named_dim_parts

MODEL_AXIS_NAMES = ("model", "tensor", "tp", "mp", "mlp")


def model_axis(mesh: MeshSpec) -> str:
    for name in MODEL_AXIS_NAMES:
        if name in mesh.axis_names:
            return name
    return mesh.axis_names[-1]


def batch_dims(ana: Analysis) -> list[int]:
    """Named dims of the batch dim of the data inputs, largest input first: dim 0, unless dim 0
    is a loop's microbatch dim (`_is_loop_dim`: gradient accumulation over x[M, B, D] slices
    x[i] per iteration), then dim 1."""
    prog = ana.program
    inputs = sorted(
        (prog.values[v] for v in prog.inputs if prog.values[v].role == "input"),
        key=lambda v: (-v.nbytes, v.id),
    )
    shapes = {v.shape for v in inputs}
    out: list[int] = []
    for v in inputs:
        if v.rank == 0:
            continue
        dims = ana.value_named_dims(v.id)
        k = 1 if v.rank >= 2 and _is_loop_dim(ana, dims[0], shapes) else 0
        for d in dims[k][:1]:
            if d not in out:
                out.append(d)
    return out


def _is_loop_dim(ana: Analysis, named: tuple[int, ...], input_shapes: set) -> bool:
    """Whether a data input's leading dim is only indexed, never computed over: its named dim
    needs replication (the loop's dynamic slice reads one row per iteration) and holds nothing
    but the data inputs and their copies into the loop (same shapes)."""
    if len(named) != 1:
        return False
    nd = ana.named_dims[named[0]]
    if not nd.replication_ops:
        return False
    prog = ana.program
    return not any(prog.values[v].shape not in input_shapes for v, _, _ in nd.members)


class _Builder:
    """Accumulates tactics, keeping only legal ones.

    Most tries of a greedy tactic fail (Megatron on GPT-3 175B: 576 of 607, each head dim once
    the heads hold the model axis), and the whole check of a 40k-op strategy costs milliseconds.
    A try that adds one mesh axis to named dims nothing shards yet is first put to the search's
    incremental check (`why_illegal_shard`, on the fine-class masks of the current strategy,
    kept while it does not change), which refuses exactly what the whole check refuses
    (tests/test_legality_incremental.py); what it allows still goes through the whole check.
    """

    def __init__(self, ana: Analysis, mesh: MeshSpec, name: str) -> None:
        self.ana, self.mesh, self.name = ana, mesh, name
        self.shardings: dict[str, tuple[str, ...]] = {}
        self.options: dict[int, int] = {}
        self._masked: tuple | None = None  # (strategy key, fine masks)

    def strategy(self) -> Strategy:
        return Strategy.make(self.ana, self.shardings, self.options, self.name)

    def _refused(self, names: list[str], axes: tuple[str, ...]) -> bool:
        """Whether the incremental check refuses adding the one mesh axis `axes` to the named
        dims `names` (none of them sharded yet); False when it does not apply."""
        space = space_of(self.ana, self.mesh)
        if len(axes) != 1 or axes[0] not in space.axes.names or not names:
            return False
        if any(n in self.shardings for n in names):
            return False
        key = (tuple(self.shardings.items()), tuple(sorted(self.options.items())))
        if self._masked is None or self._masked[0] != key:
            current = Strategy.make(self.ana, self.shardings, self.options, self.name)
            self._masked = (key, space.masks_of(current.shardings, current.options))
        masks = self._masked[1]
        res = space.resolution(tuple(sorted(self.options.items())))
        try:
            parts = [p for n in names for p in named_dim_parts(self.ana, res, n)]
        except RefError:
            return False
        fines = tuple(f for p in parts for f in p.fine)
        sizes = {p.size for p in parts}
        if (
            not fines
            or len(sizes) != 1
            or len(set(fines)) != len(fines)
            or masks[list(fines)].any()
        ):
            return False
        unit = Unit(tuple(names), fines, sizes.pop(), 0.0)
        a = space.axes.index(axes[0])
        return why_illegal_shard(space, masks, unit, a) is not None

    def try_shard(self, dim_name: str | list[str], axes: tuple[str, ...], options=None) -> bool:
        """Adds `axes` to one named dim (or to each of a group of them) if the result is legal."""
        names = [dim_name] if isinstance(dim_name, str) else list(dim_name)
        if options is None and self._refused(names, tuple(axes)):
            return False
        shardings = dict(self.shardings)
        for name in names:
            shardings[name] = tuple(self.shardings.get(name, ())) + tuple(axes)
        opts = dict(self.options if options is None else options)
        try:
            candidate = Strategy.make(self.ana, shardings, opts, self.name)
            candidate.validate(self.ana, self.mesh)
        except StrategyError:
            return False
        self.shardings, self.options = shardings, opts
        return True

    def try_axes_subsets(self, dim_name: str, axes: tuple[str, ...]) -> tuple[str, ...]:
        """Shards on the largest legal subset of `axes` (mesh order kept)."""
        subsets = [c for r in range(len(axes), 0, -1) for c in combinations(axes, r)]
        subsets.sort(key=lambda c: -prod(self.mesh.size(a) for a in c))
        for c in subsets:
            if self.try_shard(dim_name, c):
                return c
        return ()


def _data_parallel(ana, mesh, axes, name) -> tuple[Strategy | None, str]:
    dims = batch_dims(ana)
    if not dims:
        return None, "no data input with a leading (batch) dim"
    b = _Builder(ana, mesh, name)
    d = dims[0]
    size = ana.named_dims[d].size
    chosen = b.try_axes_subsets(f"N{d}", axes)
    if not chosen:
        sizes = ", ".join(f"{a}={mesh.size(a)}" for a in axes)
        return None, f"batch named dim N{d} (size {size}) does not divide over {sizes}"
    if chosen != tuple(axes):
        # Say so: a "data parallel" that put the batch on `model` only must not pass silently.
        ways = prod(mesh.size(a) for a in axes)
        return b.strategy(), (
            f"batch N{d} (size {size}) on {'+'.join(chosen)} only: it does not divide "
            f"{'x'.join(f'{a}={mesh.size(a)}' for a in axes)} ({ways} ways)"
        )
    return b.strategy(), ""


def _megatron_into(b: _Builder, axis: str) -> int:
    ana = b.ana
    # Parameter dims that never meet the data inputs directly: hidden, heads, vocab, model dim.
    persistent = [
        nd for nd in ana.named_dims if nd.is_persistent and not nd.is_input and nd.size > 1
    ]
    if not persistent:
        return 0
    # The model (residual) dim stays whole. When data enters through a float feature dim (an
    # MLP's x[B, D]) that input dim *is* the model dim and is already excluded above; only token
    # models (data enters through an embedding lookup) leave it among the parameter dims, where
    # it is the one held by the most parameters (every weight of every layer has it; the vocab
    # dim, whose logits may cover more bytes, is in the embedding only). Excluding it
    # unconditionally would drop the MLP's hidden dim F, the very dim Megatron shards.
    excluded = (
        set()
        if _has_float_feature_input(ana)
        else {
            max(persistent, key=lambda nd: (_parameter_count(ana, nd), nd.bytes_covered, -nd.id)).id
        }
    )
    batch = set(batch_dims(ana))
    order = sorted(
        (nd for nd in persistent if nd.id not in excluded and nd.id not in batch),
        key=lambda nd: (-nd.bytes_covered, any(s > 0 for _, _, s in nd.members), nd.id),
    )
    # Decide repeated layers together (one legality check per group of named dims).
    count, done = 0, set()
    for nd in order:
        if nd.id in done:
            continue
        group = [d for d in ana.group_of_dim.get(nd.id, (nd.id,)) if d not in done] or [nd.id]
        done.update(group)
        if b.try_shard([f"N{d}" for d in group], (axis,)):
            count += len(group)
        elif len(group) > 1:  # some member cannot take the axis: place the others one by one
            count += sum(b.try_shard(f"N{d}", (axis,)) for d in group)
    return count


def _has_float_feature_input(ana: Analysis) -> bool:
    """Whether some data input is a float array whose feature (last) dim meets a parameter."""
    prog = ana.program
    for vid in prog.inputs:
        v = prog.values[vid]
        if v.role != "input" or v.rank < 2 or not v.dtype.startswith(("float", "bfloat")):
            continue
        if any(ana.named_dims[d].is_persistent for d in ana.value_named_dims(vid)[-1]):
            return True
    return False


def _megatron(ana, mesh, name) -> tuple[Strategy | None, str]:
    b = _Builder(ana, mesh, name)
    if not _megatron_into(b, model_axis(mesh)):
        return None, "no parameter named dim can be sharded on the model axis"
    return b.strategy(), ""


def _fsdp(ana, mesh, name) -> tuple[Strategy | None, str]:
    """Data parallel on every mesh axis, every parameter clash cut (weights gathered at use,
    gradients reduce-scattered), and each parameter sharded on the batch's mesh axes along its
    largest dim that can take them (ZeRO-3: weights, gradients and optimizer state all divided
    by the data-parallel ways). A parameter whose dims all clash stays replicated."""
    dp, why = _data_parallel(ana, mesh, mesh.axis_names, name)
    if dp is None:
        return None, why
    b = _Builder(ana, mesh, name)
    b.shardings, b.options = dict(dp.shardings), {}
    batch_axes = dp.shardings[0][1]
    if not _zero3_into(b, batch_axes):
        return None, "no parameter named dim can be cut off the data and sharded (no train step?)"
    return b.strategy(), why


def _zero3_into(b: _Builder, axes: tuple[str, ...]) -> bool:
    """Cuts every parameter clash (weights gathered at use, gradients reduce-scattered) and
    shards each parameter on `axes` along its largest dim that can take them, on top of the
    mesh axes that dim has already (Megatron's); keeps only the cuts it uses."""
    ana, mesh = b.ana, b.mesh
    opts = {c.id: 0 for c in ana.conflicts if c.kind == "axis_clash" and c.options}
    opts.update(b.options)
    if not opts:
        return False
    res = resolve(ana, opts)
    # A named dim the cuts split passes its mesh axes (Megatron's) on to every part.
    inherited: dict[str, tuple[str, ...]] = {}
    for name, held_axes in b.shardings.items():
        for part in _part_names(res, name):
            inherited[part] = tuple(held_axes)
    kept = b.shardings
    b.shardings = inherited
    if not b.try_shard([], (), opts):
        b.shardings = kept
        return False
    held = _persistent_fines(ana)
    # One choice per parameter, largest first; tried all at once, then one by one.
    choices = []
    for vid in _parameters_by_size(ana):
        part = _largest_shardable_part(ana, res, vid, held, axes, mesh, b.shardings)
        if part is not None and part not in choices:
            choices.append(part)
    if not choices:
        return False
    if not b.try_shard(choices, axes):
        if not sum(b.try_shard(part, axes) for part in choices):
            return False
    _drop_idle_cuts(b, res)
    return True


def _part_names(res, name: str) -> list[str]:
    """The names under `res` of named dim `name` (`N3`: itself, or its parts `N3.0`, `N3.1`
    when the cuts split it; a part of another resolution, `N3.1`, only if `res` has it)."""
    if name in res.names:
        return [name]
    if name[:1] == "N" and name[1:].isdigit():
        return [d.name for d in res.parts(int(name[1:]))]
    return []


def _drop_idle_cuts(b: _Builder, res) -> None:
    """Keeps only the cuts whose parts are sharded differently (the others merely rename
    parts), re-expressing the shardings in the smaller resolution's names."""
    ana = b.ana
    axes_of = {res.index(n): tuple(a) for n, a in b.shardings.items()}

    def axes_of_fine(f: int) -> tuple[str, ...]:
        return axes_of.get(int(res.fine_to_dim[f]), ())

    needed = {}
    for k, o in b.options.items():
        parts = [d for p in ana.conflicts[k].named_dims[:1] for d in res.parts(p)]
        if len({axes_of.get(res.index(d.name), ()) for d in parts}) > 1:
            needed[k] = o
    small = resolve(ana, needed)
    shardings = {}
    for d in small.dims:
        layouts = {axes_of_fine(f) for f in d.fine}
        if len(layouts) != 1:
            return  # the smaller resolution cannot express it: keep every cut
        if layouts != {()}:
            shardings[d.name] = layouts.pop()
    kept = (b.shardings, b.options)
    b.shardings = shardings
    if not b.try_shard([], (), needed):
        b.shardings, b.options = kept


def _parameters_by_size(ana: Analysis) -> list[int]:
    prog = ana.program
    params = [v for v in prog.inputs if prog.values[v].role == "parameter"]
    return sorted(params, key=lambda v: (-prog.values[v].nbytes, v))


def _largest_shardable_part(
    ana, res, vid: int, held: set[int], axes, mesh, shardings
) -> str | None:
    """The named dim (after cuts) of `vid`'s largest dim that holds a persistent value's dim
    and divides over `axes` times the mesh axes it has already (`shardings`); its major
    sub-factor when the dim is a reshape of several."""
    prog = ana.program
    dims = sorted(range(prog.values[vid].rank), key=lambda d: (-prog.values[vid].shape[d], d))
    for d in dims:
        for a in ana.nda.value_atoms[vid][d]:
            part = res.dims[int(res.fine_to_dim[int(ana.fine_of_atom[a])])]
            if part.size > 1:
                have = tuple(shardings.get(part.name, ()))
                if set(have) & set(axes):
                    break
                ways = prod(mesh.size(x) for x in have + tuple(axes))
                if part.size % ways == 0 and not held.isdisjoint(part.fine):
                    return part.name
                break
    return None


def _persistent_fines(ana: Analysis) -> set[int]:
    """Fine classes of the persistent inputs (parameters, optimizer state)."""
    fine = ana.fine_of_atom.tolist()
    prog = ana.program
    return {
        fine[a]
        for vid in prog.inputs
        if prog.values[vid].is_persistent
        for atoms in ana.nda.value_atoms[vid]
        for a in atoms
    }


def _dp_megatron(ana, mesh, name) -> tuple[Strategy | None, str]:
    axis = model_axis(mesh)
    data_axes = tuple(a for a in mesh.axis_names if a != axis)
    if not data_axes:
        return None, "the mesh has a single axis: use data_parallel or megatron"
    dp, why = _data_parallel(ana, mesh, data_axes, name)
    if dp is None:
        return None, why
    b = _Builder(ana, mesh, name)
    b.shardings = dict(dp.shardings)
    if not _megatron_into(b, axis):
        return None, "no parameter named dim can be sharded on the model axis"
    return b.strategy(), why


def _fsdp_megatron(ana, mesh, name) -> tuple[Strategy | None, str]:
    """dp_megatron with ZeRO-3 over the data axes (Megatron-DeepSpeed): each parameter also
    divided over the data axes along its largest dim, gathered at use."""
    dpm, why = _dp_megatron(ana, mesh, name)
    if dpm is None:
        return None, why
    _, data_axes = _split_axes(mesh)
    b = _Builder(ana, mesh, name)
    b.shardings, b.options = dict(dpm.shardings), dict(dpm.options)
    batch = _batch_names(ana)
    batch_axes = next((axes for n, axes in dpm.shardings if n in batch), data_axes)
    if not _zero3_into(b, tuple(batch_axes)):
        return None, "no parameter named dim can be cut off the data and sharded (no train step?)"
    return b.strategy(), why


def _batch_names(ana: Analysis) -> set[str]:
    return {f"N{d}" for d in batch_dims(ana)[:1]}


def _split_axes(mesh: MeshSpec) -> tuple[str, tuple[str, ...]]:
    axis = model_axis(mesh)
    return axis, tuple(a for a in mesh.axis_names if a != axis)


def _expert_parallel(ana, mesh, name) -> tuple[Strategy | None, str]:
    prog = ana.program
    experts: list[int] = []
    for vid in prog.inputs:
        v = prog.values[vid]
        if v.role == "parameter" and v.rank == 3:
            for d in ana.value_named_dims(vid)[0][:1]:
                if d not in experts:
                    experts.append(d)
    if not experts:
        return None, "no stacked expert weights (3-D parameters) in this model"
    axis, data_axes = _split_axes(mesh)
    b = _Builder(ana, mesh, name)
    why = ""
    if data_axes:
        dp, why = _data_parallel(ana, mesh, data_axes, name)
        if dp is None:
            return None, why
        b.shardings = dict(dp.shardings)
    placed = sum(b.try_shard(f"N{d}", (axis,)) for d in experts)
    if not placed:
        return None, "the expert dims cannot be sharded on the model axis"
    return b.strategy(), why


def _sequence_parallel(ana, mesh, name) -> tuple[Strategy | None, str]:
    prog = ana.program
    tokens = [
        prog.values[v]
        for v in prog.inputs
        if prog.values[v].role == "input" and prog.values[v].rank >= 2
    ]
    if not tokens:
        return None, "no data input with a sequence dim (dim 1)"
    seq = ana.value_named_dims(max(tokens, key=lambda v: v.nbytes).id)[1][:1]
    if not seq:
        return None, "the sequence dim cannot be sharded (size 1)"
    seq_dim = seq[0]
    axis, data_axes = _split_axes(mesh)
    base: dict[str, tuple[str, ...]] = {}
    note = ""
    if data_axes:
        dp, why = _data_parallel(ana, mesh, data_axes, name)
        if dp is None:
            return None, why
        base, note = dict(dp.shardings), why
    selfs = [c for c in ana.conflicts if c.kind == "self" and seq_dim in c.named_dims and c.options]
    if not selfs:
        return None, "no attention over the sequence dim (no self-conflict on it)"
    n_options = min((len(c.options) for c in selfs), default=1)
    token = max(tokens, key=lambda v: v.nbytes)
    for o in range(n_options):
        options = {c.id: o for c in selfs}
        res = resolve(ana, options)
        part = next(
            (
                d.name
                for d in res.dims
                if d.parent == seq_dim and set(d.fine) & set(_fines_of(ana, token.id, 1))
            ),
            None,
        )
        b = _Builder(ana, mesh, name)
        b.shardings, b.options = dict(base), dict(options)
        if part is not None and b.try_shard(part, (axis,), options):
            return b.strategy(), note
    return None, "the sequence dim cannot take the model axis even with its conflicts resolved"


def _fines_of(ana: Analysis, vid: int, dim: int) -> tuple[int, ...]:
    return tuple(int(ana.fine_of_atom[a]) for a in ana.nda.value_atoms[vid][dim])


def replicated(ana: Analysis, mesh: MeshSpec) -> Strategy:
    return Strategy(name="replicated")


def data_parallel(ana: Analysis, mesh: MeshSpec) -> Strategy | None:
    return _data_parallel(ana, mesh, mesh.axis_names, "data_parallel")[0]


def fsdp(ana: Analysis, mesh: MeshSpec) -> Strategy | None:
    return _fsdp(ana, mesh, "fsdp")[0]


def megatron(ana: Analysis, mesh: MeshSpec) -> Strategy | None:
    return _megatron(ana, mesh, "megatron")[0]


def dp_megatron(ana: Analysis, mesh: MeshSpec) -> Strategy | None:
    return _dp_megatron(ana, mesh, "dp_megatron")[0]


def fsdp_megatron(ana: Analysis, mesh: MeshSpec) -> Strategy | None:
    return _fsdp_megatron(ana, mesh, "fsdp_megatron")[0]


def expert_parallel(ana: Analysis, mesh: MeshSpec) -> Strategy | None:
    return _expert_parallel(ana, mesh, "expert_parallel")[0]


def sequence_parallel(ana: Analysis, mesh: MeshSpec) -> Strategy | None:
    return _sequence_parallel(ana, mesh, "sequence_parallel")[0]


#: Every baseline's builder, in the order the search scores them.
BUILDERS = {
    "replicated": lambda ana, mesh: (replicated(ana, mesh), ""),
    "data_parallel": lambda ana, mesh: _data_parallel(ana, mesh, mesh.axis_names, "data_parallel"),
    "fsdp": lambda ana, mesh: _fsdp(ana, mesh, "fsdp"),
    "megatron": lambda ana, mesh: _megatron(ana, mesh, "megatron"),
    "dp_megatron": lambda ana, mesh: _dp_megatron(ana, mesh, "dp_megatron"),
    "fsdp_megatron": lambda ana, mesh: _fsdp_megatron(ana, mesh, "fsdp_megatron"),
    "expert_parallel": lambda ana, mesh: _expert_parallel(ana, mesh, "expert_parallel"),
    "sequence_parallel": lambda ana, mesh: _sequence_parallel(ana, mesh, "sequence_parallel"),
}


@per_analysis(max_keys=8 * len(BUILDERS))
def one(ana: Analysis, mesh: MeshSpec, name: str) -> tuple[Strategy | None, str]:
    """One baseline by name (a key of `BUILDERS`) and why it does not apply, built once per
    (analysis, mesh): the search builds them one at a time, so that a time budget can stop it
    between two."""
    return BUILDERS[name](ana, mesh)


def _every(ana: Analysis, mesh: MeshSpec) -> dict[str, tuple[Strategy | None, str]]:
    return {name: one(ana, mesh, name) for name in BUILDERS}


def all(ana: Analysis, mesh: MeshSpec) -> dict[str, tuple[Strategy | None, str]]:  # noqa: A001
    """Every baseline (`tc.baselines.all`) with the reason it does not apply; when it applies,
    the text is empty or a note on how it departs from the textbook (the batch on fewer mesh
    axes than asked). Built once per (analysis, mesh). This module shadows the builtin `all`: do not use
    the builtin here."""
    return dict(_every(ana, mesh))


def _parameter_count(ana: Analysis, nd) -> int:
    """How many parameter inputs hold a dim of this named dim."""
    prog = ana.program
    return len({v for v, _, _ in nd.members if prog.values[v].role == "parameter"})
