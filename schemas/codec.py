"""Codecs: records (plain dicts) to bytes and back, behind one interface.

`AvroSingleObjectCodec` writes Avro single-object encoding: the marker `C3 01`, the
8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's canonical form, then
the Avro binary body. Reading looks the writer schema up by fingerprint in the catalogue
and resolves it into the current reader schema of the same record, so a record written
with an older version is read as the current one (missing fields take their defaults).
`JsonCodec` accepts JSON events from tools that cannot speak Avro and validates them
with `event.schema.json`, which is as strict as the Avro. `WireDecoder` picks one by the
`content-type` header.

Decoding never raises anything but `WireError` with a stable code: input is hostile
until proven otherwise and the consumer dead-letters it by that code. A schema
registry's framing (magic byte 0 and a 4-byte id) would be one more `Codec` and one more
content type; nothing else would change.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol

import fastavro
from fastavro.validation import ValidationError as AvroValidationError
from fastavro.validation import validate as avro_validate
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from machines import canonical_json
from schemas.catalog import EVENT_ENVELOPE, SchemaCatalog, default_catalog
from schemas.errors import WireCode, WireError
from schemas.headers import CONTENT_TYPE_AVRO, CONTENT_TYPE_JSON

__all__ = [
    "DEFAULT_MAX_BYTES",
    "EVENT_SCHEMA",
    "SINGLE_OBJECT_MARKER",
    "AvroSingleObjectCodec",
    "Codec",
    "JsonCodec",
    "WireDecoder",
]

SINGLE_OBJECT_MARKER: Final = b"\xc3\x01"
_HEADER_LENGTH: Final = 10
# Larger records are refused before any parsing: an event envelope is a few KiB, and a
# bound keeps one hostile record from costing the consumer unbounded memory.
DEFAULT_MAX_BYTES: Final = 1024 * 1024

EVENT_SCHEMA: Final = Path(__file__).resolve().parent / "event.schema.json"


class Codec(Protocol):
    """Turns a record of a named schema into bytes and back; `content_type` is the value
    of the `content-type` header that announces this encoding."""

    @property
    def content_type(self) -> str:
        """The `content-type` header value for records this codec writes."""
        ...

    def encode(self, record: Mapping[str, Any], schema_name: str) -> bytes:
        """The record as bytes; raises `WireError` (`record-invalid`, `schema-unknown`)."""
        ...

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """The schema's full name and the record; raises only `WireError`."""
        ...


