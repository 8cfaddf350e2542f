"""One fuzz program through the whole toast pipeline, every outcome classified.

For a program and a set of meshes: `tc.trace` and `tc.analyze` once, then per mesh `tc.search`
(a small deterministic budget: `num_simulations`, `budget_s=None`), every baseline, and
`Strategy.validate` on each returned strategy (plus a JSON round trip); then `tc.validate` (XLA
compile, run, numerics, predicted vs compiled) of the searched plan and of one baseline on the
meshes asked for. Each step yields an `Outcome`:

* `crash`: an exception that is not a ToastError (a bug of ours), with the stage and the innermost
  toast_core frame;
* `toast_error`: a ToastError although the program is a supported one;
* `invalid_plan`: the search (or a baseline) returned a strategy that `Strategy.validate` rejects or
  that XLA fails to compile;
* `numerics`: the sharded program's results differ from plain `jax.jit`'s;
* `ok`: the stage passed; for a validation, `fidelity` holds the predicted/compiled ratios of flops,
  total collective bytes and memory.

Everything runs in this process; `fuzz.worker` wraps it in a subprocess so that an XLA segfault
is recorded (as a crash at the stage announced last) rather than fatal.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

MESHES: dict[str, dict[str, int]] = {
    "8": {"data": 8},
    "2x4": {"data": 2, "model": 4},
    "2x2x2": {"a": 2, "b": 2, "c": 2},
    "3": {"data": 3},
    "2x3": {"data": 2, "model": 3},
}
HARDWARE = "tpu-v5e"
FAILURES = ("crash", "toast_error", "invalid_plan", "numerics")


@dataclass
class Outcome:
    kind: str  # "ok" or one of FAILURES
    stage: str  # trace, analyze, search, baseline, strategy, roundtrip, validate
    mesh: str = ""
    strategy: str = ""  # "search" or a baseline's name
    error: str = ""  # "ExcType: first line of the message"
    where: str = ""  # innermost toast_core frame: "toast_core/x.py:123 in fn"
    fidelity: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)  # e.g. the analysis's unknown primitives

    @property
    def signature(self) -> tuple[str, str, str, str]:
        """What makes two failures the same: kind, stage, exception type, innermost frame."""
        etype = self.error.split(":", 1)[0]
        stage = self.stage
        return (self.kind, stage, etype, self.where)

    def to_dict(self) -> dict:
        return asdict(self)


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "toast_core" in f.filename]
    f = (ours or frames or [None])[-1]
    if f is None:
        return ""
    name = f.filename
    if "toast_core" in name:
        name = "toast_core" + name.split("toast_core", 1)[1]
    elif "site-packages/" in name:
        name = name.split("site-packages/", 1)[1]
    return f"{name}:{f.lineno} in {f.name}"


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _classify(exc: BaseException, stage: str, **kw) -> Outcome:
    import toast_core as tc

    kind = "toast_error" if isinstance(exc, tc.ToastError) else "crash"
    if stage == "validate" and _is_xla_rejection(exc):
        kind = "invalid_plan"
    return Outcome(kind, stage, error=_error(exc), where=_where(exc), **kw)


def _is_xla_rejection(exc: BaseException) -> bool:
    """XLA refused to compile (or run) the sharded program: the plan is one XLA cannot do."""
    return type(exc).__name__ in ("XlaRuntimeError", "JaxRuntimeError")


def jax_mesh(axes: dict[str, int]):
    """A jax Mesh (Auto axes) over the first n of this host's devices."""
    import toast_core as tc

    return tc.jax_mesh(tc.MeshSpec(axes))


@dataclass
class Front:
    """What trace/analyze/search/baselines produced for one program (per mesh)."""

    fn: Callable
    args: tuple
    ana: object = None
    plans: dict = field(default_factory=dict)  # mesh -> {"search": Strategy, baseline: Strategy}


