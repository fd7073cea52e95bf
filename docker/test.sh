#!/usr/bin/env bash
# Install (if needed) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash docker/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
