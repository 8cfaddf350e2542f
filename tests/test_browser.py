"""The explorer's main flow in a real browser: Playwright driving Debian's Chromium against a
`streamlit run` server started by the test.

Flow, on the default demo (GPT-2 small shapes) as a new user finds it: the named dims graph
renders as SVG with a conflict in red, and an op picked in the ops table shows in it; a search streams into the plotly progress chart and ends
with a sharded plan faster than every baseline; a pin made from the selectboxes survives a
re-search, which Stop ends with its best kept (and the iteration it names is the one shown); the
plan's numerics check out on the scaled-down twin (Validate); the exported strategy JSON parses
(from the download and from the code block) and holds the pin. Nothing is fetched from outside
the explorer's own server (the machine may be offline), there is no "Deploy" button, and
uploading a model file leaves the "File and function" box as the user typed it.
A full-page screenshot of every page goes to artifacts/screenshots/<page>.png.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
RED = "#d62728"  # app.charts.CONFLICT_LINE
GOLD = "#e8a400"  # app.charts.HIGHLIGHT_LINE
#: Whether a script run is going on: Streamlit's app root carries its state (the status widget,
#: the usual tell, is hidden with the toolbar).
SCRIPT_RUNNING = (
    "() => document.querySelector(\"[data-testid='stApp']\")?.dataset.testScriptState === 'running'"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    SHOTS.mkdir(parents=True, exist_ok=True)
    log = open(ROOT / "artifacts" / "streamlit_test_server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "streamlit", "run", "app/streamlit_app.py",
            "--server.headless", "true",
            "--server.address", "127.0.0.1",
            "--server.port", str(port),
            "--browser.gatherUsageStats", "false",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"streamlit did not start (exit {proc.poll()})")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(
            viewport={"width": 1400, "height": 1000}, accept_downloads=True
        )
        pg = context.new_page()
        pg.set_default_timeout(60_000)
        yield pg
        context.close()
        browser.close()


def idle(pg) -> None:
    """Waits until the script run finished (the running indicator is gone)."""
    pg.wait_for_timeout(300)
    # The script state on the app root (the status widget is hidden with the toolbar).
    pg.wait_for_selector(
        "[data-testid='stApp']:not([data-test-script-state='running'])", timeout=90_000
    )
    pg.wait_for_timeout(200)


def screenshot(pg, name: str) -> Path:
    """A full-page screenshot: Streamlit scrolls inside its main block, so the viewport is grown
    to the content's height first."""
    js = (
        "() => { const m = document.querySelector('[data-testid=\"stMain\"]');"
        " const b = m && m.querySelector('[data-testid=\"stMainBlockContainer\"]');"
        " return Math.max(b ? b.scrollHeight + 100 : 0, m ? m.scrollHeight : 0); }"
    )
    height = 0
    for _ in range(4):
        h = int(pg.evaluate(js))
        if h <= height:
            break
        height = h
        pg.set_viewport_size({"width": 1400, "height": min(height + 40, 16000)})
        pg.wait_for_timeout(500)
    path = SHOTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    pg.set_viewport_size({"width": 1400, "height": 1000})
    return path


def nav(pg, label: str) -> None:
    pg.locator("[data-testid='stSidebarNav']").get_by_text(label, exact=True).click()
    idle(pg)


def choose(pg, key: str, text: str) -> None:
    """Picks the option containing `text` in the selectbox with widget key `key`."""
    pg.locator(f".st-key-{key} [role='combobox']").click()
    pg.get_by_role("option").filter(has_text=text).first.click()
    idle(pg)


def progress_points(pg) -> int:
    return int(
        pg.evaluate(
            "() => { const p = document.querySelector('.js-plotly-plot');"
            " return p && p.data && p.data[0] ? p.data[0].x.length : 0; }"
        )
    )


