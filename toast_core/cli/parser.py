"""The `toast` argument parser and dispatch."""

from __future__ import annotations

import argparse
import os
import sys

from toast_core.cli.analyze import cmd_analyze
from toast_core.cli.common import (
    DEFAULT_HARDWARE,
    DEFAULT_MESH,
    CliError,
)
from toast_core.cli.plans import cmd_compare, cmd_explain, cmd_validate
from toast_core.cli.search import cmd_fit, cmd_search
from toast_core.cli.sweep import cmd_sweep


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error format (`toast: error: ...`, exit status 2)."""

    def error(self, message: str):
        print(f"toast: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="toast", description="TOAST auto-sharding for JAX programs")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("analyze", "named dims and conflicts"),
        ("search", "MCTS search for a strategy"),
        ("compare", "baseline strategies side by side"),
        ("validate", "compile a strategy with XLA and compare with the prediction"),
        ("explain", "what if each decision of a strategy changed: step time, memory, collectives"),
        ("sweep", "search many targets x meshes x hardware presets in parallel"),
        ("fit", "the fewest devices (a power of two) with a plan that fits memory"),
    ):
        s = sub.add_parser(name, help=help_text)
        s.add_argument(
            "target",
            nargs="+" if name == "sweep" else None,
            help="zoo model name or path/to/file.py:function",
        )
        s.add_argument("--size", default="tiny", help="zoo model size (default tiny)")
        s.add_argument(
            "--forward", action="store_true", help="zoo model forward pass, not a train step"
        )
        s.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "sweep":
            s.add_argument("--mesh", action="append", help="mesh axes (repeat for several)")
            s.add_argument("--hardware", action="append", help="hardware preset (repeat)")
        elif name == "fit":
            pass
        elif name in ("validate", "explain"):
            s.add_argument(
                "--mesh",
                default=None,
                help="mesh axes, e.g. data=4,model=2 (default: the mesh stored in --strategy, "
                f"else {DEFAULT_MESH})",
            )
        elif name != "analyze":
            s.add_argument(
                "--mesh",
                default=DEFAULT_MESH,
                help=f"mesh axes, e.g. data=4,model=2 (default {DEFAULT_MESH})",
            )
        if name not in ("analyze", "sweep"):
            s.add_argument(
                "--hardware",
                default=DEFAULT_HARDWARE,
                help=f"hardware preset (default {DEFAULT_HARDWARE})",
            )
        if name in ("search", "sweep"):
            s.add_argument(
                "--workers", type=int, default=1 if name == "search" else None, help="processes"
            )
        if name == "sweep":
            s.add_argument("--budget", default=None, help="time budget per case, e.g. 5s")
            s.add_argument("--simulations", type=int, default=None, help="simulations per case")
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--ray", default=None, help="run on a Ray cluster: auto or ADDRESS")
        if name == "fit":
            s.add_argument("--budget", default="30s", help="search time per device count")
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--max-devices", type=int, default=1 << 16, dest="max_devices")
        if name == "search":
            s.add_argument("--budget", default=None, help="time budget, e.g. 10s (default 10s)")
            s.add_argument("--simulations", type=int, default=None, help="simulation budget")
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--pin", action="append", help="pin, e.g. N3@model or K2=0")
            s.add_argument("--forbid", action="append", help="forbid, e.g. !N3@data")
            s.add_argument(
                "--verify",
                type=int,
                default=None,
                help="compile the K best plans with XLA (within the budget again) and keep the "
                "best as XLA judges it (default 3 with a time budget, 0 with --simulations only)",
            )
            s.add_argument(
                "--out", help="write the strategy JSON here (a .py name: a module that applies it)"
            )
            s.add_argument(
                "--devices",
                type=int,
                default=None,
                help="rank the mesh shapes of this many devices (instead of --mesh)",
            )
        if name in ("validate", "explain"):
            s.add_argument("--strategy", help="strategy JSON (from toast search --out)")
            s.add_argument(
                "--baseline",
                default="data_parallel",
                help=f"baseline to {name} when no --strategy is given",
            )
        if name == "explain":
            s.add_argument("--top", type=int, default=25, help="rows to show (default 25)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("search", "sweep") and args.budget is None and args.simulations is None:
        args.budget = "10s"
    from toast_core.errors import ToastError

    try:
        return {
            "analyze": cmd_analyze,
            "search": cmd_search,
            "compare": cmd_compare,
            "validate": cmd_validate,
            "explain": cmd_explain,
            "sweep": cmd_sweep,
            "fit": cmd_fit,
        }[args.command](args)
    except (CliError, ToastError) as exc:
        print(f"toast: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - e.g. the user's function failing when run by XLA
        if os.environ.get("TOAST_DEBUG"):
            raise
        print(
            f"toast: error: {type(exc).__name__}: {_one_line(str(exc), 300)} "
            "(set TOAST_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line(text: str, limit: int = 2000) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
