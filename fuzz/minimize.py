"""Greedy minimization of a failing fuzz program, and its standalone reproduction script.

Given a program and a failing `Outcome` (kind, stage, mesh, strategy), `minimize` tries smaller
programs and keeps each one on which the *same* failure appears again (same kind, stage, exception
type and innermost toast_core frame: `Outcome.signature`), until no candidate helps or the budget
is spent. Candidates, cheapest first:

1. a simpler step: Adam or gradient accumulation -> SGD -> the forward function alone;
2. drop one statement (last first): its readers read one of its operands of the same shape
   instead, or else a new batch input of its shape; inputs nobody reads are dropped;
3. shrink a dim size: every input dim of size s becomes s // 2 (or 1), everywhere at once, so
   that dims that must match still do.

Every candidate must still be a valid JAX program (it traces) before the failure is looked for.
`write_repro` renders the result as a script that runs the failing toast stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fuzz.pipeline import HARDWARE, MESHES, Outcome
from fuzz.programs import MODES, Input, Program

Check = Callable[[Program, Outcome], "Outcome | None"]


def same_failure(got: Outcome | None, want: Outcome) -> bool:
    return got is not None and got.kind == want.kind and got.signature == want.signature


def minimize(
    prog: Program, outcome: Outcome, check: Check, *, budget_s: float = 120.0
) -> tuple[Program, Outcome, int]:
    """(smallest program found, its outcome, candidates tried)."""
    deadline = time.monotonic() + budget_s
    best, best_out, tried = prog, outcome, 0
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for cand in candidates(best):
            if time.monotonic() >= deadline:
                break
            try:
                cand.check(run=False)
            except Exception:  # noqa: BLE001 - not a valid program: skip
                continue
            tried += 1
            got = check(cand, outcome)
            if same_failure(got, outcome):
                best, best_out, progress = cand, got, True
                break
    return best, best_out, tried


def candidates(prog: Program) -> Iterator[Program]:
    yield from _simpler_modes(prog)
    for i in reversed(range(len(prog.stmts))):
        yield from _drop_stmt(prog, i)
    yield from _shrink_dims(prog)


def _simpler_modes(prog: Program) -> Iterator[Program]:
    order = {m: k for k, m in enumerate(MODES)}
    for mode in ("forward", "sgd"):
        if order[mode] < order[prog.mode] and not (mode == "sgd" and prog.mode == "forward"):
            yield _pruned(prog.replace(mode=mode))


def _drop_stmt(prog: Program, i: int) -> Iterator[Program]:
    stmts = list(prog.stmts)
    gone = stmts.pop(i)
    readers = [s for s in stmts if gone.out in s.args]
    if not readers:
        yield _pruned(prog.replace(stmts=tuple(stmts)))
        return
    try:
        shapes = prog.value_shapes()
    except Exception:  # noqa: BLE001
        return
    shape = shapes.get(gone.out, gone.shape)
    inputs = {x.name: x for x in prog.inputs}
    same = [
        a
        for a in gone.args
        if (a in shapes and shapes[a] == shape)
        or (a in inputs and inputs[a].shape == shape and inputs[a].dtype == "float32")
    ]
    for sub in same[:1]:
        yield _pruned(prog.replace(stmts=_rename(stmts, gone.out, sub)))
    new = Input(f"x_{gone.out}", "batch", shape)
    yield _pruned(
        prog.replace(inputs=prog.inputs + (new,), stmts=_rename(stmts, gone.out, new.name))
    )


def _rename(stmts, old: str, new: str) -> tuple:
    return tuple(
        s.__class__(**{**s.__dict__, "args": tuple(new if a == old else a for a in s.args)})
        for s in stmts
    )


def _pruned(prog: Program) -> Program:
    """Drops inputs no statement reads (and running statistics of dropped statements)."""
    used = {a for s in prog.stmts for a in s.args}
    inputs = tuple(i for i in prog.inputs if i.name in used)
    return prog.replace(inputs=inputs)


def _shrink_dims(prog: Program) -> Iterator[Program]:
    sizes = sorted({d for i in prog.inputs for d in i.shape if d > 1}, reverse=True)
    for s in sizes:
        for smaller in dict.fromkeys([s // 2, 2, 1]):
            if smaller >= s or smaller < 1:
                continue
            inputs = tuple(
                Input(i.name, i.group, tuple(smaller if d == s else d for d in i.shape), i.dtype)
                for i in prog.inputs
            )
            cand = prog.replace(inputs=inputs)
            try:
                shapes = cand.value_shapes()
            except Exception:  # noqa: BLE001 - the statements no longer fit: not a candidate
                continue
            yield cand.replace(
                stmts=tuple(
                    s2.__class__(**{**s2.__dict__, "shape": shapes.get(s2.out, s2.shape)})
                    for s2 in cand.stmts
                )
            )


def repro_main(outcome: Outcome, num_simulations: int = 24) -> list[str]:
    """The `if __name__ == "__main__":` block that runs the failing toast stage."""
    axes = MESHES.get(outcome.mesh, {})
    lines = [
        'if __name__ == "__main__":',
        "    import toast_core as tc",
        "",
        "    args = example_args()",
        "    print(jax.tree.map(lambda a: a.shape, jax.jit(step)(*_concrete(args))))  # plain jit runs",
        "    program = tc.trace(step, *args)",
        "    ana = tc.analyze(program)",
    ]
    if outcome.stage in ("trace", "analyze"):
        return lines
    lines += [
        f"    mesh = tc.MeshSpec({axes!r})",
        f'    hw = tc.hardware("{HARDWARE}")',
    ]
    if outcome.strategy == "search" or outcome.stage == "search":
        lines.append(
            f"    plan = tc.search(ana, mesh, hw, budget_s=None, num_simulations={num_simulations}, seed=0).best"
        )
    elif outcome.strategy:
        lines += [
            "",
            f'    plan = tc.baselines.all(ana, mesh)["{outcome.strategy}"][0]',
        ]
    else:
        lines += [
            "",
            "    plans = tc.baselines.all(ana, mesh)",
        ]
        return lines
    if outcome.stage in ("strategy", "roundtrip", "search"):
        lines += [
            "    plan.validate(ana, mesh)",
            "    assert tc.Strategy.from_json(plan.to_json(mesh), ana) == plan",
        ]
        return lines
    n = 1
    for v in axes.values():
        n *= v
    lines += [
        "    from jax.sharding import Mesh",
        "",
        f"    jax_mesh = Mesh(np.array(jax.devices()[:{n}]).reshape({tuple(axes.values())}), {tuple(axes)})",
        "    rep = tc.validate(step, args, ana, plan, jax_mesh, hw)",
        '    print("numerics ok:", rep.numerics_ok, "max abs error:", rep.max_abs_error)',
        "    for row in rep.rows():",
        "        print(*row)",
        '    assert rep.numerics_ok, "sharded numerics differ from plain jax.jit"',
    ]
    return lines


def write_repro(prog: Program, outcome: Outcome, path: Path, num_simulations: int = 24) -> Path:
    """A standalone script: the program, and a main block that runs the failing toast stage."""
    src = prog.source()
    head, _sep, _main = src.partition('if __name__ == "__main__":')
    doc = [
        "# Failure: "
        + f"{outcome.kind} at stage {outcome.stage}"
        + (f" on mesh {outcome.mesh} {MESHES.get(outcome.mesh, '')}" if outcome.mesh else "")
        + (f", strategy {outcome.strategy}" if outcome.strategy else ""),
        f"# Error: {outcome.error}",
    ]
    if outcome.where:
        doc.append(f"# Where: {outcome.where}")
    text = head + "\n".join(doc) + "\n" + "\n".join(repro_main(outcome, num_simulations)) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
