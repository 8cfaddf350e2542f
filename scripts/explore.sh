#!/usr/bin/env bash
# Sets up (if needed) and starts the TOAST explorer on the default demo (GPT train step at GPT-2
# small shapes, where the best plan really shards; analysis in ~3 s, searches in seconds) at
# http://127.0.0.1:8501 (localhost only: a user's model file is Python code the app executes).
set -euo pipefail
cd "$(dirname "$0")/.."
TOAST_SKIP_CHROMIUM=1 bash scripts/setup.sh
PORT="${PORT:-8501}"
echo "TOAST explorer: open http://127.0.0.1:${PORT}"
exec .venv/bin/python -m streamlit run app/streamlit_app.py \
  --server.address 127.0.0.1 --server.port "$PORT" --server.headless true \
  --browser.gatherUsageStats false
