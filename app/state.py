"""Session state: what the user loaded, pinned and found survives reruns and page switches.

Streamlit forgets a widget's value when a page that does not render it runs, so every setting
lives under a plain key (`budget_s`) and its widget under a shadow key (`w.budget_s`) that `keep`
refills from the plain key and `save` copies back. Nothing is written before an action succeeds:
a failed load, a bad mesh or a bad pin leaves the previous state in place.

Layout of `st.session_state`:

* `model_spec` (cached.ModelSpec), `mesh_text`, `hardware`: the committed configuration;
* `workspaces[model key]`: pins (forbids start with `!`) and imported strategies of one model;
* `runs[(model key, mesh, hardware)]`: the last search there (history, best, previous best);
* `validations[(model key, mesh, hardware, decisions)]`: ValidationReports;
* `errors[place]`: the last error of an action, shown until the next success.
"""

from __future__ import annotations

import copy
import threading

import streamlit as st

import toast_core as tc
from app import cached
from app.cached import Loaded, ModelSpec

#: GPT-2 small shapes (124M parameters, 12 layers, S=1024, bf16): the size where the best plan
#: really shards on the default mesh (replicated does not even fit a v5e's 16 GiB), so the first
#: search teaches sharding rather than "everything replicated" (a tiny model's step is shorter
#: than one collective's latency).
DEFAULT_SPEC = ModelSpec("zoo", "gpt", "gpt2", True)
DEFAULT_MESH = "data=2,model=4"
DEFAULT_HARDWARE = "tpu-v5e"

_DEFAULTS: dict = {
    "model_spec": DEFAULT_SPEC,
    "mesh_text": DEFAULT_MESH,
    "hardware": DEFAULT_HARDWARE,
    "workspaces": {},
    "runs": {},
    "validations": {},
    "errors": {},
    "notices": {},
    # settings backed by widgets (see `keep`)
    "source": "Zoo model",
    "zoo_model": DEFAULT_SPEC.model,
    "zoo_size": DEFAULT_SPEC.size,
    "zoo_train": DEFAULT_SPEC.train,
    "file_target": "",
    "upload_function": "make",
    "mesh_input": DEFAULT_MESH,
    "hardware_input": DEFAULT_HARDWARE,
    "budget_s": 5.0,
    "seed": 0,
    "num_simulations": 0,
    "strategy_choice": "",
    "lesson": 0,
    "nd_kinds": ["parameter", "data", "other"],
    "nd_min_mib": 0.0,
    "nd_top_n": 16,
    "nd_conflict_boxes": "auto",
    "nd_conflicts_only": False,
    "nd_collapse": True,
    "nd_roles": ["input", "parameter"],
    "nd_show_conflicts": True,
    "nd_show_sites": True,
    "nd_merge_state": True,
}


def init() -> None:
    """Fills missing keys with their defaults (once per session)."""
    for key, value in _DEFAULTS.items():
        if key not in st.session_state:
            st.session_state[key] = copy.deepcopy(value)


def keep(key: str) -> str:
    """The widget key for setting `key`, set to the setting's value; call it right before the
    widget renders. Always setting it (not only when missing) matters: a widget of the same key
    on another page is another widget to Streamlit, which would otherwise start at its default."""
    wkey = f"w.{key}"
    st.session_state[wkey] = st.session_state[key]
    return wkey


def save(key: str) -> None:
    """on_change callback: copy a widget's value back to its setting."""
    st.session_state[key] = st.session_state[f"w.{key}"]


def bound(key: str) -> dict:
    """Widget keyword arguments that bind a widget to setting `key` (see `keep` and `save`)."""
    return {"key": keep(key), "on_change": save, "args": (key,)}


def set_setting(key: str, value) -> None:
    """Sets a setting and its widget (call before the widget renders, or from a callback)."""
    st.session_state[key] = value
    st.session_state[f"w.{key}"] = value


# -- errors and notices shown on the next render ----------------------------------------------


def set_error(place: str, message: str | None) -> None:
    if message is None:
        st.session_state.errors.pop(place, None)
    else:
        st.session_state.errors[place] = message


def error(place: str) -> str | None:
    return st.session_state.errors.get(place)


def notify(place: str, message: str) -> None:
    st.session_state.notices[place] = message


def pop_notice(place: str) -> str | None:
    return st.session_state.notices.pop(place, None)


# -- the committed configuration ----------------------------------------------------------------


def spec() -> ModelSpec:
    return st.session_state.model_spec


def mesh_text() -> str:
    return st.session_state.mesh_text


def hardware_name() -> str:
    return st.session_state.hardware


def mesh() -> tc.MeshSpec:
    return cached.mesh_of(mesh_text())


def hardware() -> tc.HardwareSpec:
    return tc.hardware(hardware_name())


def loaded() -> Loaded | None:
    """The committed model's analysis (loads it on first use); None, with an error, if it fails."""
    try:
        out = cached.load(spec())
    except tc.ToastError as exc:
        set_error("model", str(exc))
        return None
    return out


def commit_model(new_spec: ModelSpec) -> Loaded | None:
    """Loads a model; only on success does it become the current one."""
    try:
        out = cached.load(new_spec)
    except tc.ToastError as exc:
        set_error("model", str(exc))
        return None
    st.session_state.model_spec = new_spec
    set_error("model", None)
    return out


def commit_mesh(text: str) -> bool:
    try:
        m = cached.mesh_of(text)
    except tc.ToastError as exc:
        set_error("mesh", str(exc))
        return False
    st.session_state.mesh_text = str(m)
    set_error("mesh", None)
    return True


# -- per-model workspace and per-(model, mesh, hardware) search run -----------------------------


