"""Guided lessons that teach sharding with the explorer itself.

Each lesson names a model, a mesh and a hardware preset, computes its numbers with the engine
(never hard-coded: change the cost model and the lessons change with it), and says which pins
to load and what to look at on which page. Lessons are written against a `LessonContext`, so the
page can hand them cached estimates and this module stays free of Streamlit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import toast_core as tc
from app.cached import Loaded, ModelSpec
from app.fmt import fmt_axes, fmt_bytes, fmt_s
from app.reports import decisions_as_pins


@dataclass(frozen=True)
class LessonContext:
    loaded: Loaded
    mesh: tc.MeshSpec
    hw_name: str
    estimate: Callable[[tc.Strategy], tc.CostReport]
    estimate_on: Callable[[tc.Strategy, str], tc.CostReport]  # on another hardware preset
    baselines: Callable[[], dict]  # name -> (Strategy | None, reason)
    quick_search: Callable[[tuple[str, ...]], tc.SearchEvent]  # zero-simulation search
    # A short deterministic search (simulations, seed) -> its last event, tree included.
    short_search: Callable[[int, int], tc.SearchEvent] | None = None

    @property
    def ana(self) -> tc.Analysis:
        return self.loaded.ana

    def baseline(self, name: str) -> tc.Strategy | None:
        return self.baselines().get(name, (None, ""))[0]


@dataclass(frozen=True)
class Lesson:
    title: str
    spec: ModelSpec
    mesh_text: str
    hardware: str
    intro: str
    body: Callable[[LessonContext], str]
    pins: Callable[[LessonContext], list[str]]
    look: tuple[tuple[str, str], ...]  # (page file, what to look at there)


# -- helpers ------------------------------------------------------------------------------------


def _param(ana: tc.Analysis, suffix: str):
    for v in ana.program.values:
        if v.role == "parameter" and v.name.endswith(suffix):
            return v
    raise tc.ToastError(f"expected a parameter named *{suffix} in {ana.program.name}")


def _param_bytes(ana: tc.Analysis) -> int:
    """Bytes of the first positional argument's parameters (the weights, not optimizer state)."""
    prog = ana.program
    params = [prog.values[v] for v in prog.inputs if prog.values[v].role == "parameter"]
    if not params:
        return 0
    root = params[0].name.split(".")[0].split("[")[0]
    return sum(v.nbytes for v in params if v.name.split(".")[0].split("[")[0] == root)


def _cost_table(columns: list[tuple[str, tc.CostReport]]) -> str:
    head = "| | " + " | ".join(n for n, _ in columns) + " |"
    sep = "|---|" + "---|" * len(columns)
    rows = [
        ("step time", lambda r: fmt_s(r.step_time_s)),
        ("compute", lambda r: fmt_s(r.compute_s)),
        ("communication", lambda r: fmt_s(r.comm_s)),
        ("peak memory per device", lambda r: fmt_bytes(r.peak_bytes)),
        ("fits memory", lambda r: "yes" if r.fits else "**no**"),
    ]
    body = [f"| {label} | " + " | ".join(f(r) for _, r in columns) + " |" for label, f in rows]
    return "\n".join([head, sep, *body])


def _kind(r: tc.CostReport, kind: str) -> tuple[float, float, int]:
    """(bytes per device, seconds, number of collectives) of one kind."""
    n = sum(c.count for c in r.collectives if c.kind == kind)
    return r.collective_bytes_by_kind().get(kind, 0.0), r.comm_s_by_kind().get(kind, 0.0), n


def _collective_list(ctx: LessonContext, r: tc.CostReport, limit: int = 6) -> str:
    prog = ctx.ana.program
    lines = []
    for c in sorted(r.collectives, key=lambda c: -c.time_s * c.count)[:limit]:
        lines.append(
            f"- **{c.kind}** over `{fmt_axes(c.mesh_axes)}` of `{prog.values[c.value].display()}` "
            f"({c.direction}, {fmt_s(c.time_s * c.count)}): {c.cause}"
        )
    more = len(r.collectives) - limit
    if more > 0:
        lines.append(f"- ... and {more} more on the Strategy page")
    return "\n".join(lines)


