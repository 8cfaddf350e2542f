"""Tracing and analyzing a model spec's program, without Streamlit.

One place for it, so that the pricing process (`app.pricing`) analyzes exactly the program the
pages analyzed (`app.cached` caches this; the pricing process imports no Streamlit)."""

from __future__ import annotations

import toast_core as tc
from app.user_model import UserCodeError, load_user_function, user_line
from demos import MODEL_ZOO, SIZES


def zoo(model: str, size: str, train: bool, batch: int = 0):
    """(workload, analysis) of a zoo model; `batch` 0 keeps the size's own batch."""
    if model not in MODEL_ZOO:
        raise tc.ToastError(f"expected a zoo model in {sorted(MODEL_ZOO)}, got `model={model!r}`")
    if size not in SIZES[model]:
        raise tc.ToastError(f"expected a size in {SIZES[model]}, got `size={size!r}`")
    if not batch:
        w = MODEL_ZOO[model](size=size, train=train)
    else:
        try:
            w = MODEL_ZOO[model](size=size, train=train, batch=batch)
        except (TypeError, ValueError) as exc:
            raise tc.ToastError(f"expected a model with a batch setting, got `{exc}`") from None
    prog = tc.trace(w.fn, *w.args, param_argnums=w.param_argnums)
    return w, tc.analyze(prog)


def user_file(path: str, function: str):
    """(user function, analysis) of a function in a user's file; a trace error names the file
    and line."""
    user = load_user_function(path, function)
    try:
        prog = tc.trace(user.fn, *user.args, param_argnums=user.param_argnums)
    except tc.TraceError as exc:
        line = user_line(exc, path)
        name = path.rsplit("/", 1)[-1]
        raise UserCodeError(f"{name}:{line}: {exc}" if line else f"{name}: {exc}") from None
    return user, tc.analyze(prog)


def fingerprint(ana: tc.Analysis) -> tuple[int, int, int]:
    """Ops, named dims and conflicts: two analyses of one spec must agree on these before one's
    strategies (named dims by name) are used with the other."""
    return len(ana.program.ops), len(ana.named_dims), len(ana.conflicts)