def workspace(key: str | None = None) -> dict:
    key = key or spec().key
    return st.session_state.workspaces.setdefault(key, {"pins": [], "imported": {}})


def run_key() -> tuple[str, str, str]:
    return (spec().key, mesh_text(), hardware_name())


def run_slot(key: tuple | None = None) -> dict:
    key = key or run_key()
    return st.session_state.runs.setdefault(
        key,
        {
            "status": "idle",  # idle | running | done | stopped | error
            "history": [],  # (iteration, elapsed_s, best_step_time_s, fits)
            "best": None,
            "best_step_time_s": None,
            "best_peak_bytes": None,
            "best_fits": None,
            "iteration": 0,
            "evaluations": 0,
            "tree_size": 0,
            "evals_per_s": 0.0,
            "elapsed_s": 0.0,
            "tree_top": (),  # the last event's top of the MCTS tree (TreeEdge records)
            "pins": [],
            "previous": None,  # {"strategy", "step_time_s", "peak_bytes", "fits", "pins"}
            "kept_previous": False,  # the last run did not beat the previous best
            "runs": 0,
        },
    )


#: Guards the run slots against two script runs at once: with Streamlit's fast reruns, a click
#: (Stop, or leaving the page) starts a new script run while the interrupted one is still between
#: two Streamlit calls, recording search events. Without it, the interrupted run could record
#: iteration 288 after the new run had drawn "Iterations 256" and settled the slot as stopped.
_slot_lock = threading.RLock()


def record_event(slot: dict, run: int, ev: tc.SearchEvent) -> bool:
    """Records a search event of run number `run` into its slot; False (nothing written) once
    that run is over: stopped, settled, or replaced by a newer run. The settled slot is then the
    one source of truth for everything the page shows about the run."""
    with _slot_lock:
        if slot["status"] != "running" or slot["runs"] != run:
            return False
        slot["history"].append((ev.iteration, ev.elapsed_s, ev.best_step_time_s, ev.best_fits))
        slot.update(
            best=ev.best_strategy,
            best_step_time_s=ev.best_step_time_s,
            best_peak_bytes=ev.best_peak_bytes,
            best_fits=ev.best_fits,
            iteration=ev.iteration,
            evaluations=ev.evaluations,
            tree_size=ev.tree_size,
            evals_per_s=ev.evals_per_s,
            elapsed_s=ev.elapsed_s,
            tree_top=ev.tree_top or slot.get("tree_top", ()),
        )
        return True


def finish_run(slot: dict, run: int) -> bool:
    """Marks run `run` done (keeping the better best); False if it was stopped meanwhile."""
    with _slot_lock:
        if slot["status"] != "running" or slot["runs"] != run:
            return False
        slot["status"] = "done"
        keep_better(slot)
        return True


def iterations_shown(slot: dict) -> str | int:
    """Before the tree search starts (iteration 0 of a running search) the search is scoring
    the baselines and descending greedily from them, which takes seconds on large models."""
    if slot["status"] == "running" and slot["iteration"] == 0:
        return "seeding"
    return slot["iteration"]


def _rank(fits: bool | None, step_time_s: float | None) -> tuple:
    return (not fits, step_time_s if step_time_s is not None else float("inf"))


def best_record(slot: dict) -> dict:
    """The slot's best plan as a record (what "previous" keeps)."""
    return {
        "strategy": slot["best"],
        "step_time_s": slot["best_step_time_s"],
        "peak_bytes": slot["best_peak_bytes"],
        "fits": slot["best_fits"],
        "pins": list(slot["pins"]),
    }


def keep_better(slot: dict) -> None:
    """After a run (finished or stopped): if the previous best, found under the same pins, beats
    the new one, it stays the search best and the new run's best becomes the previous one; the
    search best is always the best plan found for these pins, not merely the latest."""
    prev = slot["previous"]
    slot["kept_previous"] = False
    if prev is None or slot["best"] is None or prev["pins"] != slot["pins"]:
        return
    if _rank(prev.get("fits"), prev["step_time_s"]) >= _rank(
        slot["best_fits"], slot["best_step_time_s"]
    ):
        return
    slot["previous"] = best_record(slot)
    slot.update(
        best=prev["strategy"],
        best_step_time_s=prev["step_time_s"],
        best_peak_bytes=prev["peak_bytes"],
        best_fits=prev.get("fits"),
        kept_previous=True,
    )


def settle_interrupted(slot: dict) -> bool:
    """A run still marked running was interrupted (Stop, or the user left the Search page, as
    Streamlit runs one page at a time): mark it stopped, keep the better best. True if it was."""
    with _slot_lock:
        if slot["status"] != "running":
            return False
        slot["status"] = "stopped"
        keep_better(slot)
        return True


def settle_all_interrupted() -> list[tuple]:
    """Settles every interrupted run; returns their run keys."""
    return [key for key, slot in st.session_state.runs.items() if settle_interrupted(slot)]


def load_lesson(lesson_spec: ModelSpec, mesh_text_: str, hardware_: str, pins: list[str]) -> bool:
    """Sets up a lesson's model, mesh, hardware and pins (all or nothing)."""
    loaded_ = commit_model(lesson_spec)
    if loaded_ is None or not commit_mesh(mesh_text_):
        return False
    st.session_state.hardware = hardware_
    set_setting("mesh_input", mesh_text())
    set_setting("hardware_input", hardware_)
    set_setting("source", "Zoo model")
    set_setting("zoo_model", lesson_spec.model)
    set_setting("zoo_size", lesson_spec.size)
    set_setting("zoo_train", lesson_spec.train)
    workspace()["pins"] = list(pins)
    return True
