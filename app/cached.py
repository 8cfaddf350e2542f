"""Cached loaders: trace + analyze once per model, baselines and estimates once per strategy.

`st.cache_resource` keeps the objects themselves (an `Analysis` holds arrays and its own caches,
so it is shared, never copied or pickled). Keys are plain hashables: the model spec, the mesh text,
the hardware preset name and a strategy's decisions; the analysis rides along as an unhashed
`_ana` argument. Exceptions are never cached, so a failed load can simply be retried.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import pickle
import threading
import time
from dataclasses import dataclass

import streamlit as st

import toast_core as tc
from app import pricing, programs, reports
from demos import MODEL_ZOO, NUMERICS_TWINS

#: Programs with more ops than this get only a syntax check of pins before Run (the full check
#: scores the baselines, which takes seconds on the largest models).


@dataclass(frozen=True)
class ModelSpec:
    """What to load: a zoo model (name, size, train step or forward) or a user file."""

    source: str = "zoo"  # "zoo" | "file"
    model: str = "gpt"
    size: str = "tiny"
    train: bool = True
    path: str = ""  # absolute path of the user's file
    function: str = ""
    digest: str = ""  # content hash of the user's file
    batch: int = 0  # a zoo model's batch size (0: the size's own); "make it fit" may lower it

    @property
    def key(self) -> str:
        if self.source == "file":
            return f"file:{self.path}:{self.function}@{self.digest}"
        batch = f":b{self.batch}" if self.batch else ""
        return f"zoo:{self.model}:{self.size}:{'train' if self.train else 'forward'}{batch}"

    @property
    def title(self) -> str:
        if self.source == "file":
            return f"{self.path.rsplit('/', 1)[-1]}:{self.function}"
        batch = f" batch {self.batch}" if self.batch else ""
        return f"{self.model} {self.size}{batch} ({'train step' if self.train else 'forward'})"


@dataclass(frozen=True, eq=False)
class Loaded:
    """A traced and analyzed program, with what is needed to run it."""

    spec: ModelSpec
    description: str
    fn: object
    args: tuple
    param_argnums: tuple[int, ...] | None
    ana: tc.Analysis
    is_concrete: bool
    load_s: float
    batch: int | None = None  # a zoo model's batch size (None: a user file, or no batch setting)

    @property
    def key(self) -> str:
        return self.spec.key


def load(spec: ModelSpec) -> Loaded:
    """The analysis of a model spec (cached); raises ToastError subclasses only."""
    if spec.source == "file":
        return _load_file(spec.path, spec.function, spec.digest)
    return _load_zoo(spec.model, spec.size, spec.train, spec.batch)


@st.cache_resource(show_spinner=False, max_entries=24)
def _load_zoo(model: str, size: str, train: bool, batch: int = 0) -> Loaded:
    start = time.perf_counter()
    w, ana = programs.zoo(model, size, train, batch)
    spec = ModelSpec("zoo", model, size, train, batch=batch)
    return Loaded(
        spec,
        w.description,
        w.fn,
        tuple(w.args),
        w.param_argnums,
        ana,
        _is_concrete(w.args),
        time.perf_counter() - start,
        getattr(w.config, "batch", None),
    )


@st.cache_resource(show_spinner=False, max_entries=8)
def _load_file(path: str, function: str, digest: str) -> Loaded:
    start = time.perf_counter()
    user, ana = programs.user_file(path, function)
    spec = ModelSpec("file", path=path, function=function, digest=digest)
    return Loaded(
        spec,
        user.description,
        user.fn,
        user.args,
        user.param_argnums,
        ana,
        _is_concrete(user.args),
        time.perf_counter() - start,
    )


def has_twin(spec: ModelSpec) -> bool:
    return spec.source == "zoo" and (spec.model, spec.size) in NUMERICS_TWINS


def twin(spec: ModelSpec) -> Loaded:
    """The scaled-down twin of a shape-only zoo model (see `demos.NUMERICS_TWINS`), with real
    arrays; raises ToastError if it has none or if its named dims and conflicts do not line up
    with the real size's (then a plan cannot move over by name)."""
    if not has_twin(spec):
        raise tc.ToastError(f"expected a zoo model with a numerics twin, got `model={spec.title}`")
    out = _load_twin(spec.model, spec.size, spec.train, spec.batch)
    problem = misalignment(load(spec).ana, out.ana)
    if problem:
        raise tc.ToastError(f"the scaled-down twin of {spec.title} does not line up: {problem}")
    return out