# -- 1. data parallel ---------------------------------------------------------------------------


def _dp_body(ctx: LessonContext) -> str:
    dp = ctx.baseline("data_parallel")
    if dp is None:
        return "This model has no batch dim to shard."
    rep, dpr = ctx.estimate(ctx.baseline("replicated")), ctx.estimate(dp)
    batch, axes = dp.shardings[0]
    nd = ctx.ana.named_dim(batch)
    ar_bytes, ar_s, ar_n = _kind(dpr, "all-reduce")
    speedup = rep.compute_s / dpr.compute_s if dpr.compute_s else float("nan")
    return f"""
**The idea.** Every device keeps a full copy of the parameters and takes 1/{ctx.mesh.n_devices}
of the batch. In TOAST this is a single decision: put the batch named dim **{batch}**
(`{nd.label}`) on mesh axis `{fmt_axes(axes)}`. NDA has already tied together the
**{len(nd.members)} tensor dims** that carry the batch (tokens, every activation of the forward
pass, every activation gradient of the backward pass), so one decision shards them all alike.

**What it costs**, estimated for {ctx.loaded.spec.title} on `{ctx.mesh}` ({ctx.hw_name}):

{_cost_table([("replicated", rep), ("data parallel", dpr)])}

Compute falls **{speedup:.1f}x**. The price is in the backward pass: each device's weight
gradients are partial sums over its slice of the batch, so the cost model adds all-reduces over
`{fmt_axes(axes)}`: **{fmt_bytes(ar_bytes)} per device per step** in {ar_n} all-reduces
({fmt_s(ar_s)}). Compare with the weights' size, {fmt_bytes(_param_bytes(ctx.ana))}: data
parallelism moves about the whole model's gradients every step, whatever the batch size.
Memory drops only for activations; the parameters and the Adam state stay replicated.
"""


def _dp_pins(ctx: LessonContext) -> list[str]:
    dp = ctx.baseline("data_parallel")
    return [f"{n}@{fmt_axes(a)}" for n, a in dp.shardings] if dp else []


# -- 2. Megatron --------------------------------------------------------------------------------


def _megatron_strategy(ctx: LessonContext) -> tuple[tc.Strategy, str, object]:
    w1 = _param(ctx.ana, "w1")
    hidden = ctx.ana.value_named_dims(w1.id)[1][0]
    return tc.Strategy.make(ctx.ana, {hidden: "model"}, name="megatron"), f"N{hidden}", w1


def _megatron_body(ctx: LessonContext) -> str:
    meg, hidden, w1 = _megatron_strategy(ctx)
    rep = ctx.estimate(ctx.baseline("replicated"))
    mr = ctx.estimate(meg)
    cols = [("replicated", rep), ("F on model", mr)]
    dp = ctx.baseline("data_parallel")
    if dp is not None:
        cols.insert(1, ("data parallel", ctx.estimate(dp)))
        batch = dp.shardings[0][0]
        both = tc.Strategy.make(ctx.ana, {hidden: "model", batch: "data"}, name="dp x megatron")
        cols.append(("F on model, batch on data", ctx.estimate(both)))
    nd = ctx.ana.named_dim(hidden)
    return f"""
**The idea.** Split the weights instead of the batch. In `relu(x @ w1) @ w2` the hidden dim F
of `{w1.display()}` runs through the activation `h` into the contraction of `h @ w2`: NDA puts all
of these in one named dim, **{hidden}** (`{nd.label}`, {len(nd.members)} tensor dims). Shard it on
`model` and both matmuls split {ctx.mesh.size("model")} ways with no communication until the
second matmul, whose contraction over F leaves each device with a partial sum of the output.

Estimated for {ctx.loaded.spec.title} on `{ctx.mesh}` ({ctx.hw_name}):

{_cost_table(cols)}

The collectives of "F on model", most expensive first:

{_collective_list(ctx, mr)}

Data parallelism is slow here because this MLP's weights ({fmt_bytes(_param_bytes(ctx.ana))})
dwarf its batch: all-reducing their gradients costs more than the matmuls save. Megatron moves
activations instead (`[B, D]` partial sums), which are small. The pin the lesson loads,
`{w1.name}.1@model`, names the dim by tensor rather than by named dim id.
"""