class AvroSingleObjectCodec:
    """Avro single-object encoding with writer schemas resolved by fingerprint."""

    def __init__(
        self, catalog: SchemaCatalog | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._catalog = catalog or default_catalog()
        self._max_bytes = max_bytes

    @property
    def content_type(self) -> str:
        """`application/vnd.apache.avro.single-object`."""
        return CONTENT_TYPE_AVRO

    @property
    def catalog(self) -> SchemaCatalog:
        """The schemas this codec writes with and resolves from."""
        return self._catalog

    def fingerprint(self, schema_name: str) -> str:
        """Hex fingerprint of the schema `encode` writes `schema_name` with (the current
        version), for the `recovery-schema` header."""
        return self._catalog.current(schema_name).fingerprint_hex

    def encode(self, record: Mapping[str, Any], schema_name: str) -> bytes:
        """Validate `record` strictly (no unknown fields) against the current version of
        `schema_name` and write it as a single object."""
        schema = self._catalog.current(schema_name)
        try:
            # Asked to raise, fastavro builds a ValidationError (formatting the datum as
            # JSON) for every union branch it probes and rejects, so every valid record
            # with a value in a nullable field paid for one. The verdict alone is the
            # same check; only a refused record is validated again, to raise its error.
            if not avro_validate(record, schema.parsed, raise_errors=False, strict=True):
                avro_validate(record, schema.parsed, raise_errors=True, strict=True)
                # Unreachable while both modes agree; never publish on a disagreement.
                raise _Invalid("fastavro's verdict and its detailed check disagree")
            # fastavro ignores fields the schema lacks; a misspelt optional field would
            # then vanish silently, so refuse them.
            _refuse_unknown_fields(record, schema.parsed, {}, schema_name)
        except (AvroValidationError, _UnknownField, _Invalid) as exc:
            raise WireError(
                WireCode.RECORD_INVALID,
                f"record does not match {schema_name} v{schema.version}: {exc}",
            ) from exc
        buffer = io.BytesIO()
        buffer.write(SINGLE_OBJECT_MARKER)
        buffer.write(schema.fingerprint)
        fastavro.schemaless_writer(buffer, schema.parsed, dict(record))
        return buffer.getvalue()

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """Read a single object: check the marker, find the writer schema by fingerprint,
        resolve into the current reader schema, and refuse trailing bytes."""
        _check_size(data, self._max_bytes)
        if len(data) < _HEADER_LENGTH or data[:2] != SINGLE_OBJECT_MARKER:
            raise WireError(
                WireCode.NOT_SINGLE_OBJECT,
                f"the value does not start with the Avro single-object marker C3 01 "
                f"(first bytes {data[:4].hex() or 'none'}); producers must use "
                "AvroSingleObjectCodec or send content-type application/json",
            )
        fingerprint = data[2:_HEADER_LENGTH]
        writer = self._catalog.by_fingerprint(fingerprint)
        if writer is None:
            raise WireError(
                WireCode.UNKNOWN_FINGERPRINT,
                f"no schema in schemas/avro has fingerprint {fingerprint.hex()}; the producer "
                "uses a schema this controller does not ship: deploy the schema first",
            )
        reader = self._catalog.current(writer.name)
        body = io.BytesIO(data[_HEADER_LENGTH:])
        try:
            record = fastavro.schemaless_reader(body, writer.parsed, reader.parsed)
        except Exception as exc:  # fastavro raises many types on hostile bytes; all mean corrupt
            _corrupt(writer.name, writer.version, exc)
        if body.tell() != len(data) - _HEADER_LENGTH:
            raise WireError(
                WireCode.AVRO_TRAILING_BYTES,
                f"{len(data) - _HEADER_LENGTH - body.tell()} bytes follow the "
                f"{writer.name} v{writer.version} record; the value was corrupted or framed twice",
            )
        if not isinstance(record, dict):
            _corrupt(writer.name, writer.version, TypeError("not a record"))
        return writer.name, record


class _UnknownField(ValueError):
    """A record holds a field its schema does not declare."""


class _Invalid(ValueError):
    """fastavro found a record invalid without saying why."""


def _refuse_unknown_fields(value: Any, schema: Any, named: dict[str, Any], path: str) -> None:
    """Raise `_UnknownField` naming the first field of `value` that `schema` does
    not declare, at any depth."""
    if isinstance(schema, str):
        schema = named.get(schema)
    if isinstance(schema, list):
        _refuse_in_union(value, schema, named, path)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record":
            _refuse_in_record(value, schema, named, path)
        elif kind == "array" and isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                _refuse_unknown_fields(item, schema["items"], named, f"{path}[{index}]")
        elif kind == "map" and isinstance(value, Mapping):
            for key, item in value.items():
                _refuse_unknown_fields(item, schema["values"], named, f"{path}[{key}]")


def _refuse_in_record(value: Any, schema: dict[str, Any], named: dict[str, Any], path: str) -> None:
    named[schema["name"]] = schema
    declared, nested = _record_plan(schema)
    if not isinstance(value, Mapping):
        return
    if not declared.issuperset(value):
        unknown = sorted(set(value) - declared)
        raise _UnknownField(f"{path}: unknown field(s) {', '.join(unknown)}")
    for name, field_type in nested:
        _refuse_unknown_fields(value.get(name), field_type, named, f"{path}.{name}")


# Names that never refer to a record, so a field of such a type cannot hold fields.
_PRIMITIVES: Final = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)
_STRUCTURED: Final = frozenset({"record", "array", "map"})
# Per record schema (by identity; the entry holds the schema, so its id stays its own):
# the declared field names, and the fields whose type may hold fields of its own. The
# walk above skips the others, where it would do nothing anyway: a relay encoding
# thousands of records a second paid for visiting every string field of every record.
# Bounded for callers that build schemas on the fly; the catalogue's few never reach it.
_PLANS: dict[int, tuple[dict[str, Any], frozenset[str], tuple[tuple[str, Any], ...]]] = {}
_MAX_PLANS: Final = 1024


def _record_plan(schema: dict[str, Any]) -> tuple[frozenset[str], tuple[tuple[str, Any], ...]]:
    plan = _PLANS.get(id(schema))
    if plan is None or plan[0] is not schema:
        fields = schema["fields"]
        declared = frozenset(f["name"] for f in fields)
        types = {f["name"]: f["type"] for f in fields}
        nested = tuple((name, kind) for name, kind in types.items() if not _inert(kind))
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[id(schema)] = (schema, declared, nested)
    return plan[1], plan[2]


def _inert(schema: Any) -> bool:
    """Whether `_refuse_unknown_fields` does nothing for a value of this type, whatever
    the value: a primitive, an enum, a fixed, a logical type over a primitive, or a
    union of only those. A named reference may be a record, so it is not inert."""
    if isinstance(schema, str):
        return schema in _PRIMITIVES
    if isinstance(schema, list):
        return all(_inert(branch) for branch in schema)
    if isinstance(schema, dict):
        kind = schema.get("type")
        return not (isinstance(kind, str) and kind in _STRUCTURED)
    return True