def front(
    prog,
    meshes: list[str],
    *,
    num_simulations: int = 24,
    seed: int = 0,
    stop_at=None,
    with_search: bool = True,
) -> Iterator[Outcome | Front]:
    """trace, analyze, then per mesh search + baselines + Strategy.validate + JSON round trip.

    Yields an Outcome per step (failures and passes) and finally the `Front`. `stop_at` (a stage
    name) ends after that stage and `with_search=False` skips the search, for the minimizer.
    """
    import toast_core as tc

    fn, args = prog.step_and_args()
    st = Front(fn, args)
    hw = tc.hardware(HARDWARE)
    try:
        program = tc.trace(fn, *args)
    except Exception as exc:  # noqa: BLE001 - classified
        yield _classify(exc, "trace")
        return
    yield Outcome("ok", "trace")
    if stop_at == "trace":
        return
    try:
        st.ana = tc.analyze(program)
    except Exception as exc:  # noqa: BLE001
        yield _classify(exc, "analyze")
        return
    unknown = sorted(
        {d.split("`")[1] for d in st.ana.diagnostics if d.startswith("unknown primitive `")}
    )
    yield Outcome("ok", "analyze", notes=[f"unknown primitive {p}" for p in unknown])
    if stop_at == "analyze":
        yield st
        return
    for mesh_name in meshes:
        mesh = tc.MeshSpec(MESHES[mesh_name])
        plans: dict = {}
        try:
            if with_search:
                res = tc.search(
                    st.ana, mesh, hw, budget_s=None, num_simulations=num_simulations, seed=seed
                )
                plans["search"] = res.best
                yield Outcome("ok", "search", mesh_name, "search")
        except Exception as exc:  # noqa: BLE001
            yield _classify(exc, "search", mesh=mesh_name, strategy="search")
        if stop_at != "search":
            try:
                for name, (strategy, _why) in tc.baselines.all(st.ana, mesh).items():
                    if strategy is not None:
                        plans[name] = strategy
                yield Outcome("ok", "baseline", mesh_name)
            except Exception as exc:  # noqa: BLE001
                yield _classify(exc, "baseline", mesh=mesh_name)
        for name, strategy in plans.items():
            yield from _check_strategy(st.ana, strategy, mesh, mesh_name, name)
        st.plans[mesh_name] = plans
    yield st


def _check_strategy(ana, strategy, mesh, mesh_name: str, name: str) -> Iterator[Outcome]:
    import toast_core as tc

    try:
        strategy.validate(ana, mesh)
    except tc.StrategyError as exc:
        yield Outcome("invalid_plan", "strategy", mesh_name, name, _error(exc), _where(exc))
        return
    except Exception as exc:  # noqa: BLE001
        yield _classify(exc, "strategy", mesh=mesh_name, strategy=name)
        return
    try:
        back = tc.Strategy.from_json(strategy.to_json(mesh), ana)
        if back != strategy:
            yield Outcome("crash", "roundtrip", mesh_name, name, "JSON round trip changed it")
            return
    except Exception as exc:  # noqa: BLE001
        yield _classify(exc, "roundtrip", mesh=mesh_name, strategy=name)
        return
    yield Outcome("ok", "strategy", mesh_name, name)


def pick_baseline(plans: dict, index: int) -> str | None:
    """One baseline to validate beside the search (rotating over the applicable ones)."""
    names = sorted(n for n in plans if n not in ("search", "replicated"))
    return names[index % len(names)] if names else None


def validate_one(prog, ana, strategy, mesh_name: str, name: str, fn=None, args=None) -> Outcome:
    """tc.validate of one strategy on the first n devices; numerics and fidelity ratios."""
    import toast_core as tc

    if fn is None:
        fn, args = prog.step_and_args()
    try:
        rep = tc.validate(
            fn, args, ana, strategy, jax_mesh(MESHES[mesh_name]), tc.hardware(HARDWARE)
        )
    except Exception as exc:  # noqa: BLE001
        return _classify(exc, "validate", mesh=mesh_name, strategy=name)
    fid = fidelity(rep)
    if not rep.numerics_ok:
        return Outcome(
            "numerics", "validate", mesh_name, name, f"NumericsMismatch: max abs error {rep.max_abs_error:.3g}",
            fidelity=fid,
        )  # fmt: skip
    return Outcome("ok", "validate", mesh_name, name, fidelity=fid)


