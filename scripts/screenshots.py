"""Screenshots of every explorer page, on the default demo and on llama3-70b.

Starts `streamlit run` (the browser test's server), drives Debian's Chromium with Playwright
(headless, never `playwright install`) and writes viewport screenshots (1280 x 900, the top of
each page, plus the graph with an op highlighted and one collapsed group drawn in full, and the
Strategy page's memory section) to artifacts/screenshots/<model>/<page>.png:

    /work/main/.venv/bin/python scripts/screenshots.py                # both models
    /work/main/.venv/bin/python scripts/screenshots.py --only default   # or llama, or fit

On each model: the Search page after a search (5 s on the default, 20 s on llama3-70b on mesh
data=8,fsdp=8,model=8, tpu-v5p), the Strategy page on its best plan, the Named dims graph with
the costliest matmul highlighted and its per-op view. llama3-70b takes ~25 s to load. Then a
case where nothing fits (GPT 1.3B on one TPU v5e): the "make it fit" panel priced, and the
same model's mesh-shape comparison on 8 devices (artifacts/screenshots/fit/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_browser import (  # noqa: E402 (reuses the browser test's server and helpers)
    CHROMIUM,
    CHROMIUM_ARGS,
    choose,
    idle,
    nav,
    run_search,
    server,
)

OUT = ROOT / "artifacts" / "screenshots"
VIEWPORT = {"width": 1280, "height": 900}
PAGES = ("Model", "Named dims", "Search", "Strategy", "Validate", "Learn", "Export")


def shot(pg, model: str, name: str) -> None:
    path = OUT / model / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    pg.wait_for_timeout(800)  # charts finish drawing after the script run
    pg.screenshot(path=str(path))
    print(path.relative_to(ROOT), flush=True)


def scroll_to(pg, selector: str) -> None:
    pg.locator(selector).first.scroll_into_view_if_needed()
    pg.wait_for_timeout(300)


def highlight_op(pg, text: str) -> None:
    """Picks the first op whose readable name contains `text` in the graph's op box."""
    choose(pg, "graph_op", text)
    pg.locator("[data-testid='stGraphVizChart'] svg").first.wait_for()


def load_zoo(pg, model: str, size: str) -> None:
    nav(pg, "Model")
    choose(pg, "w-zoo_model", model)
    choose(pg, "w-zoo_size", size)
    pg.locator(".st-key-load_zoo button").click()
    idle(pg)
    pg.get_by_text(f"Loaded {model} {size}").wait_for(timeout=300_000)


def load_llama(pg) -> None:
    load_zoo(pg, "llama", "llama3-70b")
    box = pg.locator(".st-key-w-mesh_input input")
    box.fill("data=8,fsdp=8,model=8")
    box.press("Enter")
    idle(pg)
    choose(pg, "w-hardware_input", "tpu-v5p")


def memory_section(pg, model: str) -> None:
    """The Strategy page's per-device memory: with the plan's remat beside the same plan
    without it (priced in the background on large programs: waits until drawn)."""
    pg.get_by_text("Pricing the same plan without remat").wait_for(state="detached")
    idle(pg)
    scroll_to(pg, "h3:has-text('Per-device memory')")
    shot(pg, model, "strategy_memory")


def set_mesh(pg, mesh: str) -> None:
    nav(pg, "Model")
    box = pg.locator(".st-key-w-mesh_input input")
    box.fill(mesh)
    box.press("Enter")
    idle(pg)


def fill(pg, key: str, value: str) -> None:
    box = pg.locator(f".st-key-{key} input")
    box.fill(value)
    box.press("Enter")
    idle(pg)


def fit_tour(pg) -> None:
    """Nothing fits (GPT 1.3B on one TPU v5e): the "make it fit" panel priced; then the same
    model's mesh shapes on 8 devices (artifacts/screenshots/fit/)."""
    load_zoo(pg, "gpt", "gpt-1.3b")
    set_mesh(pg, "data=1")
    nav(pg, "Search")
    run_search(pg, "3")
    idle(pg)
    fill(pg, "w-fit_budget_s", "2")
    pg.locator(".st-key-fit_find button").click()
    pg.get_by_text("Why fewer devices cannot fit").wait_for(timeout=600_000)
    idle(pg)
    pg.get_by_text("Why fewer devices cannot fit").scroll_into_view_if_needed()
    pg.mouse.wheel(0, 300)
    shot(pg, "fit", "search_make_it_fit")
    set_mesh(pg, "data=8")
    nav(pg, "Search")
    fill(pg, "w-mesh_budget_s", "6")
    pg.locator(".st-key-mesh_compare button").click()
    pg.get_by_role("button", name="Use this mesh").wait_for(timeout=600_000)
    idle(pg)
    pg.wait_for_timeout(2000)  # the streamed progress table goes when the run ends
    pg.get_by_role("button", name="Use this mesh").scroll_into_view_if_needed()
    pg.mouse.wheel(0, 200)
    shot(pg, "fit", "search_mesh_shapes")


def tour(pg, model: str, search_s: str) -> None:
    for label in PAGES:
        nav(pg, label)
        if label == "Search":
            run_search(pg, search_s)
            idle(pg)
            scroll_to(pg, "[data-testid='stMetric']")  # the run's metrics and chart
        if label == "Named dims":
            pg.locator("[data-testid='stGraphVizChart'] svg").first.wait_for()
        shot(pg, model, label.lower().replace(" ", "_"))
        if label == "Strategy":
            memory_section(pg, model)
    nav(pg, "Named dims")
    highlight_op(pg, "dot_general(")
    op_node = pg.locator("[data-testid='stGraphVizChart'] svg g.node").filter(
        has=pg.locator("title", has_text="op")
    )
    op_node.first.scroll_into_view_if_needed()
    pg.wait_for_timeout(300)
    shot(pg, model, "named_dims_op")
    pg.get_by_text("Per-op view").first.scroll_into_view_if_needed()
    shot(pg, model, "named_dims_op_view")
    # The first collapsed group (the option after "none"), drawn in full.
    pg.locator(".st-key-graph_group [role='combobox']").click()
    pg.keyboard.press("ArrowDown")
    pg.keyboard.press("Enter")
    idle(pg)
    pg.get_by_text("Drawn in full").first.scroll_into_view_if_needed()
    shot(pg, model, "named_dims_group")


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["default", "llama", "fit"])
    args = ap.parse_args()
    gen = server.__wrapped__()
    url = next(gen)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            pg = browser.new_page(viewport=VIEWPORT)
            pg.set_default_timeout(180_000)
            pg.goto(url)
            idle(pg)
            if args.only in (None, "default"):
                tour(pg, "default", "5")
            if args.only in (None, "llama"):
                load_llama(pg)
                tour(pg, "llama3_70b", "20")
            if args.only in (None, "fit"):
                fit_tour(pg)
            browser.close()
    finally:
        gen.close()


if __name__ == "__main__":
    main()
