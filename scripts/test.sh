#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite: engine, XLA and Shardy checks, the explorer
# (AppTest) and the real-browser test (Playwright driving Debian's Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
