"""Text from a job is data, not terminal control.

Strings an agent sends (query cells, backtraces, eval output, error messages) can hold whatever
the job, or a stranger whose refused request was audited, put in them: ESC sequences that set
the window title, clear the screen or write the clipboard (OSC 52). The client escapes every
control character of every string it decodes, before anything renders it, so the CLI's own
colour codes are the only ones left on the terminal. ``--raw`` turns this off.

Escaped: C0 (but tab and newline, which tables and tracebacks need), DEL and C1 (U+0080–U+009F:
an 8-bit CSI is U+009B). Each becomes ``\\xNN``.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with its control characters shown as ``\\xNN`` (tab and newline kept)."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def escape_body(value: Any) -> Any:
    """Every string in a decoded JSON value (keys included) escaped; the rest as it was."""
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, dict):
        return {escape_body(k): escape_body(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_body(v) for v in value]
    return value
