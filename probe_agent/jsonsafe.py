"""jsonable: DuckDB values (and doctor findings) in a form JSON can carry."""

from __future__ import annotations

import json
import math
from typing import Any


def jsonable(value: Any) -> Any:
    """A JSON-safe form of a DuckDB value (NaN and ±Inf become strings, not nulls)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    try:
        return float(value)  # Decimal
    except (TypeError, ValueError):
        return json.dumps(value, default=str)
