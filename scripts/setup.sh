#!/usr/bin/env bash
# Sets up a fresh machine for TOAST explorer: Debian packages (graphviz for server-side graph
# rendering, chromium for the browser test), a virtualenv in .venv with the pinned requirements,
# and the project itself in editable mode. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
if [ "${TOAST_SKIP_CHROMIUM:-0}" != "1" ]; then
  [ -x /usr/bin/chromium ] || need_apt+=(chromium)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import toast_core, streamlit, jax, playwright" >/dev/null 2>&1 \
   || ! cmp -s requirements.txt .venv/.requirements.installed; then
  echo "setup: installing Python packages (pinned in requirements.txt)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
  cp requirements.txt .venv/.requirements.installed
fi
echo "setup: ready"
