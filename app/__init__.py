"""The TOAST explorer: a thin Streamlit client over `toast_core`'s public API.

`streamlit run app/streamlit_app.py` starts it. Pages live in `app_pages/` (one thin file each);
`state` keeps what the user loaded, pinned and found across reruns; `cached` holds the cached
loaders (`programs` traces and analyzes, without Streamlit); `pricing` prices a large program's
baselines in a separate process, so that page runs keep the CPU; `charts` and `reports` are pure
builders of figures, graphs and exported text.
"""
