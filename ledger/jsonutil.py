"""The two JSON encodings of the ledger.

`dumps` is the canonical encoding (sorted keys, no whitespace, UTF-8 kept): every byte
that is hashed or published goes through it (audit record bodies, the decision record
the audit hash covers, outbox payloads). Audit hashes are recomputed from the records
PostgreSQL hands back, decoded, so the bytes hashed at commit must be those of plain
JSON data: mappings of any kind become objects, tuples and sets become arrays,
datetimes ISO-8601 strings.

`column_json` is for JSON that is stored and read back whole, or unpacked into typed
columns (a view, an event envelope, outbox headers, the JSON array of rows a set-based
statement unpacks): every reader decodes it into a mapping, so key order and spacing
do not matter. It is pydantic-core's serializer, which runs in Rust at several times the
speed of the standard library's; it is never used for bytes that are hashed or
published.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic_core import to_json

__all__ = ["column_json", "dumps", "json_object"]


def _default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__} in the ledger as JSON")


# One encoder for the process: building a JSONEncoder per call cost more than encoding
# the small values most rows hold. No circular-reference check: the ledger encodes
# plain data it built itself, and the check costs a dictionary insert per container.
_ENCODER = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    default=_default,
    check_circular=False,
)


def dumps(value: Any) -> str:
    """Canonical JSON text of `value` (see the module docstring)."""
    return _ENCODER.encode(value)


def column_json(value: dict[str, Any] | list[Any]) -> str:
    """JSON text of plain data (dicts, lists, tuples, str, int, bool, None) for a
    JSON or typed column: keys in insertion order, so never hash or publish it.
    Pass datetimes as `isoformat()` strings and sets as sorted lists: the serializer
    writes them in its own form (ISO-8601 with `Z`, iteration order), not `dumps`'.
    A type it does not know (a mapping proxy) is refused with `TypeError`."""
    try:
        return to_json(value).decode("utf-8")
    except ValueError as exc:  # pydantic-core's serialization error is a ValueError
        raise TypeError(f"cannot store this value as JSON in the ledger: {exc}") from exc


def json_object(fields: Mapping[str, Any], encoded: Mapping[str, str]) -> str:
    """The JSON object of `fields` (encoded by `column_json`) with the already-encoded
    JSON values of `encoded` added under their keys: a large value encoded once (a view)
    is spliced into the row that carries it instead of being decoded and encoded again.
    `fields` must not be empty and must not share a key with `encoded`."""
    head = column_json(dict(fields))
    tail = "".join(f",{_ENCODER.encode(k)}:{v}" for k, v in encoded.items())
    return head[:-1] + tail + "}"
