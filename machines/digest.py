"""The canonical JSON form, and the canonical digest of a machine.

`canonical_json` is the one encoder of every byte that is hashed, signed, stored as a
record or published: machine digests, event payload digests and signatures, the ledger's
decision records, audit bodies and chain hashes, outbox payloads. Its form is
**canonical-json/1** (`CANONICAL_FORM`, docs/ledger.md): exactly what
`json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` writes,
encoded as UTF-8. So: keys sorted by code point at every level; no whitespace; non-ASCII
characters as UTF-8, not escaped (U+2028 and U+2029 too); control characters, `"` and `\\`
escaped as `json.dumps` escapes them; integers of any size in decimal; floats as
`float.__repr__` (`1e-07`, `1e+16`), NaN and infinities as `NaN`, `Infinity`, `-Infinity`.
Values that are not JSON are written as plain data: any mapping as an object, tuples as
arrays, sets as sorted arrays, datetimes as `isoformat()` strings; anything else is refused
with `TypeError`.

orjson writes that form for most values, several times faster than the standard
library. Where it would write something else (floats below 1e-4 or from 1e16 on in
other digits, NaN and infinities as `null`, enums, UUIDs and dates in its own way) or
refuses the value (integers beyond 64 bits, keys that are not strings, lone surrogates,
nesting deeper than 254), `json.dumps` itself, the form's definition, writes the value
or raises. tests/unit/ledger/test_canonical_json.py compares the two over random values.

A machine's digest (also in docs/machine-format.md): parse RECOVERY.yaml with the
plain-data reader (`machines.yamlsafe`, which refuses NaN and infinity), serialise the
resulting value as canonical JSON, and take SHA-256 of those bytes. The digest is written
`sha256:` followed by 64 lowercase hex digits. Comments, key order, quoting style and
indentation of the YAML therefore do not change the digest; any change of a value, key or
list order does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

import orjson

__all__ = [
    "CANONICAL_FORM",
    "DIGEST_PATTERN",
    "canonical_ascii_json",
    "canonical_json",
    "canonical_text",
    "digest_of",
]

CANONICAL_FORM: Final = "canonical-json/1"
DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")


def _plain(value: Any) -> Any:
    """What a value that is not JSON is written as (see the module docstring)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__} as canonical JSON")


# orjson would write datetimes and dataclasses in its own way; passed through, they reach
# `_plain` like any value that is not JSON, as they do in `json.dumps`.
_OPTIONS: Final = (
    orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)
# No circular-reference check: the values are plain data their callers built.
_SPECIFICATION: Final = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    default=_plain,
    check_circular=False,
)


_LEAVES: Final = frozenset({str, int, bool, type(None)})


def _orjson_writes_it(value: Any) -> bool:
    """True when orjson writes `value` as `json.dumps` would: every float is one that
    `float.__repr__` writes without an exponent (orjson writes `1e-05` as `0.00001`,
    NaN and infinities as `null`), and every value is of a type whose form is the
    specification's (orjson also writes enums, UUIDs and dates, which `json.dumps`
    refuses). A loop over a stack rather than recursion: it visits every value of every
    record, and a call per value cost more than orjson's whole encoding."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind in _LEAVES:
            continue
        if kind is dict:
            extend(item.values())
        elif kind is list or kind is tuple:
            extend(item)
        elif kind is float:
            # Where `float.__repr__` writes digits without an exponent, orjson writes the
            # same shortest digits; outside (and for NaN, the infinities) it may not.
            if not (item == 0.0 or 1e-4 <= abs(item) < 1e16):
                return False
        elif isinstance(item, Mapping):
            extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            extend(item)
        elif not isinstance(item, (str, int, datetime)):  # StrEnum, IntEnum: their value
            return False
    return True


def _by_orjson(value: Any, default: Any) -> bytes | None:
    """`value` in the canonical form by orjson, or None where only `json.dumps` writes it
    as the form says (or raises the error the form's definition raises)."""
    if not _orjson_writes_it(value):
        return None
    try:
        return orjson.dumps(value, default=default, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return None  # ints beyond 64 bits, keys that are not strings, lone surrogates


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of `value`, canonical-json/1 (see the module docstring)."""
    data = _by_orjson(value, _plain)
    return _SPECIFICATION.encode(value).encode("utf-8") if data is None else data


def canonical_text(value: Any) -> str:
    """`canonical_json(value)` as text, for a database parameter or a hash template."""
    data = _by_orjson(value, _plain)
    return _SPECIFICATION.encode(value) if data is None else data.decode("utf-8")


_ASCII: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), check_circular=False)


def canonical_ascii_json(value: Any) -> bytes:
    """`json.dumps(value, sort_keys=True, separators=(",", ":"))` in UTF-8, the form OCSF
    audit events are published in: canonical-json/1 of plain JSON data (no `default`:
    anything else is refused with `TypeError`) with every character from U+007F on
    escaped as `\\uXXXX` (`ensure_ascii`). orjson has no such option, so a text it wrote
    with any such character is written again by `json.dumps`."""
    data = _by_orjson(value, None)
    if data is not None and data.isascii() and b"\x7f" not in data:
        return data
    return _ASCII.encode(value).encode("ascii")


def digest_of(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of `value`."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()