def run_search(pg, budget_s: str) -> list[int]:
    """Runs a search and samples the live progress chart's number of points while it runs."""
    budget = pg.locator(".st-key-w-budget_s input")
    budget.fill(budget_s)
    budget.press("Enter")
    idle(pg)
    pg.locator(".st-key-run_search button").click()
    samples, seen_running = [], False
    deadline = time.time() + float(budget_s) + 30
    while time.time() < deadline:
        samples.append(progress_points(pg))
        running = pg.evaluate(SCRIPT_RUNNING)
        seen_running = seen_running or running
        if seen_running and not running:
            break
        pg.wait_for_timeout(150)
    idle(pg)
    samples.append(progress_points(pg))
    return samples


def metric(pg, label: str) -> str:
    box = pg.locator("[data-testid='stMetric']").filter(has_text=label).first
    return box.locator("[data-testid='stMetricValue']").inner_text().strip()


def chart_lines(pg) -> tuple[float, dict[str, float]]:
    """The progress chart's last best step time and each baseline line's step time."""
    data = pg.evaluate(
        "() => document.querySelector('.js-plotly-plot').data"
        ".map(t => ({name: t.name, y: t.y, visible: t.visible}))"
    )
    best = [y for y in data[0]["y"] if y is not None][-1]
    lines = {t["name"]: t["y"][0] for t in data[1:] if t.get("visible") != "legendonly"}
    return best, lines


