"""``python -m probe_cli`` and the ``probe`` console script (``probe_cli.__main__:main``)."""

import os
import sys

from .main import main as _main


def main() -> int:
    """Run `probe`, ending quietly when the reader of stdout goes away (``probe … | head``).

    The recipe from Python's docs ("Note on SIGPIPE"): on BrokenPipeError, point stdout at
    devnull so the interpreter's final flush does not raise again, and exit 1."""
    try:
        code = _main()
        sys.stdout.flush()  # a pipe closed after the last write breaks here, inside the try
        from . import main as cli_main

        if cli_main.INTERRUPTED:
            # Ctrl-C: leave now. A normal exit joins the fan-out's worker threads, which wait
            # for their requests: Ctrl-C at 3 s into a 20 s eval took effect at 23 s.
            sys.stderr.flush()
            os._exit(code)
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
