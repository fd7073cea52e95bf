"""pyarrow, loaded without the jemalloc background thread its library would start.

libarrow carries its own jemalloc (prefix ``je_arrow_``), initialised while ``import pyarrow``
loads the library, and built to run a ``background_thread`` that returns freed pages. The
agent never allocates from it: pyarrow's default pool here is mimalloc (or the system's), so
that thread was one of the agent's for nothing. jemalloc reads its options once, from
``JE_ARROW_MALLOC_CONF``, at that first load; the variable is set for the import only and
removed after it, so nothing the job starts later inherits it.

When the job imported pyarrow first, the library is loaded already and its jemalloc is the
job's: it is left as it is. Setting a variable races only a native thread's ``getenv`` running at
that instant (Python threads wait for the GIL held here); agents usually start with the
interpreter, before the job's threads.
"""

from __future__ import annotations

import os
import sys

_CONF = "JE_ARROW_MALLOC_CONF"


def load_pyarrow() -> None:
    """Import pyarrow, with libarrow's jemalloc background thread off unless the job chose
    jemalloc options itself (``JE_ARROW_MALLOC_CONF`` set) or loaded pyarrow already."""
    if "pyarrow" in sys.modules or _CONF in os.environ:
        return
    os.environ[_CONF] = "background_thread:false"
    try:
        import pyarrow  # noqa: F401
    finally:
        os.environ.pop(_CONF, None)
