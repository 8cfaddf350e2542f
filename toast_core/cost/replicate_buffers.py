"""The gathered copy of an operand that an op with a `replicate` factor reads whole.

An op whose rule cannot divide a dim (`top_k`, `sort`, a cumulative op along its axis, a
concatenate or slice XLA does not reshard otherwise, the fallback rule's ops) reads that dim
whole: when the operand is sharded there, the evaluator prices an all-gather (or, for a
concatenate's operand, an all-to-all) before the op (`Evaluator._replicate_collectives`). XLA's
collective writes its result into a new buffer of the gathered size, live from the collective
to the op that reads it, beside the operand's shard; the timeline (`Evaluator._memory`) counted
the communication but not that buffer, which is often the step's biggest temporary.

Measured (fuzz seed 17 #1021, data parallel on 2x4, `_route(x[4, 1, 64, 16], 3)`: softmax
then `top_k` on the batch dim sharded 4 ways): XLA's block holds the all-gather's f32[4, 1, 64,
16] (16,384 bytes) at the `TopK` custom call beside its operand's 4,096-byte shard and the
call's two results; memory_analysis() 31,056 bytes, the model 16,192 without this buffer.

Each gathered operand is one buffer per (op, operand use): when several dims are gathered one
after another, the last (the whole operand) is the biggest and the one counted. A halo's
collective-permutes (a slice piece kept sharded) write small pieces, not counted here.
"""

from __future__ import annotations

import numpy as np

from toast_core.cost.collectives import COLLECTIVE_KINDS

GATHERING = (COLLECTIVE_KINDS.index("all-gather"), COLLECTIVE_KINDS.index("all-to-all"))


def replicate_gather_buffers(ev, masks, value_local) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, first op, end op (exclusive)) of the buffer each replicate row's all-gather or
    all-to-all writes (module essay), live at the op that reads it, under the strategy's
    `masks` and the values' local bytes `value_local` (unaligned)."""
    if not len(ev.rep):
        return _empty()
    if not hasattr(ev, "_site_static"):
        ev._combine_setup()  # the combiner sites `_replicate_collectives` names
    best: dict[tuple[int, int], float] = {}
    for kinds, axes, v, ops, _, sites in ev._replicate_collectives(masks, value_local):
        # As `_collective_arrays` keeps them: on a (real) mesh axis, at an op whose work is live.
        real = (((axes & ev.real_axes) != 0) & ev._op_live[ops]).tolist()
        rows = zip(kinds.tolist(), real, v.tolist(), ops.tolist(), sites.tolist())
        for k, held, b, op, site in rows:
            if k in GATHERING and held and b > 0:
                key = (int(op), int(site))
                best[key] = max(best.get(key, 0.0), float(b))
    if not best:
        return _empty()
    ops = np.array([op for op, _ in best], dtype=np.int64)
    return np.array(list(best.values()), dtype=np.float64), ops, ops + 1


def _empty():
    return np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
