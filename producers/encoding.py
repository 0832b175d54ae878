"""How the relay turns an outbox row into a Kafka record: value bytes and headers.

A row the controller signed carries the exact value it signed (`OutboxRecord.value`,
outbox column `value`, migration 0012) and, among its headers, the stream's own
(`schemas.WIRE_ROW_HEADERS`: `content_type`, `schema`, `command_id`): the relay
publishes them as they are, without encoding anything. A row without a value (written
before migration 0012, or by a writer without a signer) is encoded with
`schemas.encode_outbox_value` (the module `schemas/outbox_wire.py` describes the wire
format of every topic), the same function the controller signs with, so the relay
publishes exactly the bytes the controller signed and never re-signs anything. A command
row without a lineage in its payload (written before rows carried one) gets it from the
ledger's operation row, looked up once per operation per lease.

A row's `topic` names its stream: either a configured topic name or the default name
(`recovery.commands`...), which the ledger writes as a logical stream name; the record
goes to the configured topic of that stream.

Every record gets `content-type`, `recovery-record-id` (the row's deterministic id),
`recovery-schema` for Avro, `recovery-command-id` for commands, the row's own headers as
`recovery-<name>` (the controller's signature among them: `recovery-producer`,
`recovery-key-id`, `recovery-signature`), and the W3C trace context the row carries
(`traceparent`, `tracestate`), which the relay continues rather than replaces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Final

from ledger import OutboxRecord
from machines import Lineage
from producers.errors import ProducersError
from schemas import (
    CONTENT_TYPE,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    PUBLISHED_TIME,
    TRACEPARENT,
    TRACESTATE,
    AvroSingleObjectCodec,
    TopicNames,
    WireError,
    WireValue,
    encode_outbox_value,
    outbox_stream,
)

__all__ = ["EncodedRecord", "LineageLookup", "RecordEncoder", "UnpublishableRow"]

# Row headers that the relay maps to standard Kafka headers instead of copying (the
# producer adds `content-type` and `recovery-schema` from the record's content type and
# fingerprint); a signed row's `command_id` is copied, as `recovery-command-id`.
_CONTENT_TYPE: Final = "content_type"
_SCHEMA: Final = "schema"
_RESERVED: Final = frozenset(
    {"record_id", PUBLISHED_TIME, TRACEPARENT, TRACESTATE, _CONTENT_TYPE, _SCHEMA}
)

LineageLookup = Callable[[str], Lineage]


class UnpublishableRow(ProducersError):
    """An outbox row cannot be encoded for its topic; it stays unpublished (and blocks
    its key, so that later rows are never published ahead of it): fix the writer."""


@dataclass(frozen=True, slots=True)
class EncodedRecord:
    """One row ready for the producer."""

    record_id: str
    topic: str
    key: str
    value: bytes
    content_type: str
    fingerprint: str | None
    headers: Mapping[str, str]
    trace_carrier: Mapping[str, str]

    def kafka_headers(self) -> list[tuple[str, bytes | None]]:
        """The headers the record is published with, before the trace context: what
        its signature covers, and what a reader verifies it against."""
        headers = {CONTENT_TYPE: self.content_type, HEADER_RECORD_ID: self.record_id}
        if self.fingerprint is not None:
            headers[HEADER_SCHEMA] = self.fingerprint
        headers.update(self.headers)
        return [(name, value.encode("utf-8")) for name, value in headers.items()]


class RecordEncoder:
    """Encodes outbox rows for their topics (see the module docstring)."""

    def __init__(
        self,
        topics: TopicNames,
        lineage_of: LineageLookup,
        codec: AvroSingleObjectCodec | None = None,
    ) -> None:
        self._topics = topics
        self._lineage_of = lineage_of
        self._codec = codec or AvroSingleObjectCodec()
        # Topic name -> stream, worked out once per name: the relay asks for every row.
        self._streams: dict[str, str] = {}

    def encode(self, row: OutboxRecord) -> EncodedRecord:
        """The Kafka record for `row`; raises `UnpublishableRow` naming the row when the
        payload does not fit its topic's schema or the topic is not a recovery topic."""
        try:
            stream = self._stream(row.topic)
            wire = self._wire(stream, row)
        except (WireError, KeyError, TypeError, ValueError) as exc:
            raise UnpublishableRow(
                f"outbox row {row.record_id} (position {row.position}, key {row.key}, topic "
                f"{row.topic}): cannot be encoded: {exc}; it stays unpublished and holds back "
                "its key; fix the row's writer"
            ) from exc
        headers = {
            _header_name(name): str(v) for name, v in row.headers.items() if name not in _RESERVED
        }
        headers.update(wire.extra)
        carrier = {k: str(row.headers[k]) for k in (TRACEPARENT, TRACESTATE) if k in row.headers}
        topic = getattr(self._topics, stream)
        return EncodedRecord(
            row.record_id,
            topic,
            row.key,
            wire.value,
            wire.content_type,
            wire.fingerprint,
            headers,
            carrier,
        )

    def _wire(self, stream: str, row: OutboxRecord) -> WireValue:
        if row.value is not None:
            # Signed by the controller as stored: published as it is.
            content_type = row.headers.get(_CONTENT_TYPE)
            if not content_type:
                raise ValueError("the row has a value but no content_type header")
            return WireValue(row.value, str(content_type), row.headers.get(_SCHEMA), {})
        return encode_outbox_value(
            stream,
            row.key,
            row.payload,
            self._codec,
            lineage_of=self._lineage_of,
            published_time=row.headers.get(PUBLISHED_TIME),
        )

    def _stream(self, topic: str) -> str:
        stream = self._streams.get(topic)
        if stream is None:
            stream = self._streams[topic] = outbox_stream(self._topics, topic)
        return stream


@cache
def _header_name(name: str) -> str:
    """The Kafka header a row header is copied as (`operation_id` -> `recovery-operation-id`);
    rows use a handful of names, so each is worked out once."""
    return f"recovery-{name.replace('_', '-')}"