@st.cache_resource(show_spinner=False, max_entries=4)
def _load_twin(model: str, size: str, train: bool, batch: int = 0) -> Loaded:
    start = time.perf_counter()
    overrides = {**NUMERICS_TWINS[(model, size)], **({"batch": batch} if batch else {})}
    w = MODEL_ZOO[model](size=size, train=train, **overrides)
    args = w.concrete_args()
    prog = tc.trace(w.fn, *args, param_argnums=w.param_argnums)
    ana = tc.analyze(prog)
    spec = ModelSpec("zoo", model, size, train, batch=batch)
    shrunk = ", ".join(f"{k}={v}" for k, v in overrides.items())
    return Loaded(
        spec,
        f"{w.description} (twin: {shrunk})",
        w.fn,
        tuple(args),
        w.param_argnums,
        ana,
        True,
        time.perf_counter() - start,
    )


def misalignment(real: tc.Analysis, small: tc.Analysis) -> str:
    """Why two analyses of one model at two sizes do not share named dims and conflicts by name
    ('' when they do): labels must match once the leading size is dropped."""

    def what(label: str) -> str:
        return label.split(" ", 1)[-1]

    if len(real.named_dims) != len(small.named_dims):
        return f"{len(real.named_dims)} named dims at the real size, {len(small.named_dims)} here"
    for a, b in zip(real.named_dims, small.named_dims):
        if what(a.label) != what(b.label):
            return f"{a.name} is {a.label!r} at the real size but {b.label!r} here"
    if len(real.conflicts) != len(small.conflicts):
        return f"{len(real.conflicts)} conflicts at the real size, {len(small.conflicts)} here"
    for a, b in zip(real.conflicts, small.conflicts):
        if (a.kind, a.named_dims, len(a.options)) != (b.kind, b.named_dims, len(b.options)):
            return f"conflict {a.name} differs"
    return ""


def _is_concrete(args) -> bool:
    import jax
    import numpy as np

    leaves = jax.tree_util.tree_leaves(args)
    return all(isinstance(x, jax.Array | np.ndarray | np.generic | int | float) for x in leaves)


def mesh_of(text: str) -> tc.MeshSpec:
    return tc.MeshSpec.parse(text)


def baselines(key: str, mesh_text: str, ana: tc.Analysis) -> dict:
    """name -> (Strategy or None, reason it does not apply); from the pricing process when it
    priced them (`warm`)."""
    seeded = _seeded_baselines.get((key, mesh_text))
    if seeded is not None:
        return seeded
    return _baselines(key, mesh_text, ana)


@st.cache_resource(show_spinner=False, max_entries=64)
def _baselines(key: str, mesh_text: str, _ana: tc.Analysis) -> dict:
    return tc.baselines.all(_ana, mesh_of(mesh_text))


def strategy_key(strategy: tc.Strategy) -> str:
    """A short digest of a strategy's decisions: Streamlit hashes cache arguments in Python,
    element by element, which took ~30 ms per call on a llama3-70b plan's hundreds of decisions
    (14 calls on the Strategy page); a digest of their text costs microseconds."""
    text = repr((strategy.shardings, strategy.options, strategy.remat))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@st.cache_resource(show_spinner=False, max_entries=1024)
