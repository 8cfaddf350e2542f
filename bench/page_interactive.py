"""How long each explorer page takes to become interactive, on the default demo and llama3-70b.

"Interactive" = the script run finished (Streamlit's running indicator gone) after a click in the
sidebar; measured in Chromium via Playwright against a `streamlit run` server started here.
Each page is visited twice per model: the first visit computes what the page caches (baselines,
estimates), the second is what a user returning to it waits. Screenshots of the Strategy, Search
and Named dims pages go to artifacts/screenshots/<page>_<model>.png.

    /work/main/.venv/bin/python bench/page_interactive.py            # both models
    /work/main/.venv/bin/python bench/page_interactive.py --only llama

Model loading (trace + analysis, ~25 s for llama3-70b) happens once on the Model page and is
reported separately.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_browser import (  # noqa: E402 (reuses the browser test's server and helpers)
    CHROMIUM,
    CHROMIUM_ARGS,
    SHOTS,
    choose,
    idle,
    run_search,
    screenshot,
    server,
)

PAGES = ("Named dims", "Search", "Strategy", "Validate", "Export", "Learn", "Model")
SHOT = {"Named dims": "named_dims", "Search": "search", "Strategy": "strategy"}


SCRIPT_STATE = "() => document.querySelector(\"[data-testid='stApp']\")?.dataset.testScriptState"
QUIET_S = 0.6  # not running for this long after the click = the run finished (not yet started)


def until_finished(pg, start: float) -> float:
    """Seconds from `start` until the script run finished (Streamlit's `stApp` element carries
    the script state in `data-test-script-state`)."""
    finished_at, seen_running = None, False
    while True:
        running = pg.evaluate(SCRIPT_STATE) == "running"
        now = time.perf_counter()
        seen_running = seen_running or running
        if running:
            finished_at = None
        elif finished_at is None:
            finished_at = now
        elif now - finished_at >= QUIET_S and (seen_running or now - start > 3):
            return finished_at - start
        pg.wait_for_timeout(30)


def timed_nav(pg, label: str) -> float:
    start = time.perf_counter()
    pg.locator("[data-testid='stSidebarNav']").get_by_text(label, exact=True).click()
    return until_finished(pg, start)


def load_llama(pg) -> float:
    timed_nav(pg, "Model")
    choose(pg, "w-zoo_model", "llama")
    choose(pg, "w-zoo_size", "llama3-70b")
    start = time.perf_counter()
    pg.locator(".st-key-load_zoo button").click()
    idle(pg)
    pg.get_by_text("Loaded llama llama3-70b").wait_for(timeout=300_000)
    took = time.perf_counter() - start
    box = pg.locator(".st-key-w-mesh_input input")
    box.fill("data=8,fsdp=8,model=8")
    box.press("Enter")
    idle(pg)
    choose(pg, "w-hardware_input", "tpu-v5p")
    return took


def measure(pg, tag: str, search_s: str) -> dict:
    out = {}
    for label in PAGES:
        first = timed_nav(pg, label)
        if label == "Search":
            run_search(pg, search_s)
        second = timed_nav(pg, "Model"), timed_nav(pg, label)
        out[label] = {"first_s": round(first, 2), "again_s": round(second[1], 2)}
        if label in SHOT:
            screenshot(pg, f"{SHOT[label]}_{tag}")
    return out


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["default", "llama"])
    args = ap.parse_args()
    SHOTS.mkdir(parents=True, exist_ok=True)
    results = {}
    gen = server.__wrapped__()
    url = next(gen)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.set_default_timeout(120_000)
            pg.goto(url)
            idle(pg)
            if args.only != "llama":
                results["default"] = measure(pg, "default", "5")
            if args.only != "default":
                results["llama3-70b load_s"] = round(load_llama(pg), 1)
                results["llama3-70b"] = measure(pg, "llama3_70b", "20")
            browser.close()
    finally:
        gen.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
