"""One JSON encoding for everything the ledger stores and hashes.

Audit hashes are recomputed from what PostgreSQL hands back from `jsonb`, so the bytes
hashed at commit must be those of plain JSON data: mappings of any kind become objects,
tuples and sets become arrays, datetimes ISO-8601 strings. `dumps` is that encoding
(sorted keys, no whitespace, UTF-8 kept), used for hashing and for every jsonb column.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

__all__ = ["dumps"]


def _default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__} in the ledger as JSON")


# One encoder for the process: building a JSONEncoder per call cost more than encoding
# the small values most rows hold.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default
)


def dumps(value: Any) -> str:
    """Canonical JSON text of `value` (see the module docstring)."""
    return _ENCODER.encode(value)
