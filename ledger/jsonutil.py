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
from json.encoder import encode_basestring
from typing import Any, Final

from pydantic_core import to_json

__all__ = ["column_json", "dumps", "dumps_leaf", "dumps_str"]


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


# `_ENCODER.encode` builds a new C encoder (and a closure for floats) on every call, which
# was most of the cost of encoding the small values a batch is made of (invocation
# params, evidence, lists of ids). Without circular-reference markers the C encoder keeps
# no state between calls, so one is built here with the very arguments
# `JSONEncoder.iterencode` passes it for `_ENCODER`; the text is the same by
# construction (tests/unit/ledger/test_canonical_templates.py compares it with
# `json.dumps` over random values). Without the C accelerator, `_ENCODER.encode`.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE: Final[Any] = (
    None
    if _c_make_encoder is None or _ENCODER.check_circular or _ENCODER.ensure_ascii
    else _c_make_encoder(
        None,  # markers: no circular check
        _ENCODER.default,
        encode_basestring,  # ensure_ascii is off
        None,  # indent: compact
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        _ENCODER.sort_keys,
        _ENCODER.skipkeys,
        _ENCODER.allow_nan,
    )
)


def dumps(value: Any) -> str:
    """Canonical JSON text of `value` (see the module docstring)."""
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    if isinstance(value, str):  # what `JSONEncoder.encode` does first
        return encode_basestring(value)
    return "".join(_C_ENCODE(value, 0))


# `dumps(text)` for a `str`: `JSONEncoder.encode` itself returns `encode_basestring(text)`
# for a string when `ensure_ascii` is off, so the bytes are the same, without the
# encoder's Python frames (half the cost for the short ids most leaves are). Anything
# but a `str` (or a subclass, such as a `StrEnum`) is refused with `TypeError`.
dumps_str: Final = encode_basestring


def dumps_leaf(value: Any) -> str:
    """`dumps(value)`, with the common leaves of a canonical template (strings, None,
    ints, booleans) written directly; anything else goes through `dumps`."""
    kind = type(value)
    if kind is str:
        return encode_basestring(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    return dumps(value)


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
