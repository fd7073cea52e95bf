"""ends.stack_of: a stack read while the main thread runs the end handler leaves out the
handler's own call chain (the agent's frames and what they called: traceback, linecache and,
under it, tokenize), so the job's frames lead."""

from __future__ import annotations

import os
import sys
from typing import Any

from probe_agent.postmortem.ends import stack_of


def _chain(names: list[tuple[str, str]]) -> Any:
    """Nested calls, outermost first, each (file, function) compiled under that file name, in
    one namespace; the innermost returns its frame."""
    ns: dict[str, Any] = {"sys": sys}
    for i, (path, func) in enumerate(names):
        body = (f"    return {names[i + 1][1]}_{i + 1}()\n" if i + 1 < len(names)
                else "    return sys._getframe()\n")
        exec(compile(f"def {func}_{i}():\n{body}", path, "exec"), ns)
    return ns[f"{names[0][1]}_0"]()


def test_the_handlers_reading_of_source_is_left_out():
    # GIVEN the job's main, the agent's handler under it, and under that linecache opening a
    # source file through tokenize (the innermost frames of a stack read at SIGTERM at load)
    agent = f"{os.sep}x{os.sep}probe_agent{os.sep}postmortem{os.sep}ends.py"
    frame = _chain([("/job/train.py", "main"), (agent, "_on_signal"),
                    ("/py/linecache.py", "getline"), ("/py/tokenize.py", "open"),
                    ("/py/tokenize.py", "detect_encoding")])
    # THEN the stack starts at the job's own frame
    stack = stack_of(frame)
    assert [f["func"] for f in stack[:1]] == ["main_0"], stack[:4]
