"""The TOAST explorer: `streamlit run app/streamlit_app.py` (binds to localhost by default).

This entry point only sets up the process (8 simulated CPU devices for validation, before JAX
starts), the session state and the navigation; each page is one thin file in `app_pages/`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# 16 simulated CPU devices: meshes up to 16 validate in the explorer (a device costs nothing
# until an array lives on it; the host's memory is checked before a run).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=16")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import cached, state  # noqa: E402

PAGES = (
    ("app_pages/model.py", "Model", ":material/deployed_code:", "model"),
    ("app_pages/named_dims.py", "Named dims", ":material/hub:", "named_dims"),
    ("app_pages/search.py", "Search", ":material/travel_explore:", "search"),
    ("app_pages/strategy.py", "Strategy", ":material/grid_view:", "strategy"),
    ("app_pages/validate.py", "Validate", ":material/verified:", "validate"),
    ("app_pages/learn.py", "Learn", ":material/school:", "learn"),
    ("app_pages/export.py", "Export", ":material/download:", "export"),
)


#: The tab icon. Not a `:material/...:` name: Streamlit fetches those from fonts.gstatic.com, which
#: fails offline (an emoji becomes an inline SVG; the sidebar's material icons are a bundled font).
PAGE_ICON = "🍞"


def main() -> None:
    st.set_page_config(page_title="TOAST explorer", page_icon=PAGE_ICON, layout="wide")
    state.init()
    pages = [
        st.Page(path, title=title, icon=icon, url_path=url, default=(url == "model"))
        for path, title, icon, url in PAGES
    ]
    page = st.navigation(pages, position="sidebar")
    if page.url_path != "search":
        # Streamlit runs one page at a time: leaving the Search page ends its run. Say so.
        for key in state.settle_all_interrupted():
            st.warning(
                f"The search on `{key[0].split(':', 1)[-1]}` stopped when you left the Search "
                "page (the explorer runs one page at a time); its best plan so far is kept.",
                icon=":material/pause_circle:",
            )
    with st.sidebar:
        st.markdown("**TOAST explorer**")
        spec = state.spec()
        st.caption(
            f"Model: `{spec.title}`  \nMesh: `{state.mesh_text()}`  \n"
            f"Hardware: `{state.hardware_name()}`"
        )
        pins = state.workspace()["pins"]
        if pins:
            st.caption("Pins: " + ", ".join(f"`{p}`" for p in pins))
    with cached.foreground():
        page.run()


main()
