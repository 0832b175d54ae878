"""The two JSON encodings of the ledger.

`dumps` is the canonical encoding, canonical-json/1 (`machines.canonical_json`; the form
is in docs/ledger.md): every byte that is hashed or published goes through it (audit
record bodies, the decision record the audit hash covers, outbox payloads). Audit hashes
are recomputed from the records PostgreSQL hands back, decoded, so the bytes hashed at
commit must be those of plain JSON data: mappings of any kind become objects, tuples and
sets become arrays, datetimes ISO-8601 strings.

`column_json` is for JSON that is stored and read back whole, or unpacked into typed
columns (a view, an event envelope, outbox headers, the JSON array of rows a set-based
statement unpacks): every reader decodes it into a mapping, so key order and spacing
do not matter. It is pydantic-core's serializer; it is never used for bytes that are
hashed or published.

`loads` reads JSON the ledger gets back from the server (views, payloads, audit records
joined into a lease): orjson, or `json.loads` for the few texts orjson refuses and the
standard library reads (integers beyond 64 bits, lone surrogate escapes), so the result
is `json.loads`' for every text, at a quarter of its cost.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any, Final

import orjson
from pydantic_core import to_json

from machines import canonical_text

__all__ = ["column_json", "dumps", "dumps_str", "loads"]


def dumps(value: Any) -> str:
    """Canonical JSON text of `value` (see the module docstring)."""
    return canonical_text(value)


# `dumps(text)` for a `str`, for the chain hash's own small template (`ledger.audit`):
# `json.dumps` writes a string with this very function when `ensure_ascii` is off.
# Anything but a `str` (or a subclass, such as a `StrEnum`) is refused with `TypeError`.
dumps_str: Final = encode_basestring


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


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The value of the JSON text `data`, as `json.loads` reads it (see the module
    docstring); raises `ValueError` for a text that is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)
