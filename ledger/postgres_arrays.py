"""Typed one-dimensional array parameters for the ledger's set-based statements.

The commit sends a column's values as one binary array of a fixed element type, unpacked
by `unnest` on the server (`ledger/postgres_commit.py`). psycopg's generic list dumper
finds each list's element type on every call (a scan of the list, a dumper lookup, an
upgraded dumper): with some 50 arrays per small batch that was about a fifth of the
controller's CPU per commit. A list of one of the classes here is dumped by a dumper that
knows its array and element types (as psycopg's `register_array` makes them), which only
packs the values. The dumpers are registered on `ADAPTERS`, the ledger's own adapters
map, which the ledger's connections are opened with (`PostgresLedger`): nothing is
registered on psycopg's global adapters, so no other connection in the process changes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

import psycopg
from psycopg import postgres
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.types.array import ListBinaryDumper
from psycopg.types.json import set_json_loads

from ledger.jsonutil import loads

__all__ = [
    "ADAPTERS",
    "BoolArray",
    "BytesArray",
    "Int8Array",
    "TextArray",
    "TimeArray",
    "column_arrays",
]


class TextArray(list[Any]):
    """A text[] parameter (json values too: the statements cast them)."""


class Int8Array(list[Any]):
    """A bigint[] parameter (the statements cast integer columns)."""


class BoolArray(list[Any]):
    """A boolean[] parameter."""


class TimeArray(list[Any]):
    """A timestamptz[] parameter (aware datetimes)."""


class BytesArray(list[Any]):
    """A bytea[] parameter."""


class _ArrayDumper(ListBinaryDumper):
    """A one-dimensional array of one element type, packed in one pass: the generic
    dumper's walk for nested lists (dimensions, depth checks) is wasted on columns."""

    def dump(self, obj: list[Any]) -> bytes:
        sub = self.sub_dumper
        assert sub is not None  # set from the element type when the dumper is made
        data: list[Buffer] = [b""]
        has_null = 0
        for item in obj:
            if item is None:
                has_null = 1
                data.append(_NULL)
            else:
                value = sub.dump(item)
                assert value is not None  # a value's dumper never returns NULL
                data.append(_LENGTH.pack(len(value)))
                data.append(value)
        data[0] = _HEAD.pack(1, has_null, sub.oid, len(obj), 1)
        return b"".join(data)


# The binary array header of one dimension (dimensions, has-null flag, element oid,
# length, lower bound), an element's length, and NULL's length.
_HEAD: Final = struct.Struct("!iiIii")
_LENGTH: Final = struct.Struct("!i")
_NULL: Final = _LENGTH.pack(-1)


class _TextArrayDumper(_ArrayDumper):
    oid = postgres.types["text"].array_oid
    element_oid = postgres.types["text"].oid


class _Int8ArrayDumper(_ArrayDumper):
    oid = postgres.types["int8"].array_oid
    element_oid = postgres.types["int8"].oid


class _BoolArrayDumper(_ArrayDumper):
    oid = postgres.types["bool"].array_oid
    element_oid = postgres.types["bool"].oid


class _TimeArrayDumper(_ArrayDumper):
    oid = postgres.types["timestamptz"].array_oid
    element_oid = postgres.types["timestamptz"].oid


class _BytesArrayDumper(_ArrayDumper):
    # bytea's dumper by oid is the DB-API `Binary` wrapper's: take the one for bytes.
    oid = postgres.types["bytea"].array_oid

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        self.sub_dumper = self._tx.adapters.get_dumper(bytes, PyFormat.BINARY)(bytes, self._tx)


def _ledger_adapters() -> AdaptersMap:
    adapters = AdaptersMap(psycopg.adapters)
    adapters.register_dumper(TextArray, _TextArrayDumper)
    adapters.register_dumper(Int8Array, _Int8ArrayDumper)
    adapters.register_dumper(BoolArray, _BoolArrayDumper)
    adapters.register_dumper(TimeArray, _TimeArrayDumper)
    adapters.register_dumper(BytesArray, _BytesArrayDumper)
    # json and jsonb values (views, joined audit records) read by orjson, as json.loads.
    set_json_loads(loads, adapters)
    return adapters


# The ledger's own adapters: psycopg's defaults plus the array dumpers above. The
# ledger's connections copy them (`connect(context=ADAPTERS)`); psycopg's global adapters,
# and so every other connection in the process, stay as psycopg made them.
ADAPTERS: Final = _ledger_adapters()

# The array class of each column type (the names of `postgres_commit`'s `_TABLE_TYPES`;
# int4 columns go as bigint).
_ARRAYS: Final[Mapping[str, type[list[Any]]]] = {
    "text": TextArray,
    "int4": Int8Array,
    "int8": Int8Array,
    "bool": BoolArray,
    "timestamptz": TimeArray,
    "bytea": BytesArray,
}


def column_arrays(
    names: Sequence[str], types: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> dict[str, list[Any]]:
    """The parameters of a statement that `unnest`s one array per column: `rows` (tuples
    in the order of `names`, whose element types `types` names as in `_ARRAYS`) turned
    into one typed array per column name."""
    columns = zip(*rows, strict=True)
    return {
        name: _ARRAYS[kind](column)
        for name, kind, column in zip(names, types, columns, strict=True)
    }
