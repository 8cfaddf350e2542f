"""Loop operands and carries share buffers with the values they enter and leave a loop as.

The tracer flattens a `scan`/`while`/`cond` into `<prim>_start`, the body's ops and `<prim>_end`:
`scan_start` makes a new value for each constant, carry and per-iteration slice the body reads,
and `scan_end` one for each final carry. XLA makes no new buffers for most of them: a loop's
constants are its operands (a parameter read by the body is the parameter), the carry is updated in
place in the loop's tuple, and the final carry *is* that buffer. Counting each such value as a new
buffer counted a gradient accumulation loop's parameters and accumulators twice (measured: the
`grad-accum` workload predicted 1.3-2.5x the compiled memory).

`buffer_aliases` names, for each such value, the value whose buffer it is; the liveness then
extends that value's lifetime to cover the alias instead of adding a buffer. Per-iteration slices
of a scan's stacked inputs (`xs`) and stacked outputs (`ys`) stay new buffers, as do values whose
shape or dtype differ from the operand they mirror.

Two more rules follow from XLA's `while` sharing one buffer per tuple element between the
loop's operand, the body's parameter, the body's root and the loop's result: a carry the body
updates in place (`g + dg`) is the initial carry's buffer (`_carry_updates`), and a copy a
reshard makes for a constant or a stacked input (an FSDP weight gathered for the body) is held
until the loop ends (`held_until`), not just at `scan_start`. A `cond`'s result is the buffer
of the branch roots that make it, one for all the branches (`_branch_roots`).
"""

from __future__ import annotations

from toast_core.ir import primitives as prim
from toast_core.ir.program import Program

_LOOP_ENDS = {prim.SCAN_START: prim.SCAN_END, prim.WHILE_START: prim.WHILE_END}


def _pairs(op) -> list[tuple[int, int]]:
    """(result, operand) pairs of a region boundary op that share a buffer."""
    params = dict(op.params)
    if op.primitive == prim.SCAN_START:
        n = int(params.get("num_consts", 0)) + int(params.get("num_carry", 0))
        return list(zip(op.results[:n], op.operands[:n]))
    if op.primitive == prim.SCAN_END:
        n = int(params.get("num_carry", 0))
        return list(zip(op.results[:n], op.operands[:n]))
    if op.primitive in (prim.WHILE_START, prim.WHILE_END, prim.COND_START):
        return list(zip(op.results, op.operands))
    return []


def buffer_aliases(prog: Program) -> dict[int, int]:
    """value id -> id of the value whose buffer it shares (resolved to the first of a chain)."""
    alias: dict[int, int] = {}
    starts: list = []
    branch_starts: list[list[int]] = []  # open conds: each branch's `cond_start` op
    last_read = _last_direct_reads(prog)
    copied = _copied_input_carries(prog)
    for op in prog.ops:
        if op.primitive in _LOOP_ENDS:
            starts.append(op)
        elif starts and op.primitive == _LOOP_ENDS[starts[-1].primitive]:
            for out, into in _carry_updates(starts.pop(), op, last_read, prog):
                alias[out] = alias.get(into, into)
        if op.primitive == prim.COND_END:
            for value, owner in _branch_roots(op, branch_starts.pop(), prog):
                alias[value] = alias.get(owner, owner)
        elif op.primitive == prim.COND_START:
            if op.param("branch", 0) == 0:
                branch_starts.append([])
            branch_starts[-1].append(op.index)
        for result, operand in _pairs(op):
            if result in copied:
                continue
            r, o = prog.values[result], prog.values[operand]
            if r.shape == o.shape and r.dtype == o.dtype and result != operand:
                alias[result] = alias.get(operand, operand)
    return alias


