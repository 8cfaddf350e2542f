"""Applying a strategy to the real JAX function: PartitionSpecs, constraints, `jax.jit`.

`shard(fn, ana, strategy, mesh)` returns a jitted function whose inputs and outputs carry the
strategy's `NamedSharding`s and which replays the traced program with `with_sharding_constraint`
on every value (its planned sharding) and at every cut use (the consumer's sharding), so XLA's SPMD
partitioner follows the plan rather than propagating its own. That holds inside `scan` and `while`
bodies too: a loop is bound with its body replayed under the same constraints, and its operands
are constrained where its start op reads them (unconstrained, XLA re-planned gradient
accumulation and scanned layers: FSDP weights gathered every iteration, a stacked residual
gathered again after the loop). A `cond`'s branches are not constrained. The same function runs on any
`jax.sharding.Mesh` with the strategy's axis names: simulated CPU devices here, a TPU pod or a GPU
cluster there.

A value dim split into sub-factors (`[D]` read as `[H, Dh]`) maps to a PartitionSpec entry that
lists the mesh axes of its sub-factors major first; the strategy check guarantees that only a
contiguous (major-first) split is sharded.

One use is constrained although the plan does not cut it: a prefix slice `x[0:b]` whose shards
would keep the operand's shard size reads its operand gathered, as the plan priced it, because
XLA's partitioner fails on it otherwise (`_gathered_prefix_slice`, known XLA limitation
`slice-prefix-same-shard-size`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from toast_core.analysis import Analysis
from toast_core.apply.remat import RematReplay
from toast_core.errors import ToastError, bad_value
from toast_core.ir.trace import run_with_constraints
from toast_core.mesh import MeshSpec
from toast_core.strategy import Strategy, space_of


def mesh_spec_of(mesh: Mesh | MeshSpec) -> MeshSpec:
    """The MeshSpec of a jax Mesh (names and sizes), or the MeshSpec itself."""
    if isinstance(mesh, MeshSpec):
        return mesh
    if isinstance(mesh, Mesh):
        return MeshSpec(dict(zip(mesh.axis_names, mesh.devices.shape)))
    raise ToastError(bad_value("mesh", mesh, "a jax.sharding.Mesh or a tc.MeshSpec"))


def jax_mesh(mesh: MeshSpec, devices=None) -> Mesh:
    """A `jax.sharding.Mesh` of the first `mesh.n_devices` devices (or of `devices`) shaped like
    the MeshSpec, with its axis names (Auto axes, which accept sharding constraints)."""
    if not isinstance(mesh, MeshSpec):
        raise ToastError(bad_value("mesh", mesh, "a tc.MeshSpec"))
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < mesh.n_devices:
        raise ToastError(
            f"mesh {mesh} needs {mesh.n_devices} devices, {len(devices)} available "
            "(simulate more with XLA_FLAGS=--xla_force_host_platform_device_count=N)"
        )
    grid = np.array(devices[: mesh.n_devices], dtype=object).reshape(mesh.axis_sizes)
    return Mesh(grid, mesh.axis_names)


def _entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


class _Specs:
    """PartitionSpecs of every value and every cut use of one strategy."""

    def __init__(self, ana: Analysis, strategy: Strategy, mesh: MeshSpec) -> None:
        self.masks = strategy.fine_masks(ana, mesh)
        self.ana, self.mesh = ana, mesh
        self.space = space_of(ana, mesh)

    def value(self, vid: int) -> PartitionSpec:
        return PartitionSpec(*map(_entry, self.space.value_axes(self.masks, vid)))

    def use(self, opi: int, pos: int) -> PartitionSpec:
        return PartitionSpec(*map(_entry, self.space.use_axes(self.masks, opi, pos)))

    def cut_uses(self) -> dict[tuple[int, int], PartitionSpec]:
        """Uses whose sharding differs from their value's (cuts and reshape conflicts), and
        prefix slices that must read their operand gathered (`_gathered_prefix_slice`)."""
        out = {}
        prog = self.ana.program
        for op in prog.ops:
            for pos, vid in enumerate(op.operands):
                if prog.values[vid].rank == 0:
                    continue
                spec = self.use(op.index, pos)
                if op.primitive == "slice":
                    spec = _gathered_prefix_slice(op, prog.values[vid].shape, spec, self.mesh)
                if spec != self.value(vid):
                    out[(op.index, pos)] = spec
        return out


def _gathered_prefix_slice(op, shape, spec: PartitionSpec, mesh: MeshSpec) -> PartitionSpec:
    """The use sharding of a `slice` operand with every dim that hits the known XLA limitation
    `slice-prefix-same-shard-size` replicated: a unit-stride slice `x[0:b]` of a dim of n
    elements sharded k ways where ceil(b / k) == n / k. XLA's partitioner keeps such a slice
    local and caches the gathered slice as the gathered operand, so another reader that gathers
    the operand gets `[b]` where it needs `[n]` and the HLO verifier fails. Gathering the operand
    explicitly first is what the plan priced anyway: the slice's result cannot be sharded k ways
    there (b is not a multiple of k), so the sliced dim is a replicate factor, an all-gather."""
    lo, hi = op.param("start_indices", ()), op.param("limit_indices", ())
    strides = op.param("strides", None) or (1,) * len(lo)
    entries = list(spec) + [None] * (len(shape) - len(spec))
    changed = False
    for d, axes in enumerate(entries):
        if axes is None or int(lo[d]) != 0 or int(strides[d]) != 1:
            continue
        n, b = int(shape[d]), int(hi[d])
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        k = int(np.prod([mesh.axis_sizes[mesh.axis_names.index(a)] for a in names]))
        if b < n and -(-b // k) == n // k:
            entries[d], changed = None, True
    return PartitionSpec(*entries) if changed else spec


def partition_specs(ana: Analysis, strategy: Strategy, mesh: Mesh | MeshSpec):
    """(input specs, output specs): pytrees of PartitionSpec shaped like the args and outputs."""
    specs = _Specs(ana, strategy, mesh_spec_of(mesh))
    handle = ana.program.handle
    ins = [specs.value(v) for v in handle.input_ids]
    outs = [specs.value(v) for v in handle.output_ids]
    return (
        jax.tree_util.tree_unflatten(handle.in_tree, ins),
        jax.tree_util.tree_unflatten(handle.out_tree, outs),
    )


def shard(fn: Callable, ana: Analysis, strategy: Strategy, mesh: Mesh) -> Callable:
    """`jax.jit` of the traced program with the strategy's shardings and constraints, and its
    remat policies (dropped residuals recomputed in the backward, see `apply/remat.py`)."""
    if not isinstance(mesh, Mesh):
        raise ToastError(bad_value("mesh", mesh, "a jax.sharding.Mesh (Auto axes)"))
    ms = mesh_spec_of(mesh)
    specs = _Specs(ana, strategy, ms)
    prog = ana.program
    handle = prog.handle
    if handle is None:
        raise ToastError("analysis has no trace handle: trace the function with tc.trace")
    value_sharding = {
        v.id: NamedSharding(mesh, specs.value(v.id))
        for v in prog.values
        if v.rank > 0 and v.role != "literal"
    }
    use_sharding = {k: NamedSharding(mesh, s) for k, s in specs.cut_uses().items()}
    in_shardings = jax.tree_util.tree_unflatten(
        handle.in_tree,
        [value_sharding.get(v, NamedSharding(mesh, PartitionSpec())) for v in handle.input_ids],
    )
    out_shardings = jax.tree_util.tree_unflatten(
        handle.out_tree,
        [value_sharding.get(v, NamedSharding(mesh, PartitionSpec())) for v in handle.output_ids],
    )

    def constrain_value(vid, arr):
        sharding = value_sharding.get(vid)
        if sharding is None or getattr(arr, "ndim", 0) == 0:
            return arr
        return jax.lax.with_sharding_constraint(arr, sharding)

    def constrain_use(opi, pos, vid, arr):
        sharding = use_sharding.get((opi, pos))
        if sharding is None:
            return arr
        return jax.lax.with_sharding_constraint(arr, sharding)

    def sharded(*args):
        flat = jax.tree_util.tree_leaves(args)
        after_value, before_use = constrain_value, constrain_use
        if strategy.remat:  # recompute dropped residuals in the backward (see apply/remat.py)
            replay = RematReplay(ana, strategy)

            def after_value(vid, arr):
                replay.seen[vid] = out = constrain_value(vid, arr)
                return out

            def before_use(opi, pos, vid, arr):
                arr = replay.read(opi, vid, arr, constrain_use, constrain_value)
                return constrain_use(opi, pos, vid, arr)

        outs = run_with_constraints(prog, flat, before_use, after_value)
        return jax.tree_util.tree_unflatten(handle.out_tree, outs)

    sharded.__name__ = f"sharded_{getattr(fn, '__name__', 'fn')}"
    return jax.jit(sharded, in_shardings=tuple(in_shardings), out_shardings=out_shardings)
