"""The search's records: actions, settings, progress events and the result.

Actions are typed (after mctx's `types`): `Shard(unit, axis)` adds a mesh axis to a unit of
decision, `Resolve(group, option)` resolves every conflict of a decision group with one option,
`Remat(group, policy)` picks what a remat group recomputes, `Stop()` ends an episode; the
environment is the only place that knows how each changes a state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toast_core.cost import CostOptions, CostReport
from toast_core.errors import ToastError, bad_value
from toast_core.strategy import Strategy


@dataclass(frozen=True, slots=True)
class Resolve:
    """Resolve every conflict of decision group `group` with option `option`."""

    group: int
    option: int


@dataclass(frozen=True, slots=True)
class Shard:
    """Add mesh axis `axis` (an index into the mesh's axes) to unit `unit` of the space."""

    unit: int
    axis: int


@dataclass(frozen=True, slots=True)
class Remat:
    """Give remat group `group` (an index into the space's remat groups) policy `policy` (an
    index into `strategy.remat.POLICIES`: 1 `dots`, 2 `full`, 3 `dots_no_batch`)."""

    group: int
    policy: int


@dataclass(frozen=True, slots=True)
class Stop:
    """End the episode: the state is the strategy."""


Action = Resolve | Shard | Remat | Stop


def action_order(action: Action) -> tuple:
    """A total order of actions (resolutions, shards, remat, then stop) for deterministic trees."""
    if isinstance(action, Resolve):
        return (0, action.group, action.option)
    if isinstance(action, Shard):
        return (1, action.unit, action.axis)
    if isinstance(action, Remat):
        return (2, action.group, action.policy)
    return (3,)


@dataclass(frozen=True)
class SearchSettings:
    """Everything a search is told besides the analysis, mesh and hardware.

    Budgets in seconds (`budget_s`) and/or simulations (`num_simulations`): at least one; with
    `num_simulations` set and `budget_s=None` the search is deterministic for a seed. `pins` may
    hold forbids (`!N3@data`) too; `forbids` is kept for the contract of DESIGN.md §9.
    `workers`: independent searches run in that many processes (seeds `seed`, `seed + 1`, ...),
    the best kept (`parallel.py`).
    """

    budget_s: float | None = 10.0
    num_simulations: int | None = None
    seed: int = 0
    pins: tuple = ()
    forbids: tuple = ()
    cost_options: CostOptions = field(default_factory=CostOptions)
    report_every_s: float = 0.2
    verify: int = 0  # compile the k best distinct plans and return the best as XLA judges it
    verify_budget_s: float | None = None  # time for the compiles (default: budget_s, or none)
    workers: int = 1  # independent searches in forked processes (root-parallel MCTS)

    def __post_init__(self) -> None:
        if self.budget_s is None and self.num_simulations is None:
            raise ToastError(
                bad_value("budget_s", None, "a time budget when num_simulations is None")
            )
        if self.budget_s is not None and not (
            isinstance(self.budget_s, int | float) and self.budget_s > 0
        ):
            raise ToastError(bad_value("budget_s", self.budget_s, "a positive number of seconds"))
        if self.num_simulations is not None and (
            not isinstance(self.num_simulations, int) or self.num_simulations < 0
        ):
            raise ToastError(
                bad_value("num_simulations", self.num_simulations, "a non-negative int")
            )
        if isinstance(self.verify, bool) or not isinstance(self.verify, int) or self.verify < 0:
            raise ToastError(
                bad_value("verify", self.verify, "a non-negative int (plans to compile)")
            )
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ToastError(bad_value("workers", self.workers, "a positive int"))
        if not isinstance(self.cost_options, CostOptions):
            raise ToastError(bad_value("cost_options", self.cost_options, "a tc.CostOptions"))
        for name in ("pins", "forbids"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            elif value is None:
                object.__setattr__(self, name, ())
            else:
                object.__setattr__(self, name, tuple(value))


def settings_of(kw: dict) -> SearchSettings:
    """SearchSettings from keywords, with a one-line error for an unknown keyword."""
    unknown = sorted(set(kw) - set(SearchSettings.__dataclass_fields__))
    if unknown:
        allowed = ", ".join(SearchSettings.__dataclass_fields__)
        raise ToastError(bad_value("search keyword", unknown[0], f"one of {allowed}"))
    return SearchSettings(**kw)


@dataclass(frozen=True, slots=True)
class TreeEdge:
    """One edge of the top of the search tree: an action from its parent, how often the search
    went that way and the mean reward it found there (0..1; 0.55 is the best baseline's time)."""

    depth: int
    parent: int  # index of the parent edge in the event's `tree_top`, -1 for the root
    action: str
    visits: int
    mean_value: float


@dataclass(frozen=True)
class SearchEvent:
    iteration: int
    elapsed_s: float
    best_step_time_s: float
    best_peak_bytes: float
    best_fits: bool
    best_strategy: Strategy
    tree_size: int
    evaluations: int
    evals_per_s: float
    done: bool = False
    baselines: dict = field(default_factory=dict)  # name -> step time (fits) or None
    verified: tuple[Verified, ...] = ()  # the final event, with verify=k
    notes: tuple[str, ...] = ()  # e.g. why fewer plans than asked were verified
    tree_top: tuple[TreeEdge, ...] = ()  # the most visited edges of the first two levels


@dataclass(frozen=True)
class Verified:
    """A plan the search found, judged by XLA: predicted vs compiled step time."""

    strategy: Strategy
    predicted_step_time_s: float
    compiled_step_time_s: float
    compile_s: float


@dataclass(frozen=True)
class SearchResult:
    best: Strategy
    report: CostReport
    feasible: bool
    iterations: int
    evaluations: int
    elapsed_s: float
    history: tuple[tuple[int, float, float], ...] = ()  # (iteration, elapsed_s, best step time)
    baselines: dict = field(default_factory=dict)  # name -> step time (feasible) or None
    warnings: tuple[str, ...] = ()
    time_to_best_baseline_s: float | None = None
    verified: tuple[Verified, ...] = ()  # with verify=k: the plans XLA judged, by compiled time