def test_main_flow(page, server):
    from playwright.sync_api import expect

    pg = page
    outside: list[str] = []
    console_errors: list[str] = []
    pg.on(
        "request",
        lambda r: (
            outside.append(r.url)
            if not r.url.startswith((server, "data:", "blob:", "about:"))
            else None
        ),
    )
    pg.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    start = time.time()
    pg.goto(server)
    idle(pg)
    pg.get_by_text("Named dims", exact=True).first.wait_for()

    # Model: the default demo is loaded as is.
    pg.get_by_text("NDA turns").wait_for()
    idle(pg)
    assert pg.get_by_role("heading", name="gpt gpt2 (train step)").count() == 1
    assert pg.get_by_role("button", name="Deploy").count() == 0
    screenshot(pg, "model")

    # Named dims: the graph is an SVG, with a conflict drawn in red.
    nav(pg, "Named dims")
    svg = pg.locator("[data-testid='stGraphVizChart'] svg")
    svg.wait_for()
    assert svg.locator("g.node").count() >= 5
    red = svg.locator(f"g.node polygon[stroke='{RED}'], g.node path[stroke='{RED}']")
    assert red.count() >= 1
    assert "K0" in svg.text_content()
    screenshot(pg, "named_dims")
    # Pick an op in the ops table (its row marker): the graph draws it as a gold box linked to
    # its named dims, and its per-op view follows the graph.
    table = pg.locator(".st-key-op_table_0")
    table.scroll_into_view_if_needed()
    box = table.bounding_box()
    pg.mouse.move(box["x"] + 60, box["y"] + 35 + 17)  # hovering shows the row marker
    pg.mouse.click(box["x"] + 16, box["y"] + 35 + 17)
    idle(pg)
    gold = svg.locator(f"g.node polygon[stroke='{GOLD}']")
    gold.first.wait_for()
    assert pg.get_by_text("Per-op view").count() >= 1
    assert "(none)" not in pg.locator(".st-key-graph_op").inner_text()

    # Search: the chart updates live, and the plan found shards and beats every baseline.
    nav(pg, "Search")
    samples = run_search(pg, "5")
    assert max(samples) >= 3, samples
    assert len({s for s in samples if s}) >= 2, f"chart did not update live: {samples}"
    pg.get_by_text("Best strategy so far").wait_for()
    assert pg.get_by_text("Everything replicated").count() == 0
    best, lines = chart_lines(pg)
    assert lines and all(best < t for t in lines.values()), (best, lines)
    screenshot(pg, "search_default")

    # Pin the batch named dim on `data` from the selectboxes, and search again.
    choose(pg, "pin_dim", "targets.0")
    choose(pg, "pin_axes", "data")
    pg.locator(".st-key-add_dim_pin button").click()
    idle(pg)
    pin = pg.locator("[data-testid='stMain'] code").filter(has_text="@data").first.inner_text()
    assert pin.startswith("N") and pin.endswith("@data")
    # Re-search with a long budget, and stop it: the best so far is kept, with the pin.
    budget = pg.locator(".st-key-w-budget_s input")
    budget.fill("30")
    budget.press("Enter")
    idle(pg)
    pg.locator(".st-key-run_search button").click()
    pg.locator("[data-testid='stMetricValue']").filter(has_text="running").wait_for()
    deadline = time.time() + 40  # seeding (baselines, greedy descents) takes up to half the budget
    while time.time() < deadline and not metric(pg, "Iterations").isdigit():
        pg.wait_for_timeout(200)
    pg.wait_for_timeout(1500)  # into the tree search
    pg.locator(".st-key-stop_search button").click()
    idle(pg)
    # One source of truth: the Stop button's run settles the slot, and the interrupted run
    # records nothing after that, so the metric and the text name the same iteration.
    stopped = pg.get_by_text("Stopped at iteration").inner_text()
    assert stopped.split("iteration ")[1].split(";")[0] == metric(pg, "Iterations")
    pg.get_by_text("Versus the previous best").wait_for()
    assert pg.get_by_text(f"now: {pin}").count() == 1  # the pin was kept for the re-search
    assert pg.locator(".st-key-rm_pin_0").count() == 1
    screenshot(pg, "search")

    # Strategy: the search's best, with costs, memory and baselines.
    nav(pg, "Strategy")
    pg.get_by_text("Baselines side by side").wait_for()
    expect(pg.locator(".js-plotly-plot")).to_have_count(3, timeout=20_000)
    screenshot(pg, "strategy")

    # Validate: the plan's numerics on the scaled-down twin (the real size is shapes only).
    nav(pg, "Validate")
    pg.get_by_role("button", name="Check numerics on the twin").first.click()
    # About a minute alone (the twin compiled sharded and unsharded); more on a busy machine.
    pg.get_by_text("Numerics match the unsharded function").wait_for(timeout=400_000)
    idle(pg)
    screenshot(pg, "validate")

    nav(pg, "Learn")
    pg.get_by_text("What to look at").wait_for()
    screenshot(pg, "learn")

    # Export: the JSON holds the pinned decision, in the download and in the code block.
    nav(pg, "Export")
    with pg.expect_download() as download:
        pg.locator(".st-key-dl_json button").click()
    doc = json.loads(Path(download.value.path()).read_text())
    shown = json.loads(pg.locator("[data-testid='stCode'] code").first.inner_text())
    assert doc == shown
    dim, axis = pin.split("@")
    assert doc["shardings"][dim] == [axis]
    assert doc["mesh"] == {"data": 2, "model": 4}
    screenshot(pg, "export")
    # Offline-safe: every icon and font comes from the explorer's own server.
    assert not outside, outside
    assert not console_errors, console_errors
    assert time.time() - start < 600


def test_upload_keeps_the_file_and_function_box(page, server, tmp_path):
    pg = page
    model = tmp_path / "uploaded_model.py"
    model.write_text(
        "import jax.numpy as jnp\n\n\ndef make():\n"
        "    return (lambda x, w: jnp.tanh(x @ w)), (jnp.ones((8, 16)), jnp.ones((16, 4)))\n"
    )
    pg.goto(server)
    idle(pg)
    pg.get_by_text("Python file").click()
    idle(pg)
    box = pg.locator(".st-key-w-file_target input")
    box.fill("models/mine.py:make")
    box.press("Enter")
    idle(pg)
    pg.get_by_text("...or upload a file").click()
    pg.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(str(model))
    idle(pg)
    pg.locator(".st-key-load_upload button").click()
    idle(pg)
    # The sidebar names the committed model (the "Loaded ..." notice lasts one rerun only).
    pg.locator("[data-testid='stSidebar']").get_by_text("uploaded_model.py:make").wait_for()
    assert box.input_value() == "models/mine.py:make"
