#!/usr/bin/env bash
# Create .venv (if needed) with CPU torch 2.13.0 and probe installed editable with test extras.
# torch is installed first and pinned: a bare `pip install torch` would pull GBs of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dashboard's browser tests (tests/e2e/test_ui.py) drive Debian's chromium; they skip
# without it. Installed only as root and only when missing (idempotent, quiet).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
        >/dev/null) || echo "setup.sh: could not install chromium; browser tests will skip" >&2
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
pip install -q -e ".[test]"