def _megatron_pins(ctx: LessonContext) -> list[str]:
    return [f"{_param(ctx.ana, 'w1').name}.1@model"]


# -- 3. FSDP as a cut ---------------------------------------------------------------------------


def _fsdp_body(ctx: LessonContext) -> str:
    dp, fsdp = ctx.baseline("data_parallel"), ctx.baseline("fsdp")
    if dp is None or fsdp is None:
        return "FSDP needs a train step with a batch dim."
    dpr, fr = ctx.estimate(dp), ctx.estimate(fsdp)
    clashes = [c for c in ctx.ana.conflicts if c.kind == "axis_clash"]
    chosen = dict(fsdp.options)
    c = next((c for c in clashes if c.id in chosen), clashes[0])
    opt = c.options[chosen.get(c.id, 0)]
    ag_bytes, ag_s, _ = _kind(fr, "all-gather")
    rs_bytes, rs_s, _ = _kind(fr, "reduce-scatter")
    return f"""
**The idea.** Data parallelism replicates every weight and its optimizer state. FSDP (ZeRO-3)
shards them over `data` too, but a weight dim cannot be on `data` where the batch already is:
at `x[B, D] @ w[D, F]` the operand would hold `data` twice. The analysis reports this as an
**axis_clash conflict**; this model has {len(clashes)}. For example **{c.name}**: {c.description}

Its options are **cuts**: M-edges to remove so the parameter side becomes a named dim of its own.
Option {opt.index} of {c.name} reshards {fmt_bytes(opt.bytes)}: {opt.description}.
After the cut, the weight, its optimizer state and the updated weight can take `data`, while
each use in the forward and backward matmuls reads an all-gathered copy and the gradient
arrives as a reduce-scatter. FSDP is found as a cut, not hard-coded.

Estimated for {ctx.loaded.spec.title} on `{ctx.mesh}` ({ctx.hw_name}):

{_cost_table([("data parallel", dpr), ("FSDP", fr)])}

Inputs per device fall from {fmt_bytes(dpr.persistent_bytes)} to
{fmt_bytes(fr.persistent_bytes)}. The cuts cost **{fmt_bytes(ag_bytes)} of all-gathers**
({fmt_s(ag_s)}) and **{fmt_bytes(rs_bytes)} of reduce-scatters** ({fmt_s(rs_s)}) per device per
step. FSDP trades communication for memory; whether that pays depends on whether memory binds.
"""


def _fsdp_pins(ctx: LessonContext) -> list[str]:
    fsdp = ctx.baseline("fsdp")
    return decisions_as_pins(fsdp) if fsdp else []


# -- 4. attention's sequence conflict -----------------------------------------------------------


def _sequence(ctx: LessonContext):
    """The first self-conflict, its named dim, a data-input dim holding it, and its group."""
    c = next(c for c in ctx.ana.conflicts if c.kind == "self")
    nd = ctx.ana.named_dims[c.named_dims[0]]
    prog = ctx.ana.program
    v, d = next((prog.values[v], d) for v, d, _ in nd.members if prog.values[v].role == "input")
    group = ctx.ana.group_of_conflict.get(c.id, (c.id,))
    return c, nd, f"{v.name}.{d}", group