def _estimate(key: str, mesh_text: str, hw_name: str, skey: str, _ana, _strategy):
    return tc.estimate(_ana, _strategy, mesh_of(mesh_text), tc.hardware(hw_name))


def estimate(loaded: Loaded, strategy: tc.Strategy, mesh_text: str, hw_name: str) -> tc.CostReport:
    """The cost report of a strategy (cached by its decisions); raises StrategyError if illegal."""
    skey = strategy_key(strategy)
    seeded = _seeded_estimate((loaded.key, mesh_text, hw_name, skey))
    if seeded is not None:
        return seeded
    return _estimate(loaded.key, mesh_text, hw_name, skey, loaded.ana, strategy)


@st.cache_resource(show_spinner=False, max_entries=16)
def _value_rows(key: str, mesh_text: str, skey: str, _ana, _strategy) -> list[dict]:
    return reports.value_rows(_ana, _strategy, mesh_of(mesh_text))


def value_rows(loaded: Loaded, strategy: tc.Strategy, mesh_text: str) -> list[dict]:
    """Shardings of every input and output (seconds on llama3-70b: cached per strategy)."""
    return _value_rows(loaded.key, mesh_text, strategy_key(strategy), loaded.ana, strategy)


@st.cache_resource(show_spinner=False, max_entries=16)
def _partition_specs(key: str, mesh_text: str, skey: str, _ana, _strategy):
    return tc.partition_specs(_ana, _strategy, mesh_of(mesh_text))


def partition_specs(loaded: Loaded, strategy: tc.Strategy, mesh_text: str):
    """(in_specs, out_specs) of a strategy (seconds on llama3-70b: cached per strategy)."""
    return _partition_specs(loaded.key, mesh_text, strategy_key(strategy), loaded.ana, strategy)


def explain_key(loaded: Loaded, strategy: tc.Strategy, mesh_text: str, hw_name: str) -> tuple:
    return (loaded.key, mesh_text, hw_name, strategy_key(strategy))


@st.cache_resource(show_spinner=False, max_entries=32)
def _explain(key: str, mesh_text: str, hw_name: str, skey: str, _ana, _strategy):
    return tc.explain(_ana, _strategy, mesh_of(mesh_text), tc.hardware(hw_name))


def explain(loaded: Loaded, strategy: tc.Strategy, mesh_text: str, hw_name: str) -> tc.Explanation:
    """The what-if table of a strategy (cached by model, mesh, hardware and decisions)."""
    return _explain(loaded.key, mesh_text, hw_name, strategy_key(strategy), loaded.ana, strategy)


def baseline_reports(loaded: Loaded, mesh_text: str, hw_name: str, polite: bool = False) -> dict:
    """name -> (Strategy, CostReport) or (None, reason). `polite` (the background pricing):
    before each baseline, wait while a page runs (`foreground`). Reports priced in the pricing
    process are summaries (`pricing.summarize`: no per-op costs nor memory timeline), which is
    what tables of baselines read; `estimate` gives a strategy's full report."""
    key = (loaded.key, mesh_text, hw_name)
    if not polite:
        _await_pricing_process(key)
    with _warming_lock:
        summaries = _seeded_summaries.get(key)
    if summaries is not None:
        return {
            name: summaries.get(name, (None, reason))
            for name, (strategy, reason) in baselines(loaded.key, mesh_text, loaded.ana).items()
        }
    out = {}
    for name, (strategy, reason) in baselines(loaded.key, mesh_text, loaded.ana).items():
        if strategy is None:
            out[name] = (None, reason)
            continue
        if polite:
            _yield_to_pages()
        try:
            out[name] = (strategy, estimate(loaded, strategy, mesh_text, hw_name))
        except tc.ToastError as exc:
            out[name] = (None, str(exc))
    return out


def check_pins(loaded: Loaded, mesh_text: str, hw_name: str, pins: tuple[str, ...]) -> None:
    """Raises PinError if the pins (forbids among them) name nothing or contradict each other
    (or the mesh)."""
    _checked_pins(loaded.key, mesh_text, tuple(pins), loaded.ana)