def _refuse_in_union(value: Any, branches: list[Any], named: dict[str, Any], path: str) -> None:
    # Only structured branches can hold fields; fastavro already checked that the value
    # matches some branch, so a value that fits a record branch is checked against it.
    structured = [
        b
        for b in (named.get(b, b) if isinstance(b, str) else b for b in branches)
        if isinstance(b, dict) and b.get("type") in ("record", "array", "map")
    ]
    if value is None or not structured:
        return
    errors: list[_UnknownField] = []
    for branch in structured:
        try:
            _refuse_unknown_fields(value, branch, named, path)
            return
        except _UnknownField as exc:
            errors.append(exc)
    raise errors[0]


def _corrupt(name: str, version: int, exc: BaseException) -> NoReturn:
    raise WireError(
        WireCode.AVRO_CORRUPT,
        f"the body is not a valid {name} v{version} record "
        f"({type(exc).__name__}: {str(exc)[:200]})",
    ) from exc


def _check_size(data: bytes, max_bytes: int) -> None:
    if not data:
        raise WireError(WireCode.EMPTY, "the record value is empty (a tombstone is not an event)")
    if len(data) > max_bytes:
        raise WireError(
            WireCode.OVERSIZED,
            f"the record value is {len(data)} bytes, more than the {max_bytes}-byte limit",
        )


@cache
def _event_validator() -> Draft202012Validator:
    schema = json.loads(EVENT_SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys; a hostile sender could then show one
    # value to a validator and another to a reader. Refuse the object instead.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


class JsonCodec:
    """JSON event envelopes, validated with `event.schema.json` on the way in and out."""

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._max_bytes = max_bytes

    @property
    def content_type(self) -> str:
        """`application/json`."""
        return CONTENT_TYPE_JSON

    def encode(self, record: Mapping[str, Any], schema_name: str) -> bytes:
        """The event envelope as its canonical JSON (`canonical-json/1`: sorted keys, no
        whitespace, UTF-8, times as ISO-8601), so the same envelope is the same bytes in
        every implementation (docs/wire-protocol.md, "JSON values"); only
        `recovery.EventEnvelope` has a JSON form."""
        _require_event(schema_name)
        try:
            data = canonical_json(record)
        except (TypeError, ValueError) as exc:
            raise WireError(
                WireCode.RECORD_INVALID, f"record is not JSON-encodable: {exc}"
            ) from exc
        self._validate(json.loads(data))
        return data

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """Parse strictly (UTF-8, no duplicate keys, no NaN) and validate."""
        _check_size(data, self._max_bytes)
        try:
            value = json.loads(
                data.decode("utf-8"),
                object_pairs_hook=_reject_duplicates,
                parse_constant=_reject_constant,
            )
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise WireError(
                WireCode.JSON_MALFORMED, f"the value is not strict JSON: {exc}"
            ) from exc
        self._validate(value)
        return EVENT_ENVELOPE, value

    @staticmethod
    def _validate(value: Any) -> None:
        error = best_match(_event_validator().iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            event_id = value.get("event_id") if isinstance(value, dict) else None
            raise WireError(
                WireCode.JSON_SCHEMA_VIOLATION,
                f"event {event_id or '<no event_id>'}: {where}: {error.message[:300]}",
            )


def _require_event(schema_name: str) -> None:
    if schema_name != EVENT_ENVELOPE:
        raise WireError(
            WireCode.UNKNOWN_SCHEMA,
            f"only {EVENT_ENVELOPE} has a JSON form, not {schema_name}; use Avro",
        )


class WireDecoder:
    """Decodes a Kafka value by its `content-type` header: Avro single-object when the
    header is absent or names Avro, JSON when it says `application/json`."""

    def __init__(
        self, catalog: SchemaCatalog | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.avro = AvroSingleObjectCodec(catalog, max_bytes=max_bytes)
        self.json = JsonCodec(max_bytes=max_bytes)
        self._codecs: dict[str, Codec] = {
            CONTENT_TYPE_AVRO: self.avro,
            CONTENT_TYPE_JSON: self.json,
        }

    def codec_for(self, content_type: str | None) -> Codec:
        """The codec for a header value; parameters such as `; charset=utf-8` are ignored
        and an unknown type raises `wire-unsupported-content-type`."""
        if content_type is None:
            return self.avro
        media = content_type.split(";", 1)[0].strip().lower()
        codec = self._codecs.get(media)
        if codec is None:
            raise WireError(
                WireCode.UNSUPPORTED_CONTENT_TYPE,
                f"content-type {content_type[:100]!r} is not one of {', '.join(self._codecs)}",
            )
        return codec

    def decode(self, data: bytes | None, content_type: str | None) -> tuple[str, dict[str, Any]]:
        """Decode `data` announced as `content_type`; raises only `WireError`."""
        if data is None:
            raise WireError(WireCode.EMPTY, "the record has no value (a tombstone is not an event)")
        return self.codec_for(content_type).decode(data)
