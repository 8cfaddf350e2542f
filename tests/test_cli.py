"""The `toast` command line: analyze, compare, search, validate; and one-line errors on bad input."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import toast_core as tc
import toast_core.cli as cli
from demos import MODEL_ZOO

TOAST = Path(sys.executable).parent / "toast"
USER_FILE = textwrap.dedent(
    """
    import jax.numpy as jnp


    def f(w, x):
        return jnp.tanh(x @ w).sum()


    def make():
        return f, (jnp.ones((8, 16)), jnp.ones((4, 8)))


    def not_a_pair():
        return 3


    def raises():
        raise RuntimeError("no weights today")


    def fails_to_trace():
        def g(x):
            raise ValueError("cannot trace this")

        return g, (jnp.ones(3),)
    """
)


def line_of(text: str) -> int:
    """1-based line of `text` in the user file."""
    return next(i for i, line in enumerate(USER_FILE.splitlines(), 1) if text in line)


@functools.cache
def mlp_analysis() -> tc.Analysis:
    w = MODEL_ZOO["mlp"](size="tiny", train=True)
    return tc.analyze(tc.trace(w.fn, *w.args, param_argnums=w.param_argnums))


@pytest.fixture
def user_file(tmp_path) -> Path:
    path = tmp_path / "user_model.py"
    path.write_text(USER_FILE)
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *shown: str) -> None:
    assert code != 0
    assert err.startswith("toast: error: "), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    for text in shown:
        assert text in err, (text, err)


# -- analyze ----------------------------------------------------------------------------------


def test_analyze_human(capsys):
    code, out, err = run(capsys, "analyze", "mlp")
    assert code == 0 and err == ""
    s = mlp_analysis().summary()
    assert out.startswith(
        f"train_step: {s['ops']} ops, {s['tensor_dims']} tensor dims -> {s['named_dims']} named dims"
    )
    assert f"{s['conflicts']} conflicts" in out.splitlines()[0]
    assert "Named dims" in out and "Conflicts" in out
    for nd in mlp_analysis().named_dims:
        assert f"{nd.name} " in out and nd.label in out
    for c in mlp_analysis().conflicts:
        assert f"{c.name} [{c.kind}]" in out


def test_analyze_json(capsys):
    code, out, _ = run(capsys, "analyze", "mlp", "--json")
    assert code == 0
    doc = json.loads(out)
    ana = mlp_analysis()
    assert doc["summary"]["named_dims"] == len(doc["named_dims"]) == len(ana.named_dims)
    assert [d["name"] for d in doc["named_dims"]] == [nd.name for nd in ana.named_dims]
    assert [d["size"] for d in doc["named_dims"]] == [nd.size for nd in ana.named_dims]
    assert [(c["name"], c["kind"]) for c in doc["conflicts"]] == [
        (c.name, c.kind) for c in ana.conflicts
    ]
    assert all(c["options"] for c in doc["conflicts"])


def test_analyze_forward_and_size(capsys):
    code, out, _ = run(capsys, "analyze", "mlp", "--forward", "--json")
    assert code == 0
    assert json.loads(out)["summary"]["program"] == "forward"


def test_user_file_returning_fn_and_args(capsys, user_file):
    code, out, err = run(capsys, "analyze", f"{user_file}:make", "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["summary"]["program"] == "f"
    assert {d["size"] for d in doc["named_dims"]} >= {4, 8, 16}


# -- compare ----------------------------------------------------------------------------------


def test_compare_json_agrees_with_the_api(capsys):
    code, out, _ = run(
        capsys, "compare", "mlp", "--mesh", "data=8", "--hardware", "h100-80gb", "--json"
    )
    assert code == 0
    doc = json.loads(out)
    mesh, hw = tc.MeshSpec({"data": 8}), tc.hardware("h100-80gb")
    baselines = tc.baselines.all(mlp_analysis(), mesh)
    assert set(doc) == set(baselines)
    for name, (strategy, why) in baselines.items():
        if strategy is None:
            assert doc[name] == {"applicable": False, "reason": why}
            continue
        report = tc.estimate(mlp_analysis(), strategy, mesh, hw)
        assert doc[name]["applicable"]
        assert doc[name]["step_time_s"] == pytest.approx(report.step_time_s)
        assert doc[name]["peak_bytes"] == pytest.approx(report.peak_bytes)


def test_compare_human(capsys):
    code, out, _ = run(capsys, "compare", "mlp", "--mesh", "data=2,model=4")
    assert code == 0
    assert "train_step on data=2,model=4 of tpu-v5e" in out
    for name in ("replicated", "data_parallel", "fsdp", "megatron", "dp_megatron"):
        assert any(line.startswith(name) for line in out.splitlines()), name


# -- search then validate ---------------------------------------------------------------------


@pytest.mark.slow
def test_search_out_then_validate_strategy(capsys, tmp_path):
    ana = mlp_analysis()
    batch = f"N{ana.value_named_dims(next(v.id for v in ana.program.values if v.name == 'batch.x'))[0][0]}"
    path = tmp_path / "f.json"
    code, out, err = run(
        capsys,
        "search",
        "mlp",
        "--mesh",
        "data=2,model=4",
        "--budget",
        "1s",
        "--pin",
        f"{batch}@data",
        "--out",
        path,
    )
    assert code == 0, err
    assert f"saved {path}" in out and "Shardings (scaling-book notation)" in out
    strategy = tc.Strategy.from_json(path.read_text(), ana)
    assert strategy.axes_of(batch) == ("data",)
    assert json.loads(path.read_text())["mesh"] == {"data": 2, "model": 4}

    code, out, err = run(capsys, "validate", "mlp", "--mesh", "data=2,model=4", "--strategy", path)
    assert code == 0, err
    assert "numerics vs unsharded: OK" in out
    assert "flops per device" in out

    code, out, _ = run(
        capsys, "validate", "mlp", "--mesh", "data=2,model=4", "--strategy", path, "--json"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["numerics_ok"] is True
    assert doc["predicted_flops"] == pytest.approx(doc["compiled_flops"], rel=0.05)
    assert doc["predicted_collective_bytes"] == doc["compiled_collective_bytes"]


def test_search_json_with_a_simulation_budget(capsys):
    code, out, _ = run(
        capsys, "search", "mlp", "--simulations", "5", "--seed", "3", "--json", "--pin", "K0=0"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["strategy"]["schema"] == 1
    assert {"conflict": "K0", "option": 0} in doc["strategy"]["options"]
    assert doc["report"]["fits"] is True and doc["report"]["step_time_s"] > 0
    strategy = tc.Strategy.from_json(json.dumps(doc["strategy"]), mlp_analysis())
    mesh, hw = tc.MeshSpec({"data": 2, "model": 4}), tc.hardware("tpu-v5e")
    assert tc.estimate(mlp_analysis(), strategy, mesh, hw).step_time_s == pytest.approx(
        doc["report"]["step_time_s"]
    )


@pytest.mark.slow
def test_validate_a_baseline_of_a_user_file(capsys, user_file):
    code, out, err = run(
        capsys, "validate", f"{user_file}:make", "--mesh", "data=4", "--baseline", "data_parallel"
    )
    assert code == 0, err
    assert "data_parallel on data=4" in out and "numerics vs unsharded: OK" in out


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["analyze", "nosuch"], ["TARGET=nosuch", "gpt"]),
        (["analyze", "mlp", "--size", "huge"], ["size='huge'"]),
        (["compare", "mlp", "--mesh", "data=x"], ["mesh='data=x'"]),
        (["compare", "mlp", "--mesh", "data=0"], ["axes['data']=0"]),
        (["compare", "mlp", "--hardware", "tpu-v99"], ["hardware='tpu-v99'"]),
        (["search", "mlp", "--budget", "10q"], ["--budget=10q"]),
        (["search", "mlp", "--budget", "0s"], ["budget_s=0.0"]),
        (["search", "mlp", "--simulations", "-3"], ["num_simulations=-3"]),
        (["search", "mlp", "--simulations", "2", "--pin", "N3@@model"], ["pin='N3@@model'"]),
        (["search", "mlp", "--simulations", "2", "--pin", "N99@data"], ["pin='N99@data'"]),
        (
            ["search", "mlp", "--simulations", "2", "--pin", "K0=0", "--pin", "K0=1"],
            ["`K0=0`", "`K0=1`"],
        ),
        (["search", "mlp", "--simulations", "2", "--forbid", "!K9=0"], ["K9"]),
        (["validate", "mlp", "--strategy", "nofile.json"], ["--strategy=nofile.json"]),
        (["validate", "mlp", "--baseline", "nosuch"], ["--baseline=nosuch", "fsdp"]),
        (["validate", "mlp", "--mesh", "data=16"], ["16 devices", "8 available"]),
        (["analyze", "missing.py:make"], ["missing.py:make", "existing Python file"]),
    ],
)
def test_bad_input_is_one_line_naming_the_value(capsys, argv, shown):
    code, out, err = run(capsys, *argv)
    assert_one_line_error(code, err, *shown)
    assert code == 2


@pytest.mark.parametrize(
    ("function", "shown"),
    [
        ("nope", ["expected a function `nope`"]),
        ("not_a_pair", ["not_a_pair()", "(fn, example_args)", "int"]),
        ("raises", ["raises() raised RuntimeError: no weights today", f":{line_of('no weights')}"]),
        ("fails_to_trace", ["ValueError: cannot trace this", f":{line_of('cannot trace')}"]),
    ],
)
def test_bad_user_functions(capsys, user_file, function, shown):
    code, _, err = run(capsys, "analyze", f"{user_file}:{function}")
    assert_one_line_error(code, err, user_file.name, *shown)


def test_user_file_with_a_syntax_error(capsys, tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import jax\n\ndef make(:\n    pass\n")
    code, _, err = run(capsys, "analyze", f"{path}:make")
    assert_one_line_error(code, err, f"{path.name}:3", "SyntaxError")


def test_bad_strategy_json(capsys, tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"schema": 1, "shardings": {"N77": ["data"]}}')
    code, _, err = run(capsys, "validate", "mlp", "--strategy", path)
    assert_one_line_error(code, err, "N77")
    path.write_text("{oops")
    code, _, err = run(capsys, "validate", "mlp", "--strategy", path)
    assert_one_line_error(code, err, "{oops", "strategy JSON")


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["analyze"])
    _, err = capsys.readouterr()
    assert info.value.code == 2
    assert_one_line_error(2, err, "target")
    with pytest.raises(SystemExit):
        cli.main(["search", "mlp", "--bogus"])
    assert_one_line_error(2, capsys.readouterr()[1], "--bogus")


def test_unexpected_failures_are_one_line_too(capsys, monkeypatch):
    def explode(args):
        raise RuntimeError("something\nbroke")

    import toast_core.cli.parser as cli_main

    monkeypatch.setattr(cli_main, "cmd_compare", explode)
    code, _, err = run(capsys, "compare", "mlp")
    assert_one_line_error(code, err, "RuntimeError: something broke", "TOAST_DEBUG")
    assert code == 1


# -- the installed entry point ----------------------------------------------------------------


def toast(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TOAST), *map(str, argv)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.slow
def test_entry_point_errors_without_traceback(tmp_path):
    (tmp_path / "broken.py").write_text("def make(:\n")
    for argv, shown in (
        (["analyze", "nosuch"], "TARGET=nosuch"),
        (["analyze", "broken.py:make"], "broken.py:1"),
        (["search", "mlp", "--budget", "soon"], "--budget=soon"),
    ):
        done = toast(*argv, cwd=tmp_path)
        assert_one_line_error(done.returncode, done.stderr, shown)
        assert done.stdout == ""


@pytest.mark.slow
def test_entry_point_analyzes_a_user_file(tmp_path, user_file):
    done = toast("analyze", f"{user_file.name}:make", "--json", cwd=user_file.parent)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["program"] == "f"


# -- issue 12: stored meshes, defaults in --help, notes out of the table ---------------------


def test_compare_says_when_a_baseline_puts_the_batch_on_other_mesh_axes(capsys):
    code, out, _ = run(capsys, "compare", "gpt", "--mesh", "data=3,model=4")
    assert code == 0
    table, _, notes = out.partition("\nNotes\n")
    # data=3 does not divide the batch of 8: data parallel on `model` only, and it says so.
    assert "data_parallel: batch N5 (size 8) on model only" in notes
    assert "expert_parallel: not applicable: no stacked expert weights" in notes
    # Reasons stay out of the table: the efficiency column is as wide as its header.
    lines = table.splitlines()
    assert lines[2].split()[-1] == "-" * len("efficiency"), lines[2]
    assert "not applicable" not in table and "stacked" not in table
    code, out, _ = run(capsys, "compare", "gpt", "--mesh", "data=3,model=4", "--json")
    doc = json.loads(out)
    assert "on model only" in doc["data_parallel"]["note"]
    assert "note" not in doc["megatron"]


@pytest.mark.parametrize("command", ["search", "compare", "validate"])
def test_help_shows_the_default_mesh_and_hardware(capsys, command):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "data=2,model=4" in out and "(default tpu-v5e)" in out
    if command == "validate":
        assert "the mesh stored in --strategy" in out


def test_validate_refuses_a_mesh_other_than_the_strategys(capsys, tmp_path):
    path = tmp_path / "s.json"
    code, _, err = run(
        capsys, "search", "mlp", "--mesh", "data=4,model=2", "--simulations", "1", "--out", path
    )
    assert code == 0, err
    code, _, err = run(capsys, "validate", "mlp", "--strategy", path, "--mesh", "data=2,model=4")
    assert_one_line_error(code, err, "data=4,model=2", "`--mesh=data=2,model=4`")


@pytest.mark.slow
def test_validate_uses_the_mesh_stored_in_the_strategy(capsys, tmp_path):
    path = tmp_path / "s.json"
    code, _, err = run(
        capsys, "search", "mlp", "--mesh", "data=4,model=2", "--simulations", "1", "--out", path
    )
    assert code == 0, err
    code, out, err = run(capsys, "validate", "mlp", "--strategy", path)
    assert code == 0, err
    assert "on data=4,model=2: predicted vs XLA-compiled" in out


def test_search_devices_ranks_mesh_shapes(capsys):
    code, out, _ = run(capsys, "search", "mlp", "--devices", "4", "--budget", "1s", "--json")
    assert code == 0
    ranking = json.loads(out)["ranking"]
    assert [r["mesh"] for r in ranking] and all(
        sum(1 for _ in r["mesh"]) >= 1 and _n_devices(r["mesh"]) == 4 for r in ranking
    )
    code, _, err = run(capsys, "search", "mlp", "--devices", "0", "--budget", "1s")
    assert code == 2 and "devices=0" in err


def _n_devices(mesh: dict) -> int:
    n = 1
    for size in mesh.values():
        n *= size
    return n


def test_fit_reports_fewest_devices_and_why(capsys):
    code, out, _ = run(capsys, "fit", "gpt", "--hardware", "h100-80gb", "--budget", "1s", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["devices"] == 1 and doc["plan"]["fits"]
    assert doc["arithmetic"][0].startswith("weights ")