def _attention_body(ctx: LessonContext) -> str:
    selfs = [c for c in ctx.ana.conflicts if c.kind == "self"]
    if not selfs:
        return "This model has no self-conflict."
    c, nd, ref, group = _sequence(ctx)
    try:
        tc.Strategy.make(ctx.ana, {nd.name: "model"}).validate(ctx.ana, ctx.mesh)
        naive = "(surprisingly, legal here)"
    except tc.StrategyError as exc:
        naive = str(exc).split(": ", 1)[-1].split("; ")[0]
    lines = []
    for o in c.options:
        pins = (f"{ref}@model", *[f"K{k}={o.index}" for k in group])
        ev = ctx.quick_search(pins)
        lines.append(
            f"| {o.index} | {fmt_bytes(o.bytes)} | {fmt_s(ev.best_step_time_s)} | "
            f"{'; '.join(o.description.replace('|', '/').split('; ')[:2])}; ... |"
        )
    table = "\n".join(
        ["| option | resharded | best step time | cut |", "|---|---|---|---|", *lines]
    )
    return f"""
**The idea.** In attention, `scores = q @ k.T` is `[B, H, S, S]`: q's and k's sequence dims both
come from the sequence dim of the input, so NDA puts both in one named dim, **{nd.name}**
(`{nd.label}`). A value that holds one named dim twice is a **self-conflict**. This model has
{len(selfs)} ({len(group)} in the layer group of **{c.name}**). The first site is
`{c.sites[0].text}`.

Sharding the sequence on `model` without resolving it is illegal; the engine says:

> {naive}

Each option cuts the named dim in two: reshard one side (for instance gather K over S) so that
the scores hold the sequence once sharded and once whole. With `{ref}@model` pinned and every
conflict of the group resolved the same way, the seeded search (no simulations) gives:

{table}

Leaving the sequence unsharded is always possible and often best at small sizes; context
parallelism pays off when S is long. Load the lesson to pin `{ref}@model` and
{", ".join(f"`K{k}=0`" for k in group)}, then run a search.
"""


def _attention_pins(ctx: LessonContext) -> list[str]:
    c, _, ref, group = _sequence(ctx)
    return [f"{ref}@model", *[f"K{k}=0" for k in group]]


# -- 5. why memory decides ----------------------------------------------------------------------


def _memory_body(ctx: LessonContext) -> str:
    rows = []
    fastest, fastest_fit = None, None
    for name, (strategy, _) in ctx.baselines().items():
        if strategy is None:
            continue
        r = ctx.estimate(strategy)
        rows.append((name, r))
        if fastest is None or r.step_time_s < fastest[1].step_time_s:
            fastest = (name, r)
        if r.fits and (fastest_fit is None or r.step_time_s < fastest_fit[1].step_time_s):
            fastest_fit = (name, r)
    cap = rows[0][1].capacity_bytes if rows else 0.0
    table = "\n".join(
        ["| strategy | step time | peak memory per device | fits |", "|---|---|---|---|"]
        + [
            f"| {n} | {fmt_s(r.step_time_s)} | {fmt_bytes(r.peak_bytes)} | "
            f"{'yes' if r.fits else '**no**'} |"
            for n, r in rows
        ]
    )
    rep = ctx.baseline("replicated")
    big = ctx.estimate_on(rep, "h100-80gb") if rep is not None else None
    misfits = [n for n, r in rows if not r.fits]
    if fastest_fit is None:
        verdict = "**No baseline fits**: only a search that shards more can find a plan."
    elif not fastest[1].fits:
        verdict = (
            f"The fastest plan on paper, **{fastest[0]}** ({fmt_s(fastest[1].step_time_s)}), does "
            f"not fit: the search passes it over for **{fastest_fit[0]}** "
            f"({fmt_s(fastest_fit[1].step_time_s)}), the fastest that fits."
        )
    else:
        verdict = (
            f"The fastest baseline, **{fastest_fit[0]}** ({fmt_s(fastest_fit[1].step_time_s)}), "
            "fits"
            + (f"; {', '.join(misfits)} would not." if misfits else ".")
            + " Load `gpt-1.3b` on the same mesh to see memory bind harder."
        )
    return f"""
**The idea.** A plan that does not fit in device memory does not run, however fast it is on
paper. The cost model counts, per device, the inputs (parameters, Adam's two moments, the batch)
at their sharded size plus the peak of live intermediates in program order; the search minimizes
step time **subject to** peak <= capacity x (1 - headroom), and never returns an infeasible plan
when it has seen a feasible one.

{ctx.loaded.spec.title} on `{ctx.mesh}` with {ctx.hw_name} ({fmt_bytes(cap)} usable per chip after
the headroom):

{table}

{verdict} The replicated plan would need {fmt_bytes(rep and ctx.estimate(rep).peak_bytes)} per
device; on an h100-80gb it would {"fit" if big and big.fits else "still not fit"}
({fmt_bytes(big.capacity_bytes if big else None)} usable). Sharding parameters and optimizer
state (FSDP), or activations (data, sequence), is what makes big models fit; the search weighs
those savings against the communication they cost. Run a search and watch the peak memory
metric: red points on the chart are plans that do not fit.
"""


