"""``python -m probe_cli`` and the ``probe`` console script."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
