"""Loading a user's model file, `path/to/file.py:function`, where `function()` returns
`(fn, example_args)` (optionally `(fn, example_args, param_argnums)`, or an object with `.fn` and
`.args` such as a demos `Workload`). Shared by the `toast` CLI and the explorer.

The file is Python code that runs in the calling process (the explorer binds to localhost for
that reason). Any failure of the user's code becomes a `UserCodeError` whose one-line message names
the file and the line (`model.py:12: NameError: name 'jnp' is not defined`), never a traceback.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from toast_core.errors import ToastError


class UserCodeError(ToastError):
    """The user's model file cannot be loaded, or its function fails."""


@dataclass(frozen=True)
class UserFunction:
    fn: object
    args: tuple
    param_argnums: tuple[int, ...] | None
    description: str


def split_target(target: str) -> tuple[str, str]:
    """`"models/m.py:make"` -> (absolute path, "make"); errors name the target."""
    text = (target or "").strip()
    if ":" not in text or not text.rsplit(":", 1)[0].endswith(".py"):
        raise UserCodeError(f"expected `path/to/file.py:function`, got `target={text!r}`")
    path, function = text.rsplit(":", 1)
    if not function.isidentifier():
        raise UserCodeError(f"expected a function name after ':', got `target={text!r}`")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserCodeError(f"expected an existing Python file, got `target={text!r}`")
    return str(p.resolve()), function


def file_digest(path: str) -> str:
    """Content hash, so an edited file is loaded again rather than served from the cache."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def user_line(exc: BaseException, path: str) -> int | None:
    """The last line of `path` in the exception's traceback (or its cause's), if any."""
    if isinstance(exc, SyntaxError) and exc.filename and _same(exc.filename, path):
        return exc.lineno
    line = None
    for e in (exc, exc.__cause__):
        tb = e.__traceback__ if e is not None else None
        while tb is not None:
            if _same(tb.tb_frame.f_code.co_filename, path):
                line = tb.tb_lineno
            tb = tb.tb_next
        if line is not None:
            return line
    return None


def where(path: str, exc: BaseException) -> str:
    line = user_line(exc, path)
    name = os.path.basename(path)
    return f"{name}:{line}" if line else name


def load_user_function(path: str, function: str) -> UserFunction:
    """Executes the file and calls `function()`; every failure is a one-line UserCodeError."""
    module_name = f"toast_user_{file_digest(path)}_{Path(path).stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"expected a Python source file, got `path={path!r}`")
    module = importlib.util.module_from_spec(spec)
    folder = str(Path(path).parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)  # the user's sibling modules import as they would from a script
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UserCodeError(
            f"{os.path.basename(path)}:{exc.lineno}: SyntaxError: {exc.msg}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        raise UserCodeError(f"{where(path, exc)}: {_one_line(exc)}") from None
    finally:
        if added:
            sys.path.remove(folder)
    maker = getattr(module, function, None)
    if not callable(maker):
        defined = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )[:8]
        raise UserCodeError(
            f"expected a function `{function}` in {os.path.basename(path)} "
            f"(it defines: {', '.join(defined) or 'nothing callable'})"
        )
    try:
        made = maker()
    except Exception as exc:  # noqa: BLE001
        raise UserCodeError(f"{where(path, exc)}: {function}() raised {_one_line(exc)}") from None
    return _as_user_function(made, function, path)


def _as_user_function(made, function: str, path: str) -> UserFunction:
    doc = f"{os.path.basename(path)}:{function}"
    if hasattr(made, "fn") and hasattr(made, "args"):
        return UserFunction(
            made.fn,
            tuple(made.args),
            getattr(made, "param_argnums", None),
            getattr(made, "description", "") or doc,
        )
    if isinstance(made, tuple) and len(made) in (2, 3) and callable(made[0]):
        args = tuple(made[1]) if isinstance(made[1], tuple | list) else (made[1],)
        argnums = tuple(made[2]) if len(made) == 3 else None
        return UserFunction(made[0], args, argnums, doc)
    raise UserCodeError(
        f"expected {function}() in {os.path.basename(path)} to return (fn, example_args), "
        f"got {type(made).__name__}"
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