def _no_pins(ctx: LessonContext) -> list[str]:
    return []


# -- 6. the search itself -----------------------------------------------------------------------

MCTS_SIMULATIONS = 60


def _most_visited(top) -> str:
    if top is None:
        return "No tree: every decision was fixed."
    return (
        f"UCT sent the most simulations through `{top.action}` ({top.visits} visits, mean reward "
        f"{top.mean_value:.3f}); the exploration bonus keeps the other actions visited too."
    )


def _mcts_body(ctx: LessonContext) -> str:
    if ctx.short_search is None:
        return "This lesson needs the explorer's search."
    ev = ctx.short_search(MCTS_SIMULATIONS, 0)
    base = {name: t for name, t in ev.baselines.items() if t is not None}
    ref_name, ref = min(base.items(), key=lambda kv: kv[1]) if base else ("", float("nan"))
    first = [e for e in ev.tree_top if e.depth == 1]
    rows = ["| | action | visits | mean reward |", "|---|---|---|---|"]
    for i, e in enumerate(ev.tree_top):
        indent = "&nbsp;&nbsp;&nbsp;&nbsp;↳ " if e.depth == 2 else ""
        rows.append(f"| {i} | {indent}`{e.action}` | {e.visits} | {e.mean_value:.3f} |")
    top = first[0] if first else None
    n_dims = len(ctx.ana.named_dims)
    n_k = len(ctx.ana.conflicts)
    decided = tc.strategy_pins(ev.best_strategy)
    best_t = ev.best_step_time_s

    def reward(t: float) -> float:
        return 0.1 + 0.9 * ref / (ref + t)

    return f"""
**The game.** The search plays a one-player game whose moves are sharding decisions. A
**state** is a partial plan: some of the {n_dims} named dims of {ctx.loaded.spec.title} already
placed on mesh axes, some of its {n_k} conflicts resolved; everything not yet decided is
replicated, so *every state is a complete, priceable strategy*. The root is the plan with nothing
decided (beyond your pins).

**An action** changes one decision: `shard N3 on model` (one more mesh axis for a named dim, or
for a group of identical layers at once), `resolve K2 with option 1` (cut a conflict one way), or
`stop` (keep this plan). Only legal actions are offered: the mesh axis must divide the dim, and no
tensor may use a mesh axis twice.

**One simulation** (there were {ev.iteration} in this run of {MCTS_SIMULATIONS}):
1. *Selection*: from the root, follow the child with the best UCT score, mean reward plus a bonus
   for rarely visited children, `Q/N + c·sqrt(ln N_parent / N)`, down to a node with an untried
   action;
2. *Expansion*: try one new action there (the named dims covering the most bytes first);
3. *Rollout*: from the new state, random legal actions until `stop`, then price the final plan
   with the cost model ({ev.evaluations} plans priced in all);
4. *Backup*: add the reward to every node on the path, so good regions draw more visits.

**The reward** of a plan that fits memory with step time t is `0.1 + 0.9·ref/(ref + t)`, where
ref = {fmt_s(ref)} is the best baseline's step time ({ref_name}): a plan as fast as that baseline
scores 0.55, one twice as fast {reward(ref / 2):.3f}; a plan that does not fit scores under 0.1.

**This run's tree** (seed 0; ring 1 = actions from the root, ↳ = their most visited follow-ups):

{chr(10).join(rows)}

{_most_visited(top)}
The best plan it priced takes **{fmt_s(best_t)}** per step (reward {reward(best_t):.3f}, against
{fmt_s(ref)} for {ref_name}) with the decisions {", ".join(f"`{p}`" for p in decided[:6]) or "none (everything replicated)"}{" ..." if len(decided) > 6 else ""}.
The search also keeps the best plan ever priced, so a lucky rollout is never lost.
"""


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        "1. Data parallel: shard the batch",
        ModelSpec("zoo", "gpt", "gpt2", True),
        "data=8",
        "tpu-v5e",
        "One decision shards every activation; the gradients pay for it with all-reduces.",
        _dp_body,
        _dp_pins,
        (
            (
                "app_pages/strategy.py",
                "pick `baseline: data_parallel`: the collectives are "
                "all-reduces of gradient partial sums",
            ),
            ("app_pages/named_dims.py", "the batch named dim touches the tokens and targets"),
        ),
    ),
    Lesson(
        "2. Megatron tensor parallel: shard the hidden dim",
        ModelSpec("zoo", "mlp", "large", True),
        "data=2,model=4",
        "tpu-v5e",
        "Split the MLP's hidden dim across `model`: one all-reduce of activations per matmul pair.",
        _megatron_body,
        _megatron_pins,
        (
            ("app_pages/search.py", "run with the pin: does the search add the batch on `data`?"),
            ("app_pages/strategy.py", "the decisions and the single forward all-reduce"),
        ),
    ),
    Lesson(
        "3. FSDP as a cut",
        ModelSpec("zoo", "mlp", "large", True),
        "data=8",
        "tpu-v5e",
        "Weights on the same mesh axis as the batch: an axis clash, resolved by cutting.",
        _fsdp_body,
        _fsdp_pins,
        (
            ("app_pages/named_dims.py", "the axis_clash conflicts (red) and their cut options"),
            ("app_pages/strategy.py", "pick `baseline: fsdp`: all-gathers and reduce-scatters"),
        ),
    ),
    Lesson(
        "4. Attention's sequence conflict",
        ModelSpec("zoo", "gpt", "tiny", True),
        "data=2,model=4",
        "tpu-v5e",
        "The scores hold the sequence dim twice: a self-conflict with cut options.",
        _attention_body,
        _attention_pins,
        (
            (
                "app_pages/named_dims.py",
                "tick 'Only named dims in conflicts': the red self "
                "conflict and its site, the scores",
            ),
            ("app_pages/search.py", "run with the sequence pinned; then change the option pin"),
        ),
    ),
    Lesson(
        "5. Why memory decides",
        ModelSpec("zoo", "gpt", "gpt2", True),
        "data=2,model=4",
        "tpu-v5e",
        "The fastest plan on paper may not fit; the search's constraint is memory.",
        _memory_body,
        _no_pins,
        (
            ("app_pages/strategy.py", "per-device memory against the capacity line"),
            ("app_pages/search.py", "run: the best plan must fit in 16 GiB"),
        ),
    ),
    Lesson(
        "6. How the search decides (MCTS)",
        ModelSpec("zoo", "mlp", "large", True),
        "data=2,model=4",
        "tpu-v5e",
        "States, actions, rollouts and rewards, on a short search of the MLP.",
        _mcts_body,
        _no_pins,
        (
            ("app_pages/search.py", "run a search: 'The search tree' shows where it went"),
            ("app_pages/strategy.py", "'Why this plan': each decision against its alternatives"),
        ),
    ),
)
