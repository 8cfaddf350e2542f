"""Pricing a large program's baselines in a separate process, at a lower CPU priority.

Why a process: the explorer priced the baselines of the model just loaded in a background
thread (~5 s of CPU on llama3-70b for a mesh: `tc.baselines.all` 3.6 s in one call, the first
estimate 1 s, the others 0.1 s), and Python threads share one interpreter lock, so a page run
beside it got about half the CPU it would have had: the first Search visit after loading
llama3-70b took 2.9 s instead of 1.2 s, even with the thread waiting between baselines while a
page ran (it cannot stop inside one call). A process has no such lock, and its `nice` makes the
kernel give the pages' process the CPU first while a page runs; the worker takes what is left
the rest of the time (a user reading a page leaves nearly all of it).

How: one worker process per explorer process, a fresh interpreter (never a bare `fork`: JAX
runs threads of its own, which a forked child would inherit in a broken state). It is sent only
plain data (the model spec's fields, mesh text, hardware name), traces and analyzes the program
itself (`app.programs`, as the pages did; ~6 s of CPU more in all, import included), keeps the
last analysis for the next mesh or hardware, and sends back plain frozen dataclasses
(`Strategy`, `CostReport` summaries) and pickled full reports. Requests are served newest
first, and a newer one supersedes the one being priced: after loading a model and then changing
the mesh and the hardware, the current combination is priced first. The explorer (`app.cached`)
prices in a thread when the worker fails.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The worker's nice increment: while a page runs in the explorer's process, the kernel gives the
#: worker ~10 % of the CPU the two would share (weights 110 and 1024), and all of it otherwise.
NICE = 10

#: The worker keeps this many analyses (with one of llama3-70b it holds ~0.5 GB resident).
KEEP_ANALYSES = 1


# -- the worker process (no Streamlit imported here) --------------------------------------------

_analyses: dict[tuple, object] = {}


def _analysis(spec: dict):
    from app import programs  # imported in the worker only (it imports JAX)

    key = tuple(sorted(spec.items()))
    if key not in _analyses:
        while len(_analyses) >= KEEP_ANALYSES:
            _analyses.pop(next(iter(_analyses)))
        if spec["source"] == "file":
            _, ana = programs.user_file(spec["path"], spec["function"])
        else:
            _, ana = programs.zoo(spec["model"], spec["size"], spec["train"], spec["batch"])
        _analyses[key] = ana
    return _analyses[key]


class Superseded(Exception):
    """A newer request is waiting: the current one is dropped (the explorer queues it again)."""


def price(
    spec: dict, fingerprint: tuple, mesh_text: str, hw_name: str, superseded=lambda: False
) -> dict:
    """name -> (Strategy or None, reason it does not apply, summary, full report), for every
    baseline of `spec`'s program on the mesh (what `tc.baselines.all` and `tc.estimate` give).

    The summary is the CostReport without its per-op costs and memory timeline (its text, if
    the estimate failed; None if the baseline does not apply); the full report comes pickled,
    for the explorer to unpickle only if a page shows it: a llama3-70b report has 31k per-op
    costs, ~2 MB pickled and ~0.2 s to unpickle (seven of them: ~1.2 s, which a page run
    would share the interpreter lock with), against ~4 ms for its summary.

    Raises if this process's analysis differs from `fingerprint` (the explorer's): its
    strategies would name other named dims; raises `Superseded` between steps once
    `superseded()` says a newer request waits (after loading a model, the user changes the
    mesh within a second or two: the worker is then still tracing, and prices the new mesh
    first instead of spending ~6 s of CPU on the old one)."""
    import toast_core as tc
    from app import programs

    ana = _analysis(spec)
    if programs.fingerprint(ana) != tuple(fingerprint):
        raise tc.ToastError(
            f"expected the explorer's program {tuple(fingerprint)} in the pricing process, got "
            f"{programs.fingerprint(ana)}"
        )
    mesh, hw = tc.MeshSpec.parse(mesh_text), tc.hardware(hw_name)
    out = {}
    if superseded():
        raise Superseded
    for name, (strategy, reason) in tc.baselines.all(ana, mesh).items():
        if superseded():
            raise Superseded
        summary, full = None, None
        if strategy is not None:
            try:
                report = tc.estimate(ana, strategy, mesh, hw)
            except tc.ToastError as exc:
                summary = str(exc)
            else:
                summary = summarize(report)
                full = pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)
        out[name] = (strategy, reason, summary, full)
    return out


def summarize(report):
    """The report without its per-op costs and memory timeline (what tables of baselines read:
    step time, compute, communication, peak memory, fits, the collectives)."""
    return dataclasses.replace(report, op_costs=(), memory_timeline=())


def _watch(conn, key: tuple):
    """A `superseded()` for `price`: true once `("newer", key)` has come down the pipe."""
    dropped: list = []

    def superseded() -> bool:
        while not dropped and conn.poll():
            if conn.recv() == ("newer", key):
                dropped.append(key)
        return bool(dropped)

    return superseded


def _serve(conn) -> None:
    """The worker's loop: one request `(key, args)` at a time, until the explorer's end of the
    pipe closes (the explorer ended). `("newer", key)` while `key` is priced: drop it."""
    os.nice(NICE)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "newer":  # arrived after its request ended
            continue
        key, args = msg
        try:
            reply = ("done", price(*args, superseded=_watch(conn, key)), os.getpid())
        except Superseded:
            reply = ("superseded", "", os.getpid())
        except Exception as exc:  # noqa: BLE001 - sent back; the explorer prices in a thread then
            reply = ("failed", f"{type(exc).__name__}: {exc}", os.getpid())
        try:
            conn.send(reply)
        except OSError:
            return


# -- the explorer's side ------------------------------------------------------------------------

Done = Callable[[dict | None, str, int], None]  # (result or None, error text, worker pid)

_pending: list[tuple[tuple, tuple, Done]] = []  # (key, price's args, done), newest last
_cv = threading.Condition()
_worker: dict = {}  # "proc", "conn" while a worker runs; "dispatcher": the thread feeding it


def request(key: tuple, args: tuple, done: Done) -> None:
    """Queues `price(*args)` for the worker, ahead of the requests already waiting (and of the
    one being priced, which is dropped and queued again last); `done(result, error, pid)` is
    called from the dispatcher thread when it ends (result None and the error's text if it
    failed)."""
    with _cv:
        _pending.append((key, args, done))
        if "dispatcher" not in _worker:
            _worker["dispatcher"] = threading.Thread(
                target=_dispatch, name="toast-pricing", daemon=True
            )
            _worker["dispatcher"].start()
        _cv.notify()
    _supersede(key)


def promote(key: tuple) -> None:
    """Moves a queued request to the front (a page is waiting for it)."""
    with _cv:
        for i, item in enumerate(_pending):
            if item[0] == key:
                _pending.append(_pending.pop(i))
                break
        else:
            return
    _supersede(key)


def _supersede(key: tuple) -> None:
    """Tells the worker to drop what it prices unless that is `key`."""
    with _cv:
        busy = _worker.get("busy")
        if busy is None or busy == key:
            return
        with _worker["send"]:
            try:
                _worker["conn"].send(("newer", busy))
            except OSError:
                pass  # the dispatcher sees the worker's end


def _connection():
    """The worker's pipe, starting the worker if none runs.

    Started as `python -m app.pricing` (fork + exec, as multiprocessing's `spawn` does, with no
    Python run between the two), not through multiprocessing: its `spawn` re-runs the parent's
    main module in the child, which is Streamlit's command line, or pytest, or a user's script.
    The worker ends by itself when the explorer ends (its end of the pipe closes)."""
    proc = _worker.get("proc")
    if proc is None or proc.poll() is not None:
        to_worker, from_explorer = multiprocessing.Pipe()
        fd = from_explorer.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.pricing", str(fd)],
            cwd=ROOT,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # a user's file may print
        )
        from_explorer.close()
        _worker.update(proc=proc, conn=to_worker, send=threading.Lock())
    return _worker["conn"]


def _dispatch() -> None:
    while True:
        with _cv:
            _cv.wait_for(lambda: _pending)
            key, args, done = _pending.pop()
        try:
            with _cv:
                conn = _connection()
                with _worker["send"]:
                    conn.send((key, args))
                _worker["busy"] = key
            status, payload, pid = conn.recv()  # waits in the kernel, without the GIL
        except Exception as exc:  # noqa: BLE001 - the worker died (out of memory...): restart next
            proc = _worker.pop("proc", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
            status, payload, pid = "failed", f"the pricing process failed: {exc!r}", 0
        with _cv:
            _worker.pop("busy", None)
            if status == "superseded":
                _pending.insert(0, (key, args, done))
                continue
        try:
            done(payload if status == "done" else None, "" if status == "done" else payload, pid)
        except Exception:  # noqa: BLE001, S110 - a callback's failure must not stop the queue
            pass


def worker_pid() -> int | None:
    """The running worker's process id (None if none runs)."""
    proc = _worker.get("proc")
    return proc.pid if proc is not None and proc.poll() is None else None


if __name__ == "__main__":  # the worker: python -m app.pricing FD
    from multiprocessing.connection import Connection

    _serve(Connection(int(sys.argv[1])))
