#!/usr/bin/env bash
# Install (if needed), run the lint gate (ruff), then the whole test suite.
# A gate that fails stops here, before the ~20 min of tests, with its findings on the screen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash docker/setup.sh
echo "test.sh: ruff check ." >&2
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
