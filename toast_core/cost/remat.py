"""Pricing rematerialization: recomputed work and shorter activation lifetimes.

`strategy/remat.py` says, per remat group and policy, which forward ops run again and which
residuals are no longer kept; this module turns that into the three numbers the evaluator adds:

* **compute**: each recomputed op that the forward needs too costs its roofline time once more
  (same per-device shapes: the recomputation is sharded like the forward it repeats); its flops
  count again, as in XLA's `cost_analysis()` of a program under `jax.checkpoint`. A recomputed
  op that only fed residuals merely moves to the backward: XLA drops its forward copy;
* **communication**: a collective caused by a recomputed op runs again (a Megatron forward
  all-reduce, an FSDP weight gather before a recomputed matmul);
* **memory**: a residual not kept is live from its producer to its last forward reader, and
  again from the recomputation (just before its block's first backward reader) to its last
  backward reader, instead of across the whole step; a kept value the recomputation reads
  (a block's input `x`) lives until that recomputation. It reaches the recomputation through an
  `optimization_barrier` (`apply/remat.py`, as `jax.checkpoint` does), and a barrier's operand
  is a buffer: a kept input that fusion would otherwise fold into its readers (Flax's LayerNorm
  output `(x - mean) * rsqrt(var) * scale`, which XLA fuses into the bias add and relu that
  read it) is materialized at its producer and held until the recomputation, at its full size
  (`hold_barrier_inputs`).

Worked example: GPT-2 with `remat[blocks]=full` keeps one [B, S, D] value per layer; the
attention scores and MLP hidden activations of a layer are live only while its backward runs.
Recompute flops are the block's forward, about a third of a step's flops.
"""

from __future__ import annotations

import numpy as np

from toast_core.strategy.remat import RematEffect


def recompute_time_s(t: np.ndarray, effect: RematEffect) -> float:
    """Roofline time of the recomputed ops (`t`: per-op time of one execution of the step)."""
    return float(t[effect.twice_ops].sum()) if len(effect.twice_ops) else 0.0


def recompute_comm_s(ev, masks: np.ndarray, value_local: np.ndarray, effect, coll=None) -> float:
    """Time of the collectives caused by recomputed ops (they run again, combined among
    themselves as XLA combines: latency once per combined op). `coll`: the evaluator's
    `_collective_arrays(masks, value_local)` when the caller has it already."""
    if not len(effect.twice_ops):
        return 0.0
    if coll is None:
        coll = ev._collective_arrays(masks, value_local)
    kinds, ms, vs, ops, _, sites = coll
    again = np.isin(ops, effect.twice_ops)
    if not again.any():
        return 0.0
    k, m, v, o, s = kinds[again], ms[again], vs[again], ops[again], sites[again]
    return float((ev.c1[k, m] * v * ev.site_trip[s]).sum()) + ev.latency_s(k, m, v, o, s)


def recomputed_collectives(collectives, effect) -> list:
    """The collectives of a report that run again under remat."""
    if not len(effect.twice_ops):
        return []
    ops = set(effect.twice_ops.tolist())
    return [c for c in collectives if c.op in ops]


def shorten_lifetimes(delta: np.ndarray, value_local: np.ndarray, effect: RematEffect) -> None:
    """Splits each dropped residual's live range in `delta` (live bytes change after each op):
    free after its last forward reader, allocate again at its recomputation."""
    if len(effect.extend_values):
        b = value_local[effect.extend_values]
        np.add.at(delta, effect.extend_from, b)
        np.add.at(delta, effect.extend_to, -b)
    if not len(effect.values):
        return
    b = value_local[effect.values]
    gap = effect.bwd_start > effect.fwd_end + 1
    np.add.at(delta, effect.fwd_end[gap] + 1, -b[gap])
    np.add.at(delta, effect.bwd_start[gap], b[gap])


def hold_barrier_inputs(
    delta: np.ndarray,
    value_local: np.ndarray,
    effect: RematEffect,
    fused: np.ndarray,
    producer: np.ndarray,
) -> None:
    """Adds to `delta` the kept inputs of a recomputation that fusion folds into their readers
    (`fused` [values]: they take no memory without remat): the optimization barrier in front of
    the recomputation needs them as buffers, so each is live from its producer (`producer`
    [values]: op index) to the recomputation, as XLA allocates it. Measured on the Flax MLP
    (batch 8192, hidden 256, 4 layers, data=8, `dots`): XLA keeps each layer's LayerNorm
    product [1024, 256] from the forward to the barrier of the next Dense block's recomputation,
    3 MB the liveness without this missed: 7.36 MB of temporaries predicted at the peak
    without, 10.52 with, XLA's 10.50 (`bench/remat_memory.py`)."""
    if not len(effect.extend_values):
        return
    held = fused[effect.extend_values]
    if not held.any():
        return
    vals = effect.extend_values[held]
    b = value_local[vals]
    np.add.at(delta, producer[vals], b)
    np.add.at(delta, effect.extend_to[held], -b)