def _branch_roots(end, starts: list[int], prog: Program) -> list[tuple[int, int]]:
    """(value, owner) pairs of one `cond`: each result and the branches' values for it share
    one buffer. XLA's dataflow analysis gives a `conditional` no value of its own: its result's
    value set is the union of the branch roots' (`HloDataflowAnalysis`), so buffer assignment
    puts every branch's root and the result in one buffer, live from the first branch's root on.
    Fuzz seed 19 #681 (`cond(p, 2 * t, tanh, t)`, t f32[24, 4, 16, 1], replicated on 2x4): in
    XLA's 24.6 KB block the tanh, the product and the result are one 6 KB buffer; the model held
    three (1.59x XLA's bytes). A branch that returns a value it did not make (its operand, a
    value from outside, the same value twice) gets XLA's copy instead: a buffer of its own.
    When the result is an output, it owns the buffer (the output's allocation)."""
    n = len(end.results)
    producers = prog.producers()
    bounds = starts[1:] + [end.index]
    pairs = []
    for j, result in enumerate(end.results):
        made = []
        for b, first in enumerate(starts):
            outs = end.operands[b * n : (b + 1) * n]
            x = outs[j]
            p = producers[x]
            r, v = prog.values[result], prog.values[x]
            if p is None or not first < p < bounds[b] or outs.count(x) > 1:
                continue
            if v.shape == r.shape and v.dtype == r.dtype:
                made.append(x)
        if not made:
            continue
        owner = result if prog.values[result].is_output else made[0]
        pairs += [(x, owner) for x in made + [result] if x != owner]
    return pairs


def _copied_input_carries(prog: Program) -> set[int]:
    """The carries (a scan's `scan_start` results) whose initial value is a program input and
    which the body updates: XLA cannot update an entry parameter's buffer in place (the
    arguments are not donated), so its copy insertion copies the input into the loop's state
    (`copy(param)` before the `while`), a buffer of its own from the loop's start through the
    final carry's last reader. Fuzz seed 16 #856: `fori_loop(0, 3, f, x1)` with the result the
    output: XLA's output allocation holds the copy, the model had aliased the carry to x1 and
    counted no output (0.17 of XLA's bytes); #871 reads the final carry on, in a temporary.
    A literal or constant initial value is read-only as well: XLA copies it into the state
    (`copy(constant(0))`, a `while_loop`'s counter; fuzz seed 17 #752: the counter 4 bytes of
    the 132-byte block, the model had aliased it to the literal and counted none)."""
    producers = prog.producers()
    ends = _loop_ends(prog)
    out: set[int] = set()
    for op in prog.ops:
        if op.index not in ends:
            continue
        consts, n = _loop_slots(op, prog.ops[ends[op.index]])
        updates = prog.ops[ends[op.index]].operands[:n]
        for cin, init, cout in zip(op.results[consts : consts + n], op.operands[consts:], updates):
            if producers[init] is None and cout != cin:
                out.add(cin)
    return out


def _carry_updates(start, end, last_read, prog: Program) -> list[tuple[int, int]]:
    """(carry-out, carry-in) pairs of one scan whose update XLA writes in place: a `while`'s
    body parameter and its root's element share one buffer, as do the loop's operand and
    result, so a gradient accumulator `g + dg` is added into the carry it reads. XLA copies
    the carry instead when the old value is still read after the new one is made (or the new
    one is a value from outside the body), so those keep buffers of their own.

    Measured on `grad-accum` replicated (2x2x2): XLA keeps the accumulators, the loop's carry
    and the updated weights in one allocation per weight; with the body's new carry a buffer
    of its own, the prediction held a third copy of w1 through the update (1.26x compiled)."""
    consts, n = _loop_slots(start, end)
    ins = start.results[consts : consts + n]
    outs = end.operands[:n]
    producers = prog.producers()
    pairs = []
    for cin, cout in zip(ins, outs):
        p = producers[cout]
        a, b = prog.values[cin], prog.values[cout]
        if cin == cout or p is None or p <= start.index or a.shape != b.shape or a.dtype != b.dtype:
            continue
        if last_read.get(cin, -1) <= p or _is_counter_step(prog, prog.ops[p], cin):
            pairs.append((cout, cin))
    return pairs


