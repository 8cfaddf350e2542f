"""Applying a strategy's remat policies to the replayed program.

The traced train step already holds the forward and the backward; `shard` replays it equation by
equation. For each remat group with a policy other than `none`, the residuals the policy drops
(`strategy/remat.py`) are not read from their forward copies: when the backward first reads one
of a block's dropped residuals, the block's recomputed ops run again from the values it keeps,
and every backward reader gets the recomputed copy. The kept inputs of the recomputation go
through one `jax.lax.optimization_barrier` (what `jax.checkpoint` does) together with a
cotangent the triggering backward op reads, so XLA can neither merge the copies back by CSE nor
hoist the recomputation into the forward; the forward copies then die at their last forward
reader (or are not computed at all when they only fed residuals). The barrier also holds the
values made so far from the copies of the blocks recomputed before (a weight's gradient), so a
block's copies die before the next block is recomputed, as the cost model assumes, rather than
when a scheduler gets round to the weight-gradient matmuls (`RematReplay._finished`).

Works on any traced step: it needs only the forward/backward split and the remat groups, which
come from the program, not from a model's code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from toast_core.analysis import Analysis
from toast_core.strategy import Strategy, remat_space
from toast_core.strategy.remat import POLICIES, is_backward


class RematReplay:
    """Per replay (one jit trace): the values seen so far and the blocks recomputed."""

    def __init__(self, ana: Analysis, strategy: Strategy) -> None:
        prog = ana.program
        rs = remat_space(ana)
        self.prog = prog
        self.steps = {s.op_index: s for s in prog.handle.steps if s.op_index >= 0}
        self.first_backward = rs.first_backward
        self.block_ops: list[list[int]] = []
        self.block_of: dict[int, int] = {}  # dropped residual -> block
        producers = prog.producers()
        for group, policy in strategy.remat:
            g = rs.groups[rs.index(group)]
            effect = g.effects[POLICIES.index(policy)]
            again = set(effect.recompute_ops.tolist())
            for ops in g.blocks:
                mine = sorted(again & set(ops))
                if not mine:
                    continue
                b = len(self.block_ops)
                self.block_ops.append(mine)
                produced = {producers[v] for v in effect.values.tolist()}
                for v in effect.values.tolist():
                    if producers[v] in mine and producers[v] in produced:
                        self.block_of[v] = b
        self.seen: dict[int, Any] = dict(prog.handle.consts)
        self.recomputed: dict[int, Any] = {}
        self.done: set[int] = set()
        uses = prog.uses()
        self.last_read = [
            len(prog.ops) if v.is_output else max((o for o, _ in uses[v.id]), default=-1)
            for v in prog.values
        ]
        # Backward ops that read a recomputed copy, or a value made from one; their results
        # already tied to a recomputation.
        self.readers: set[int] = set()
        self.tied: set[int] = set()

    def read(self, opi: int, vid: int, arr, before_use: Callable, after_value: Callable):
        """The array a backward op reads for `vid`: the recomputed copy of a dropped residual."""
        b = self.block_of.get(vid)
        # A loop's `*_start` op (no step of its own: the loop is bound whole) reads the original.
        if opi < self.first_backward or opi not in self.steps:
            return arr
        if not is_backward(self.prog.ops[opi]):
            return arr
        if b is None:
            if self.prog.producers()[vid] in self.readers:
                self.readers.add(opi)
            return arr
        if b not in self.done:
            self._recompute(b, opi, before_use, after_value)
        self.readers.add(opi)
        return self.recomputed[vid]

    def _finished(self, opi: int) -> list[int]:
        """Values made (before op `opi`) from recomputed copies and still read at or after
        `opi` (a weight's gradient, read by the update): tying them to the next recomputation
        makes it wait for every reader of the copies recomputed so far, as the program order
        does. Otherwise XLA's CPU scheduler leaves the weight-gradient matmuls for the end of
        the backward and every block's recomputed copies stay live until then (measured: GPT
        demo, 8 layers, full remat). These values are live across `opi` anyway: tying them
        extends no lifetime."""
        out = sorted(
            v
            for o in self.readers
            if o < opi
            for v in self.prog.ops[o].results
            if v in self.seen and v not in self.tied and self.last_read[v] >= opi
        )
        self.tied.update(out)
        return out

    def _cotangent(self, opi: int) -> int | None:
        """A value of the backward that op `opi` reads (else the latest one): the recomputation
        is tied to it, so that it cannot start before the backward reaches the block."""
        producers = self.prog.producers()
        for ref in self.steps[opi].operands:
            if isinstance(ref, tuple) or ref not in self.seen:
                continue
            p = producers[ref]
            if p is not None and is_backward(self.prog.ops[p]):
                return ref
        back = [
            v for v in self.seen if producers[v] is not None and producers[v] >= self.first_backward
        ]
        return max(back, key=lambda v: producers[v]) if back else None

    def _recompute(self, b: int, opi: int, before_use: Callable, after_value: Callable) -> None:
        cotangent = self._cotangent(opi)
        ops = self.block_ops[b]
        made = {v for o in ops for v in self.prog.ops[o].results}
        inputs = sorted(
            {
                ref
                for o in ops
                for ref in self.steps[o].operands
                if not isinstance(ref, tuple) and ref not in made
            }
        )
        tied = inputs + ([cotangent] if cotangent is not None else []) + self._finished(opi)
        barred = jax.lax.optimization_barrier([self.seen[v] for v in tied])
        local = dict(zip(inputs, barred))
        for o in ops:
            step = self.steps[o]
            ins = [
                ref[1] if isinstance(ref, tuple) else before_use(o, pos, ref, local[ref])
                for pos, ref in enumerate(step.operands)
            ]
            outs = step.eqn.primitive.bind(*ins, **step.eqn.params)
            if not step.eqn.primitive.multiple_results:
                outs = [outs]
            for vid, arr in zip(step.results, outs):
                if vid >= 0:
                    local[vid] = after_value(vid, arr)
        self.recomputed.update((v, local[v]) for v in made if v in local)
        self.done.add(b)