@st.cache_resource(show_spinner=False, max_entries=256)
def _checked_pins(key: str, mesh_text: str, pins: tuple, _ana) -> tc.Strategy:
    return tc.check_pins(_ana, mesh_of(mesh_text), pins)


@st.cache_resource(show_spinner=False, max_entries=256)
def quick_search(key: str, mesh_text: str, hw_name: str, pins: tuple[str, ...], _ana):
    """The best plan after seeding alone (baselines and greedy descents, no tree search)."""
    events = tc.search_iter(
        _ana,
        mesh_of(mesh_text),
        tc.hardware(hw_name),
        budget_s=None,
        num_simulations=0,
        pins=pins,
    )
    return next(iter(events))


@st.cache_resource(show_spinner=False, max_entries=16)
def short_search(key: str, mesh_text: str, hw_name: str, simulations: int, seed: int, _ana):
    """The last event of a deterministic search of `simulations` simulations (for the lesson
    that walks through one search)."""
    events = tc.search_iter(
        _ana,
        mesh_of(mesh_text),
        tc.hardware(hw_name),
        budget_s=None,
        num_simulations=simulations,
        seed=seed,
    )
    return collections.deque(events, maxlen=1)[0]


_warming: set[tuple] = set()
_priced: set[tuple] = set()  # warmed keys whose pricing ended (their reports are cached)
_warming_lock = threading.Lock()


_pages_running = 0
_pages_idle = threading.Condition()
#: The longest a background pricing step waits for page runs to end (a page that polls, or a
#: long search, must not starve it).
YIELD_MAX_S = 5.0


@contextlib.contextmanager
def foreground():
    """Marks a page run: background pricing (`warm`) waits between baselines while one runs.
    Python threads share one interpreter lock, so pricing the baselines of llama3-70b (~10 s)
    beside a page run made the first Search visit after loading take 3-4 s instead of ~1 s."""
    global _pages_running
    with _pages_idle:
        _pages_running += 1
    try:
        yield
    finally:
        with _pages_idle:
            _pages_running -= 1
            _pages_idle.notify_all()


def _yield_to_pages() -> None:
    with _pages_idle:
        _pages_idle.wait_for(lambda: _pages_running == 0, timeout=YIELD_MAX_S)


#: Programs with more ops than this get their baselines priced in a separate process
#: (`app.pricing`): ~10 s of CPU on llama3-70b, which a thread would take from the page runs.
#: Smaller ones are priced in a thread (a second process would trace the program again).
OFF_PROCESS_OPS = 2_000
#: The longest a page waits for the pricing process before pricing in its own run.
PRICING_WAIT_S = 180.0
#: The most (model, mesh, hardware) combinations whose baselines from the pricing process are kept.
SEEDED_MAX = 16

_seeded_baselines: dict[tuple, dict] = {}  # (model key, mesh text) -> baselines()
_seeded_summaries: dict[tuple, dict] = {}  # (model, mesh, hardware) -> baseline_reports()
#: (model, mesh, hardware, strategy key) -> [summary, full CostReport or pickled until asked for]
_seeded_estimates: dict[tuple, list] = {}
_seeded_order: list[tuple] = []  # (model, mesh, hardware) seeded, oldest first
_off_process: dict[tuple, threading.Event] = {}  # set when the pricing process has answered
priced_by: dict[tuple, int] = {}  # (model, mesh, hardware) -> id of the process that priced them