def _is_counter_step(prog: Program, op, carry: int) -> bool:
    """Whether `op` steps an integer scalar carry (`i + 1`): the loop's counter. XLA keeps one
    counter in the loop's state and copies the old value at the body's start for the ops that
    read it after the step (`copy(get-tuple-element(param), index=0)`), the counter copy
    `cpu_buffers.loop_state_buffers` counts already; the step itself is written in place even
    when the old value is read later. Fuzz seed 17 #841 (`fori_loop`, 2x4): XLA's 196-byte
    block holds the table, the dot's result, the copy and the counter; the model had the
    counter, its step and the copy (524 bytes of XLA's 268)."""
    v = prog.values[carry]
    return (
        op.primitive == "add"
        and v.shape == ()
        and v.dtype.startswith(("int", "uint"))
        and carry in op.operands
        and all(x == carry or prog.values[x].role in ("literal", "constant") for x in op.operands)
    )


def _last_direct_reads(prog: Program) -> dict[int, int]:
    """value -> the last op that reads it, `scan_end` and `while_end` aside (they list the
    carries they were given besides the updated ones: bookkeeping, not a read of the buffer)."""
    last: dict[int, int] = {}
    for op in prog.ops:
        if op.primitive in (prim.SCAN_END, prim.WHILE_END):
            continue
        for x in op.operands:
            last[x] = op.index
    return last


def zero_filled(op) -> list[int]:
    """The values XLA writes whole before a loop runs: a scan's stacked outputs (`ys`). JAX
    lowers a scan to a `while` whose state holds one zero-filled buffer per stacked output, which
    each iteration updates in place with its slice (measured on the CPU's HLO: a broadcast of
    zero, then one `copy` of it per output, every one a full write; TPU and GPU fuse the fill
    but write it all the same). The slices themselves are written by the body."""
    if op.primitive != prim.SCAN_END:
        return []
    return list(op.results[int(dict(op.params).get("num_carry", 0)) :])


def held_until(prog: Program, sites) -> list[int]:
    """For each use site (value, op, operand position), the last op of the loop that holds the
    copy a reshard makes for that use, or -1 when the copy lives only to its last reader.

    A scan's constants and stacked inputs are operands of the loop: every iteration reads them
    again, so a copy resharded for them (an FSDP weight gathered for a gradient accumulation
    loop's body, `scan_start` reading it) is made once before the loop and held until it ends,
    beside the carry and the body's temporaries. Measured on `grad-accum` FSDP (data=2, fsdp=2,
    model=2): XLA's buffer assignment keeps the gathered w1 [64, 256] and w2 [256, 32] (96 KiB of
    384 KiB of temporaries) live through the whole `while`; priced only at `scan_start`, the
    prediction was 0.77x the compiled memory. A carry's copy is not held apart: it becomes the
    carry's buffer, which the carry's own value already holds (`buffer_aliases`)."""
    ends = _scan_ends(prog)
    out = []
    for _value, opi, pos in sites:
        op = prog.ops[opi]
        held = -1
        if op.primitive == prim.SCAN_START and opi in ends:
            params = dict(op.params)
            consts = int(params.get("num_consts", 0))
            carry = int(params.get("num_carry", 0))
            if not consts <= pos < consts + carry:
                held = ends[opi]
        out.append(held)
    return out


def _scan_ends(prog: Program) -> dict[int, int]:
    """scan_start op -> its scan_end op (the next one at the same region depth)."""
    return {s: e for s, e in _loop_ends(prog).items() if prog.ops[s].primitive == prim.SCAN_START}


def _loop_ends(prog: Program) -> dict[int, int]:
    """scan_start or while_start op -> its end op (the next one at the same region depth)."""
    open_at: list = []
    ends: dict[int, int] = {}
    for op in prog.ops:
        if op.primitive in _LOOP_ENDS:
            open_at.append(op)
        elif open_at and op.primitive == _LOOP_ENDS[open_at[-1].primitive]:
            ends[open_at.pop().index] = op.index
    return ends


def _loop_slots(start, end) -> tuple[int, int]:
    """(constants, carries) of a loop: a scan's from its params, a while's carries from its
    end, which lists the body's new carries and then the old ones."""
    consts = int(dict(start.params).get("num_consts", 0))
    if start.primitive == prim.WHILE_START:
        return consts, len(end.operands) // 2
    return consts, int(dict(start.params).get("num_carry", 0))
