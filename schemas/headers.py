"""Kafka header names and deterministic record ids shared by every producer and consumer.

Headers carry what a consumer needs before (or instead of) decoding the value: how it is
encoded, which schema wrote it, a deterministic id to dedupe on, and the W3C trace
context (`traceparent`, `tracestate`, written by OpenTelemetry's propagator).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "CONTENT_TYPE",
    "CONTENT_TYPE_AVRO",
    "CONTENT_TYPE_JSON",
    "HEADER_CALL_CONTEXT",
    "HEADER_COMMAND_ID",
    "HEADER_RECORD_ID",
    "HEADER_SCHEMA",
    "TRACEPARENT",
    "TRACESTATE",
    "header_value",
    "record_id",
]

CONTENT_TYPE: Final = "content-type"
HEADER_SCHEMA: Final = "recovery-schema"
HEADER_RECORD_ID: Final = "recovery-record-id"
HEADER_COMMAND_ID: Final = "recovery-command-id"
# The call context an agent's runtime signed for the call (`machines.call_context`),
# forwarded by the tool on the event that opens the operation.
HEADER_CALL_CONTEXT: Final = "recovery-call-context"
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"

# Avro single-object encoding (the default when the header is absent) and JSON for
# tools that cannot speak Avro.
CONTENT_TYPE_AVRO: Final = "application/vnd.apache.avro.single-object"
CONTENT_TYPE_JSON: Final = "application/json"


def record_id(kind: str, *parts: str) -> str:
    """A deterministic record id: `<kind>:` and the first 32 hex digits of the SHA-256 of
    the parts. The same logical record (say, the result of one command) always gets the
    same id, however often it is published, so consumers of the topic can dedupe on it.
    NUL separators keep ("a", "bc") and ("ab", "c") apart."""
    digest = hashlib.sha256("\x00".join((kind, *parts)).encode("utf-8")).hexdigest()
    return f"{kind}:{digest[:32]}"


def header_value(
    headers: Iterable[tuple[str, bytes | None]] | Sequence[tuple[str, bytes | None]] | None,
    name: str,
) -> str | None:
    """The last non-null value of header `name` decoded as UTF-8 (an empty value is
    ""), or None when there is none or that last value is not UTF-8 (a hostile header
    is treated as missing rather than crashing the reader); docs/wire-protocol.md §6."""
    found: str | None = None
    for key, value in headers or ():
        if key != name or value is None:
            continue
        try:
            found = value.decode("utf-8")
        except UnicodeDecodeError:
            found = None
    return found
