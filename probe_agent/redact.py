"""Secrets kept out of backtraces' locals (``probe backtrace --locals``) unless asked for.

Two places a secret shows up in a frame's locals, each handled here:
- under a secret-looking name (``api_key``, ``passphrase``, ``db_password``): the whole value
  is replaced;
- inside a value, under a secret-looking key or keyword: ``cfg = {'api_key': 'sk-…'}`` or
  ``Config(token='…')``. The repr keeps its shape and only that value is replaced, so the
  operator still sees which keys the dict has.

A name-based rule cannot be complete (a secret in a list, or under a name like ``s``); it
covers the common spellings, and ``secrets=1`` (``--show-secrets``) shows everything to the
job's owner. Stdlib only: the watchdog applies it to out-of-process stacks too.
"""

from __future__ import annotations

import re

_WORDS = r"key|token|secret|passw|passphrase|pwd|credential|auth|cookie|private|signature"
#: Names of locals whose values stay out of backtraces unless asked for (``secrets=1``).
SECRET_NAME = re.compile(_WORDS, re.IGNORECASE)
REDACTED = "<redacted: name looks like a secret; --show-secrets to see it>"
#: A secret-looking key in a repr (``'api_key': `` or ``token=``) and the value after it: a
#: quoted string (escapes allowed) or a bare word up to the next separator.
_IN_VALUE = re.compile(
    r"""(?P<lead>(?P<q>['"]?)\b\w*(?:""" + _WORDS + r""")\w*(?P=q)\s*[:=]\s*)"""
    r"""(?P<value>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s,)}\]]+)""",
    re.IGNORECASE,
)
REDACTED_VALUE = "'<redacted>'"


def redact_text(text: str) -> str:
    """``text`` (a repr) with the values under secret-looking keys replaced."""
    return _IN_VALUE.sub(lambda m: m.group("lead") + REDACTED_VALUE, text)


def redact_locals(values: dict[str, str] | None, show_secrets: bool) -> dict[str, str] | None:
    """``values`` (name -> repr) with secrets replaced, unless asked for; see the module doc."""
    if not values or show_secrets:
        return values
    return {k: (REDACTED if SECRET_NAME.search(str(k)) else redact_text(str(v)))
            for k, v in values.items()}