def _seed(key: tuple, result: dict) -> None:
    """Keeps what the pricing process sent where `baselines`, `baseline_reports` and `estimate`
    look first (full reports still pickled: `estimate` unpickles one when a page asks)."""
    model_key, mesh_text, hw_name = key
    with _warming_lock:
        _seeded_baselines[(model_key, mesh_text)] = {
            name: (strategy, reason) for name, (strategy, reason, _, _) in result.items()
        }
        _seeded_summaries[key] = {
            name: (strategy, summary) if isinstance(summary, tc.CostReport) else (None, summary)
            for name, (strategy, _, summary, _) in result.items()
            if strategy is not None
        }
        for strategy, _, summary, full in result.values():
            if full is not None:
                _seeded_estimates[(*key, strategy_key(strategy))] = [summary, full]
        _seeded_order.append(key)
        while len(_seeded_order) > SEEDED_MAX:
            old = _seeded_order.pop(0)
            if not any(k[:2] == old[:2] for k in _seeded_order):
                _seeded_baselines.pop(old[:2], None)
            _seeded_summaries.pop(old, None)
            for k in [k for k in _seeded_estimates if k[:3] == old]:
                del _seeded_estimates[k]


def _seeded_estimate(key: tuple) -> tc.CostReport | None:
    """A full report the pricing process sent, unpickled on first use (~0.1 s on llama3-70b)."""
    with _warming_lock:
        entry = _seeded_estimates.get(key)
    if entry is None:
        return None
    if isinstance(entry[1], bytes):
        with tc.gc_paused():  # 31k small objects: collections meanwhile would double the time
            entry[1] = pickle.loads(entry[1])
    return entry[1]


def summary(loaded: Loaded, strategy: tc.Strategy, mesh_text: str, hw_name: str) -> tc.CostReport:
    """A strategy's report for a label or a table row (step time, peak, fits): a baseline's
    summary from the pricing process when there is one, else `estimate`. The strategy picker
    labels every baseline: unpickling their full reports would cost its page ~1 s on
    llama3-70b."""
    with _warming_lock:
        entry = _seeded_estimates.get((loaded.key, mesh_text, hw_name, strategy_key(strategy)))
    if entry is not None:
        return entry[0]
    return estimate(loaded, strategy, mesh_text, hw_name)


def _await_pricing_process(key: tuple) -> None:
    """Waits (bounded) while the pricing process still prices `key`, moving it to the front of
    its queue: a page that needs the baselines now gets them from there, not twice."""
    with _warming_lock:
        answered = _off_process.get(key)
    if answered is None or answered.is_set():
        return
    pricing.promote(key)
    answered.wait(PRICING_WAIT_S)


def pricing_pending(loaded: Loaded, mesh_text: str, hw_name: str) -> bool:
    """True while the pricing process still prices these baselines (a page can show the rest at
    once and draw them later, see `ui.rerun_when_priced`)."""
    with _warming_lock:
        answered = _off_process.get((loaded.key, mesh_text, hw_name))
    return answered is not None and not answered.is_set()


def await_pricing(loaded: Loaded, mesh_text: str, hw_name: str) -> None:
    """Waits (bounded) for the pricing process's answer on these baselines, if it is at work."""
    _await_pricing_process((loaded.key, mesh_text, hw_name))


def warm(loaded: Loaded, mesh_text: str, hw_name: str) -> bool:
    """Prices the baselines in the background, once per (model, mesh, hardware), so the pages
    that show them open at once: on llama3-70b that is ~10 s of baselines and ~1.5 s per
    estimate, spent while the user reads the Model page. Large programs are priced in a separate
    process (`app.pricing`: a thread would slow every page run meanwhile), small ones in a
    thread. A page that needs them meanwhile waits for them. True if it started the pricing."""
    key = (loaded.key, mesh_text, hw_name)
    with _warming_lock:
        if key in _warming:
            return False
        _warming.add(key)

    def in_thread() -> None:
        try:
            baseline_reports(loaded, mesh_text, hw_name, polite=True)
        except Exception:  # noqa: BLE001 - a page shows the error when it asks again
            with _warming_lock:
                _warming.discard(key)
        with _warming_lock:
            _priced.add(key)

    if len(loaded.ana.program.ops) <= OFF_PROCESS_OPS:
        threading.Thread(target=in_thread, name="toast-warm", daemon=True).start()
        return True

    answered = threading.Event()

    def done(result: dict | None, error: str, pid: int) -> None:
        if result is None:  # the process failed: price here, as for a small program
            answered.set()
            threading.Thread(target=in_thread, name="toast-warm", daemon=True).start()
            return
        _seed(key, result)
        with _warming_lock:
            priced_by[key] = pid
            _priced.add(key)
        answered.set()

    with _warming_lock:
        _off_process[key] = answered
    spec = dataclasses.asdict(loaded.spec)
    pricing.request(key, (spec, programs.fingerprint(loaded.ana), mesh_text, hw_name), done)
    return True


