"""A subprocess that runs fuzz tasks, so that an XLA crash kills it, not the fuzzer.

Protocol: one JSON task per line on stdin, JSON events per line on stdout.

* `{"task": "program", "seed", "index", "meshes", "validate_meshes", "num_simulations",
  "max_ops"}` generates the program (checked under plain `jax.jit`) and runs the pipeline:
  events `{"event": "program", ...}`, `{"event": "stage", "stage": "validate 2x4 search"}` before
  each XLA compile, `{"event": "outcome", ...}` per outcome, then `{"event": "done"}`.
* `{"task": "abort"}` dies by SIGABRT after announcing a stage (tests the parent's handling).
* `{"task": "reproduce", "program": <Program.to_dict()>, "outcome": <Outcome.to_dict()>}` runs
  `pipeline.reproduce`: `{"event": "result", "outcome": ... or null}` then `{"event": "done"}`.

`WorkerPool`/`Worker` (the parent side) restart a worker that died and turn its death into a
crash outcome at the stage it announced last.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

WORKER_DEATH = "WorkerDied"


def _serve() -> None:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    out = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout = sys.stderr  # anything printed by JAX or a program must not break the protocol
    import warnings

    warnings.filterwarnings("ignore")
    from fuzz import pipeline
    from fuzz.programs import Program, generate

    def send(**event) -> None:
        out.write(json.dumps(event, default=str) + "\n")
        out.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        try:
            if task["task"] == "program":
                t0 = time.perf_counter()
                send(event="stage", stage="generate")
                try:
                    prog = generate(
                        task["seed"], task["index"], max_ops=task.get("max_ops", 10), check="run"
                    )
                except RuntimeError as exc:
                    send(event="program", error=str(exc))
                    continue
                send(
                    event="program",
                    spec=prog.to_dict(),
                    mode=prog.mode,
                    ops=prog.ops(),
                    generate_s=time.perf_counter() - t0,
                )
                send(event="stage", stage="front")
                for o in pipeline.run_program(
                    prog,
                    task["meshes"],
                    task["validate_meshes"],
                    num_simulations=task.get("num_simulations", 24),
                    announce=lambda stage: send(event="stage", stage=stage),
                ):
                    send(event="outcome", outcome=o.to_dict())
            elif task["task"] == "abort":  # how the tests check that a death is recorded
                send(event="stage", stage="validate test abort")
                os.abort()
            elif task["task"] == "reproduce":
                prog = Program.from_dict(task["program"])
                want = pipeline.Outcome(**task["outcome"])
                if want.stage == "validate":
                    send(event="stage", stage=f"validate {want.mesh} {want.strategy}")
                got = pipeline.reproduce(
                    prog, want, num_simulations=task.get("num_simulations", 24)
                )
                send(event="result", outcome=got.to_dict() if got else None)
        except Exception as exc:  # noqa: BLE001 - a bug of the fuzzer itself: report, go on
            send(event="fuzzer_error", error=f"{type(exc).__name__}: {exc}")
        finally:
            send(event="done")


class Worker:
    """Parent side of one worker process (restarted after a death or a timeout)."""

    def __init__(self, cwd: str | None = None, log_path: str | None = None):
        self.cwd, self.log_path = cwd, log_path
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def _start(self) -> None:
        env = dict(os.environ)
        env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [self.cwd or os.getcwd(), env.get("PYTHONPATH")])
        )
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fuzz.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=self.cwd,
            env=env,
        )
        self.buf = b""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()  # our own child, by its handle
            self.proc.wait()
        self.proc = None

    def run(self, task: dict, timeout_s: float) -> tuple[list[dict], str | None]:
        """Events of one task, and None or why it ended early ("SIGSEGV", "timeout ...")."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc and self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write((json.dumps(task) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return [], self._death()
        events: list[dict] = []
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                ev = json.loads(line)
                if ev.get("event") == "done":
                    return events, None
                events.append(ev)
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                return events, f"timeout after {timeout_s:.0f} s"
            ready, _, _ = select.select([fd], [], [], min(left, 5.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return events, self._death()
                self.buf += chunk

    def _death(self) -> str:
        assert self.proc
        code = self.proc.wait()
        self.proc = None
        if code < 0:
            try:
                return signal.Signals(-code).name
            except ValueError:
                return f"signal {-code}"
        return f"exit {code}"


if __name__ == "__main__":
    _serve()
