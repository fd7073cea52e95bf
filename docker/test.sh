#!/usr/bin/env bash
# Install (if needed), run the gates (ruff, then mypy with pyproject.toml's settings), then the
# whole test suite. A gate that fails stops here, before the ~18 min of tests, with its findings
# on the screen. Arguments go to pytest (the gates always run whole).
set -euo pipefail
cd "$(dirname "$0")/.."
bash docker/setup.sh
echo "test.sh: ruff check ." >&2
.venv/bin/ruff check .
echo "test.sh: mypy probe_agent probe_cli probe_protocol" >&2
.venv/bin/mypy probe_agent probe_cli probe_protocol
# Two workers, one test file each (a module fixture starts its jobs once); `-n N` in the
# arguments changes the count, `-n 0` runs everything in this process.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 -n 2 --dist loadfile "$@"