def baseline_reports_if_ready(loaded: Loaded, mesh_text: str, hw_name: str) -> dict | None:
    """`baseline_reports` if the background pricing (`warm`) has ended, else None, starting it
    if needed: a page that only decorates itself with the baselines (the Search page's dotted
    lines) renders at once and fills them in when they arrive, instead of waiting ~10 s on
    llama3-70b. After a failed pricing it returns `baseline_reports` too, which raises again."""
    key = (loaded.key, mesh_text, hw_name)
    with _warming_lock:
        ready = key in _priced
    if ready:
        return baseline_reports(loaded, mesh_text, hw_name)
    warm(loaded, mesh_text, hw_name)
    return None


@st.cache_resource(show_spinner=False, max_entries=48)
def _figure(kind: str, key: tuple, _build):
    return _build()


def figure(kind: str, key: tuple, build):
    """The plotly figure `build()` once per `kind` and `key` (a model, mesh, hardware and
    strategy digest...): building one validates every property in Python, ~0.2-0.7 s per figure
    of a llama3-70b plan, on every rerun of the Strategy page otherwise."""
    return _figure(kind, key, build)


_preloading: set[str] = set()


def preload(spec: ModelSpec) -> bool:
    """Traces and analyzes `spec` in a background thread, once per process, so that a page
    showing it later (the Learn page's lesson: ~3 s of tracing) opens at once. True if it
    started a thread. A failure is left for the page to show when it loads the model itself."""
    with _warming_lock:
        if spec.key in _preloading:
            return False
        _preloading.add(spec.key)

    def run() -> None:
        try:
            load(spec)
        except Exception:  # noqa: BLE001 - the page shows the error when it loads it
            pass

    threading.Thread(target=run, name="toast-preload", daemon=True).start()
    return True


def in_background(name: str, fn, *args) -> None:
    """Runs `fn(*args)` (cached work a page will ask for soon) in a daemon thread; a failure is
    left for the page to show when it asks itself."""

    def run() -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - the page shows the error when it asks again
            pass

    threading.Thread(target=run, name=f"toast-{name}", daemon=True).start()


_jobs: dict[tuple, threading.Event] = {}


def if_ready(name: str, key: tuple, fn, *args):
    """`fn(*args)` (a cached function) if its background run for `key` has ended, else None,
    starting that run: a page shows what it has at once and draws the rest when it arrives
    (e.g. the Strategy page's plan without remat on llama3-70b: seconds of pricing). After a
    failed run it calls `fn` here, which raises again for the page to show."""
    job = (name, *key)
    with _warming_lock:
        done = _jobs.get(job)
        started = done is not None
        if not started:
            done = _jobs[job] = threading.Event()
    if done.is_set():
        return fn(*args)
    if not started:

        def run() -> None:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - the page shows the error when it asks again
                pass
            finally:
                done.set()

        threading.Thread(target=run, name=f"toast-{name}", daemon=True).start()
    return None


def is_ready(name: str, key: tuple) -> bool:
    """True once the background run `if_ready(name, key, ...)` started has ended."""
    with _warming_lock:
        done = _jobs.get((name, *key))
    return done is not None and done.is_set()
