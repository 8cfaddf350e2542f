"""What every `toast` command shares: loading a target, parsing the common arguments, tables,
the strategy a command works on."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from toast_core.fmt import fmt_bytes, fmt_s

DEFAULT_MESH = "data=2,model=4"
DEFAULT_HARDWARE = "tpu-v5e"


class CliError(Exception):
    pass


def parse_budget(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*", text or "")
    if not m:
        raise CliError(f"expected a time budget such as 10s, 500ms or 2m, got `--budget={text}`")
    value = float(m.group(1))
    unit = m.group(2) or "s"
    return value / 1000 if unit == "ms" else value * 60 if unit in ("m", "min") else value


def load_target(target: str, size: str, forward: bool):
    """(fn, args, param_argnums, name) for a zoo name or `file.py:function`."""
    from demos import MODEL_ZOO
    from toast_core.targets import load_user_function, split_target

    if user_path(target) is not None:
        path, function = split_target(target)
        made = load_user_function(path, function)
        return made.fn, made.args, made.param_argnums, function
    if target not in MODEL_ZOO:
        raise CliError(
            f"expected a zoo model ({', '.join(sorted(MODEL_ZOO))}) or file.py:function, "
            f"got `TARGET={target}`"
        )
    try:
        w = MODEL_ZOO[target](size=size, train=not forward)
    except (ValueError, TypeError) as exc:
        raise CliError(str(exc)) from None
    return w.fn, tuple(w.args), w.param_argnums, w.name


def user_path(target: str) -> str | None:
    """The file of a `file.py:function` target, None for a zoo name."""
    if ":" in target and target.split(":", 1)[0].endswith(".py"):
        return target.rsplit(":", 1)[0]
    return None


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def analyze_target(args):
    import toast_core as tc
    from toast_core.targets import where

    fn, ex_args, argnums, name = load_target(args.target, args.size, args.forward)
    try:
        prog = tc.trace(fn, *ex_args, param_argnums=argnums)
    except tc.TraceError as exc:
        path = user_path(args.target)
        if path is None:
            raise
        raise CliError(f"{where(path, exc.__cause__ or exc)}: {exc}") from None
    t0 = time.perf_counter()
    ana = tc.analyze(prog)
    return fn, ex_args, ana, time.perf_counter() - t0


def mesh_and_hardware(args):
    import toast_core as tc

    return tc.MeshSpec.parse(args.mesh), tc.hardware(args.hardware)


def report_row(name, r):
    return [
        name,
        fmt_s(r.step_time_s),
        fmt_s(r.compute_s),
        fmt_s(r.comm_s),
        fmt_bytes(r.peak_bytes),
        "yes" if r.fits else "NO",
        f"{r.efficiency:.1%}",
    ]


def simulate_devices(n: int) -> None:
    """Asks XLA's CPU backend for `n` simulated devices (at least 8), unless the user chose."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={max(n, 8)}"


def status_line(text: str, args) -> None:
    if not args.json and (sys.stderr.isatty() or os.environ.get("TOAST_PROGRESS")):
        print(f"\r{text}", end="", file=sys.stderr, flush=True)


def strategy_doc(path_text: str) -> tuple[str, dict]:
    """The text of a strategy JSON file and its parsed document ({} if it does not parse: the
    strategy parser then reports it, naming the problem)."""
    path = Path(path_text)
    if not path.is_file():
        raise CliError(f"expected a strategy JSON file, got `--strategy={path_text}`")
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = {}
    return text, doc if isinstance(doc, dict) else {}


def plan_mesh(args, doc: dict) -> str:
    """The mesh to validate or explain on: --mesh, else the mesh stored in the strategy file, else the
    default; a --mesh that disagrees with the stored one is an error (the plan was priced and
    searched for its own mesh, and its named dims may not divide another one)."""
    import toast_core as tc

    stored = doc.get("mesh")
    stored_text = (
        ",".join(f"{k}={v}" for k, v in stored.items()) if isinstance(stored, dict) else None
    )
    if args.mesh is None:
        return stored_text or DEFAULT_MESH
    if stored_text is not None:
        given, saved = tc.MeshSpec.parse(args.mesh), tc.MeshSpec.parse(stored_text)
        if given.axes != saved.axes:
            raise CliError(
                f"expected the mesh stored in {args.strategy} ({saved}) or no --mesh, "
                f"got `--mesh={args.mesh}`"
            )
    return args.mesh


def strategy_arg(args, ana, mesh, text: str):
    """The strategy of `--strategy FILE` (its text) or `--baseline NAME`."""
    import toast_core as tc

    if args.strategy:
        return tc.Strategy.from_json(text, ana)
    baselines = tc.baselines.all(ana, mesh)
    if args.baseline not in baselines:
        raise CliError(
            f"expected a baseline ({', '.join(baselines)}), got `--baseline={args.baseline}`"
        )
    strategy, why = baselines[args.baseline]
    if strategy is None:
        raise CliError(f"baseline {args.baseline} does not apply: {why}")
    return strategy
