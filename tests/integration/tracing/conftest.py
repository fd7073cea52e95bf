"""The tracing tests run twice, once on each of the tracer's hot paths (Python and C++)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest


@pytest.fixture
def make_agent(make_agent: Callable[..., object], hot_path: str) -> Callable[..., object]:
    """Every test here runs on the Python and on the C++ hot path."""
    return functools.partial(make_agent, trace_native="auto" if hot_path == "native" else "off")
