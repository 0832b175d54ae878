"""The one exception family of `schemas`: every refusal carries a stable code.

The consumer dead-letters undecodable input with `code` as the reason code and the
message as the explanation, so the codes are part of the wire contract (documented in
docs/wire-formats.md) and never change meaning.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["WireCode", "WireError"]


class WireCode(StrEnum):
    """Why a record could not be encoded or decoded; stable, used as the dead-letter reason."""

    EMPTY = "wire-empty"
    OVERSIZED = "wire-oversized"
    UNSUPPORTED_CONTENT_TYPE = "wire-unsupported-content-type"
    NOT_SINGLE_OBJECT = "avro-not-single-object"
    UNKNOWN_FINGERPRINT = "avro-unknown-fingerprint"
    AVRO_CORRUPT = "avro-corrupt"
    AVRO_TRAILING_BYTES = "avro-trailing-bytes"
    JSON_MALFORMED = "json-malformed"
    JSON_SCHEMA_VIOLATION = "json-schema-violation"
    UNKNOWN_SCHEMA = "schema-unknown"
    RECORD_INVALID = "record-invalid"
    ENVELOPE_INVALID = "envelope-invalid"
    ENVELOPE_FIELD_INVALID = "envelope-field-invalid"
    EVENT_TIME_OUT_OF_RANGE = "event-time-out-of-range"
    NON_UTC_TIME = "non-utc-time"


class WireError(Exception):
    """A record could not be encoded or decoded; dead-letter it with this code and reason."""

    def __init__(self, code: WireCode, message: str | None = None) -> None:
        self.code = code
        self.reason = message or (self.__doc__ or "").strip()
        super().__init__(f"{code}: {self.reason}")