def _ratio(p: float, c: float) -> float | None:
    if not p and not c:
        return 1.0
    return p / c if c else None  # None: predicted something where XLA has nothing


def fidelity(rep) -> dict:
    """Predicted / compiled ratios of one validation. XLA's `cost_analysis()` reports -1 flops
    when it cannot count the program (a lone `top_k`, a CPU custom call): that ratio is None and
    `flops_unmeasured` is set, so that the summary leaves it out instead of calling it a miss."""
    pc = sum(rep.predicted_collective_bytes.values())
    cc = sum(rep.compiled_collective_bytes.values())
    unmeasured = rep.compiled_flops < 0
    return {
        "flops": None if unmeasured else _ratio(rep.predicted_flops, rep.compiled_flops),
        "flops_unmeasured": unmeasured,
        "collective_bytes": _ratio(pc, cc) if cc else (1.0 if not pc else math.inf),
        "memory": _ratio(rep.predicted_memory_bytes, rep.compiled_memory_bytes),
        "predicted_flops": rep.predicted_flops,
        "compiled_flops": rep.compiled_flops,
        "predicted_collective_bytes": pc,
        "compiled_collective_bytes": cc,
        "predicted_memory_bytes": rep.predicted_memory_bytes,
        "compiled_memory_bytes": rep.compiled_memory_bytes,
        "max_abs_error": rep.max_abs_error,
    }


def run_program(
    prog,
    meshes: list[str],
    validate_meshes: list[str],
    *,
    num_simulations: int = 24,
    announce: Callable[[str], None] | None = None,
) -> Iterator[Outcome]:
    """Every outcome of one program: the front on `meshes`, then validations on `validate_meshes`
    (the searched plan and one baseline). `announce(stage)` is called before each validation so
    that a process that dies in XLA can say where."""
    st = None
    for item in front(prog, meshes, num_simulations=num_simulations):
        if isinstance(item, Front):
            st = item
        else:
            yield item
    if st is None or st.ana is None:
        return
    for mesh_name in validate_meshes:
        plans = st.plans.get(mesh_name, {})
        chosen = [n for n in ("search", pick_baseline(plans, prog.index)) if n in plans]
        for name in chosen:
            if announce:
                announce(f"validate {mesh_name} {name}")
            yield validate_one(prog, st.ana, plans[name], mesh_name, name, st.fn, st.args)


def reproduce(prog, outcome: Outcome, *, num_simulations: int = 24) -> Outcome | None:
    """Runs only what is needed to see `outcome`'s failure again on `prog`; the outcome found at
    that stage (or None when the stage cannot be reached: an earlier stage fails differently)."""
    stage, mesh_name = outcome.stage, outcome.mesh
    meshes = [mesh_name] if mesh_name else []
    stop = {"trace": "trace", "analyze": "analyze", "search": "search"}.get(stage)
    st = None
    with_search = stage == "search" or outcome.strategy == "search"
    for item in front(
        prog, meshes, num_simulations=num_simulations, stop_at=stop, with_search=with_search
    ):
        if isinstance(item, Front):
            st = item
        elif item.kind != "ok" and (item.stage, item.strategy) == (stage, outcome.strategy):
            return item
    if stage != "validate":
        return Outcome("ok", stage, mesh_name, outcome.strategy)
    plans = st.plans.get(mesh_name, {}) if st is not None else {}
    if outcome.strategy not in plans:
        return None
    plan = plans[outcome.strategy]
    return validate_one(prog, st.ana, plan, mesh_name, outcome.strategy, st.fn, st.args)
