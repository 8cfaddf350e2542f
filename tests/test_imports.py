"""The architecture, enforced: who may import whom (STYLE.md "Architecture").

* Only `toast_core/ir/trace.py` touches JAX internals (`jax.extend`, `jax._src`, `jax.core`).
* The core never imports the explorer's libraries (streamlit, plotly, graphviz) or `app`.
* Layers point one way: ir <- analysis <- strategy <- cost <- search (apply sits on top).
* The mesh specs import nothing of the core but errors; the core never imports the zoo
  (`demos`), except the `toast` command line, which resolves zoo names.
* The explorer (`app/`) reads the public API (`toast_core` and its public modules), never JAX
  internals or the core's inner modules.

Imports inside functions count too: every `import` statement of a module is checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "toast_core"
JAX_INTERNALS = ("jax.extend", "jax._src", "jax.core", "jaxlib")
UI_LIBRARIES = ("streamlit", "plotly", "graphviz", "app")
# package -> packages of toast_core it must not import
FORBIDDEN_LAYERS = {
    "ir": ("analysis", "strategy", "cost", "search", "apply"),
    "analysis": ("strategy", "cost", "search", "apply"),
    "strategy": ("cost", "search", "apply"),
    "cost": ("search", "apply"),
    "mesh": ("ir", "analysis", "strategy", "cost", "search", "apply"),
}
#: What the explorer may import of the core.
PUBLIC_MODULES = ("toast_core", "toast_core.fmt", "toast_core.targets", "toast_core.errors")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative imports resolved;
    `from jax import core` yields both `jax` and `jax.core`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def is_under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def python_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


def violations(files, rule, root: Path = ROOT) -> list[str]:
    """Every (file:line imports module) for which `rule(file, module)` is True, all at once."""
    out = []
    for path in files:
        for line, name in imports_of(path, root):
            if rule(path, name):
                out.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(set(out))


def test_the_walk_sees_the_core_and_resolves_imports():
    files = python_files(CORE)
    assert CORE / "ir" / "trace.py" in files and len(files) > 20
    names = {name for _, name in imports_of(CORE / "ir" / "trace.py")}
    assert "jax.extend.core" in names and "toast_core.ir.program" in names
    assert "jax._src.source_info_util" in names  # a lazy import inside a function counts


def test_relative_imports_resolve(tmp_path):
    pkg = tmp_path / "toast_core" / "analysis"
    pkg.mkdir(parents=True)
    probe = pkg / "probe.py"
    probe.write_text("from ..strategy import layout\nfrom . import rules\nfrom jax import core\n")
    names = {name for _, name in imports_of(probe, tmp_path)}
    assert {"toast_core.strategy.layout", "toast_core.analysis.rules", "jax.core"} <= names


def test_only_the_tracer_touches_jax_internals():
    tracer = CORE / "ir" / "trace.py"
    found = violations(
        python_files(CORE), lambda path, name: path != tracer and is_under(name, JAX_INTERNALS)
    )
    assert not found, "\n".join(found)


def test_the_core_never_imports_the_explorer():
    found = violations(python_files(CORE), lambda path, name: is_under(name, UI_LIBRARIES))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_LAYERS))
def test_layers_import_one_way(layer):
    forbidden = tuple(f"toast_core.{p}" for p in FORBIDDEN_LAYERS[layer])
    files = python_files(CORE / layer)
    assert files
    found = violations(files, lambda path, name: is_under(name, forbidden))
    assert not found, "\n".join(found)


def test_the_explorer_does_not_read_jax_internals():
    app = ROOT / "app"
    if not app.exists():
        pytest.skip("no app/ in this checkout")
    found = violations(python_files(app), lambda path, name: is_under(name, JAX_INTERNALS))
    assert not found, "\n".join(found)


def test_the_core_never_imports_the_zoo_but_in_the_cli():
    cli = CORE / "cli"
    found = violations(
        python_files(CORE),
        lambda path, name: cli not in path.parents and is_under(name, ("demos",)),
    )
    assert not found, "\n".join(found)


def test_the_explorer_reads_only_the_public_api():
    def deep(path, name):
        if not is_under(name, ("toast_core",)):
            return False
        # `from toast_core import fmt` names a public module; `from toast_core.x import y`
        # yields both toast_core.x and toast_core.x.y: judge the module part.
        return not any(
            name == p or name.startswith(p + ".") and name.count(".") == p.count(".") + 1
            for p in PUBLIC_MODULES
        )

    found = violations(python_files(ROOT / "app"), deep)
    assert not found, "\n".join(found)


def test_a_violation_is_reported_with_its_place(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\ndef f():\n    from jax._src import core\n")
    found = violations([bad], lambda path, name: is_under(name, JAX_INTERNALS), tmp_path)
    assert found == ["bad.py:4 imports jax._src", "bad.py:4 imports jax._src.core"]


# --- one owner per fact (issue 13) -----------------------------------------------------------


def _grep(pattern: str, skip=()) -> list[str]:
    import re

    rx = re.compile(pattern)
    out = []
    for path in python_files(CORE) + python_files(ROOT / "app"):
        if path.relative_to(ROOT).as_posix() in skip:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if rx.search(line):
                out.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    return out


def test_mesh_axis_bits_are_read_only_in_axes_py():
    found = _grep(r">>\s*\w+\s*&\s*1", skip=("toast_core/strategy/axes.py",))
    assert not found, "\n".join(found)


def test_the_analysis_carries_no_mutable_cache():
    import dataclasses

    import toast_core as tc

    fields = {f.name: f.type for f in dataclasses.fields(tc.Analysis)}
    assert "cache" not in fields and not any("dict" in str(t) for t in fields.values())
    assert not _grep(r"ana\.cache|\.cache\[")


def test_pins_are_parsed_only_by_the_pin_grammar():
    """The app and CLI hand pin texts to the core as they are (forbids among them)."""
    found = _grep(
        r"startswith\(\"!\"\)|split_pins|split\(\"!\"\)", skip=("toast_core/strategy/pins.py",)
    )
    assert not found, "\n".join(found)
