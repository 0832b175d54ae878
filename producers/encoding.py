"""How the relay turns an outbox row into a Kafka record: value bytes and headers.

The ledger stores outbox payloads as JSON; each topic has its own wire format:

- `recovery.commands`: a `recovery.CapabilityCommand` Avro single object. The ledger's
  command payload (`ledger.records._command_rows`) carries the invocation, the machine
  and the causing event; the operation's lineage comes from the payload when present,
  otherwise from the ledger's operation row (looked up once per operation per lease).
- `recovery.evidence`: a `recovery.EvidenceEvent` Avro single object.
- `recovery.dlq`: a `recovery.DeadLetter` Avro single object. The payload is the record
  already (it has `reason_code`), with the original key, value and headers as consumed;
  rows written before conflicts carried the original bytes hold the ledger's older
  conflict form (`reason`, `code`, `envelope`, `source`), still published as before.
- `recovery.events`: a `recovery.EventEnvelope` Avro single object: the cascade events
  the ledger plans when an operation is contained (`ledger.cascade`), keyed by the
  descendant operation, read by the controller like any producer's event.
- `recovery.audit`: OCSF API Activity JSON (`schemas.ocsf`), readable by a SIEM without
  our code.

A row's `topic` names its stream: either a configured topic name or the default name
(`recovery.commands`...), which the ledger writes as a logical stream name; the record
goes to the configured topic of that stream.

Every record gets `content-type`, `recovery-record-id` (the row's deterministic id),
`recovery-schema` for Avro, `recovery-command-id` for commands, the row's own headers as
`recovery-<name>`, and the W3C trace context the row carries (`traceparent`,
`tracestate`), which the relay continues rather than replaces.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final

from ledger import OutboxRecord
from machines import Invocation, Lineage
from producers.errors import ProducersError
from schemas import (
    CAPABILITY_COMMAND,
    CONTENT_TYPE_JSON,
    DEAD_LETTER,
    EVENT_ENVELOPE,
    EVIDENCE_EVENT,
    HEADER_COMMAND_ID,
    TRACEPARENT,
    TRACESTATE,
    AvroSingleObjectCodec,
    CapabilityCommand,
    TopicNames,
    WireError,
    audit_to_ocsf,
    audit_to_ocsf_json,
    event_to_record,
    record_to_event,
)

__all__ = ["EncodedRecord", "LineageLookup", "RecordEncoder", "UnpublishableRow"]

# Row headers that the relay maps to standard Kafka headers instead of copying.
_RESERVED: Final = frozenset({"record_id", TRACEPARENT, TRACESTATE})
_CONTROLLER: Final = "recovery-controller"
_STREAMS: Final = ("commands", "audit", "dlq", "evidence", "events")
_DEFAULT_NAMES: Final = TopicNames()

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
        # Topic name -> stream, configured names first (see `_stream`), worked out once:
        # the relay asks for every row it publishes.
        self._streams: dict[str, str] = {}
        for names in (topics, _DEFAULT_NAMES):
            for stream in _STREAMS:
                self._streams.setdefault(getattr(names, stream), stream)

    def encode(self, row: OutboxRecord) -> EncodedRecord:
        """The Kafka record for `row`; raises `UnpublishableRow` naming the row when the
        payload does not fit its topic's schema or the topic is not a recovery topic."""
        try:
            value, content_type, fingerprint, extra = self._value(row)
        except (WireError, KeyError, TypeError, ValueError) as exc:
            raise UnpublishableRow(
                f"outbox row {row.record_id} (position {row.position}, key {row.key}, topic "
                f"{row.topic}): cannot be encoded: {exc}; it stays unpublished and holds back "
                "its key; fix the row's writer"
            ) from exc
        headers = {
            _header_name(name): str(v) for name, v in row.headers.items() if name not in _RESERVED
        }
        headers.update(extra)
        carrier = {k: str(row.headers[k]) for k in (TRACEPARENT, TRACESTATE) if k in row.headers}
        topic = getattr(self._topics, self._stream(row.topic))
        return EncodedRecord(
            row.record_id, topic, row.key, value, content_type, fingerprint, headers, carrier
        )

    def _stream(self, topic: str) -> str:
        """Which stream an outbox row belongs to: the configured topic names first, then
        the default names, which the ledger writes as logical stream names."""
        stream = self._streams.get(topic)
        if stream is not None:
            return stream
        raise ValueError(
            f"topic {topic} is none of the recovery streams (configured: "
            f"{', '.join(self._topics.all())})"
        )

    def _value(self, row: OutboxRecord) -> tuple[bytes, str, str | None, dict[str, str]]:
        payload = row.payload
        stream = self._stream(row.topic)
        if stream == "audit":
            return _ocsf(payload), CONTENT_TYPE_JSON, None, {}
        if stream == "commands":
            command = self._command(payload)
            extra = {HEADER_COMMAND_ID: command.command_id}
            return (*self._avro(command.to_record(), CAPABILITY_COMMAND), extra)
        if stream == "dlq":
            return (*self._avro(_dead_letter(row), DEAD_LETTER), {})
        if stream == "events":
            # A cascade event (ledger.cascade): the envelope any producer would send,
            # validated again here so a bad row is held back, never published.
            return (*self._avro(event_to_record(record_to_event(payload)), EVENT_ENVELOPE), {})
        return (*self._avro(_evidence(payload), EVIDENCE_EVENT), {})

    def _avro(self, record: Mapping[str, Any], schema: str) -> tuple[bytes, str, str]:
        value = self._codec.encode(record, schema)
        return value, self._codec.content_type, self._codec.fingerprint(schema)

    def _command(self, payload: Mapping[str, Any]) -> CapabilityCommand:
        operation_id = str(payload["operation_id"])
        raw = payload.get("lineage")
        lineage = _lineage(raw) if isinstance(raw, Mapping) else self._lineage_of(operation_id)
        machine = payload["machine"]
        invocation = Invocation(
            command_id=str(payload["command_id"]),
            capability=str(payload["capability"]),
            kind=str(payload["kind"]),
            material=bool(payload["material"]),
            params=dict(payload.get("params") or {}),
            origin=str(payload["origin"]),
        )
        deadline = payload.get("deadline")
        return CapabilityCommand.from_invocation(
            invocation,
            operation_id=operation_id,
            correlation_id=str(payload["correlation_id"]),
            causation_event_id=str(payload["caused_by_event"]),
            machine_name=str(machine["name"]),
            machine_version=str(machine["version"]),
            machine_digest=str(machine["digest"]),
            sequence=int(payload["sequence"]),
            lineage=lineage,
            issued_at=_time(payload["decided_at"]),
            deadline=None if deadline is None else _time(deadline),
            idempotency_key=payload.get("idempotency_key"),
        )


@cache
def _header_name(name: str) -> str:
    """The Kafka header a row header is copied as (`operation_id` -> `recovery-operation-id`);
    rows use a handful of names, so each is worked out once."""
    return f"recovery-{name.replace('_', '-')}"


def _ocsf(payload: Mapping[str, Any]) -> bytes:
    """The OCSF event of an audit record as compact JSON with sorted keys. Some audit
    bodies carry no time of their own (`operation-opened`, for one): OCSF needs one, so
    the publish time stands in and `unmapped.recovery.time_source` says so. The chain
    hash (`metadata.uid`) and the record id are unaffected, so a republished record
    still dedupes."""
    if any(payload.get(k) for k in _OWN_TIMES) or _nested_time(payload):
        return audit_to_ocsf_json(payload)
    event = audit_to_ocsf({**payload, "occurred_at": datetime.now(UTC).isoformat()})
    event["unmapped"]["recovery"]["time_source"] = "relay-publish-time"
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode("utf-8")


_OWN_TIMES: Final = ("occurred_at", "occurred_time", "decided_at")


def _nested_time(payload: Mapping[str, Any]) -> bool:
    body = payload.get("record")
    return isinstance(body, Mapping) and bool(body.get("decided_at"))


def _lineage(raw: Mapping[str, Any]) -> Lineage:
    return Lineage(
        agent=str(raw["agent"]),
        task=str(raw["task"]),
        initiating_principal=str(raw["initiating_principal"]),
        origin_operation=raw.get("origin_operation"),
        parent_operation=raw.get("parent_operation"),
        delegated_credentials=tuple(raw.get("delegated_credentials") or ()),
    )


def _time(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        raise ValueError(f"time {value!r} has no UTC offset")
    return moment.astimezone(UTC)


def _kafka_time(value: Any) -> datetime:
    # The controller stores the source record's Kafka timestamp as it reads it: epoch
    # milliseconds. Read as ISO-8601 it would be refused (and, being unpublishable, hold
    # back every later row of its key, commands included).
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000, UTC)
    return _time(value)


def _bytes(value: Any) -> bytes | None:
    # JSON cannot hold bytes: writers store them base64-encoded.
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    return base64.b64decode(str(value), validate=True)


def _dead_letter(row: OutboxRecord) -> dict[str, Any]:
    payload = row.payload
    if "reason_code" in payload:
        record = dict(payload)
        record["original_key"] = _bytes(record.get("original_key"))
        record["original_value"] = _bytes(record.get("original_value"))
        record["original_headers"] = [
            {"key": str(h["key"]), "value": _bytes(h.get("value"))}
            for h in record.get("original_headers") or ()
        ]
        record["dead_lettered_at"] = _time(record["dead_lettered_at"])
        stamp = record.get("source_timestamp")
        record["source_timestamp"] = None if stamp is None else _kafka_time(stamp)
        return record
    # The ledger's conflict form: the refused envelope is the original value, as JSON.
    envelope = payload.get("envelope") or {}
    source = payload.get("source") or {}
    when = envelope.get("event_time") if isinstance(envelope, Mapping) else None
    return {
        "reason_code": str(payload["code"]),
        "reason": str(payload["reason"]),
        "source_topic": str(source.get("topic", "")),
        "source_partition": int(source.get("partition", -1)),
        "source_offset": int(source.get("offset", -1)),
        "source_timestamp": None,
        "original_key": row.key.encode("utf-8"),
        "original_value": json.dumps(envelope, sort_keys=True).encode("utf-8"),
        "original_headers": [],
        "event_id": envelope.get("event_id") if isinstance(envelope, Mapping) else None,
        "operation_id": row.key,
        # Deterministic (a republished dead letter is byte-identical): the refused
        # event's own time stands in when the writer recorded none.
        "dead_lettered_at": _time(payload.get("dead_lettered_at") or when or _EPOCH),
        "controller": str(payload.get("controller") or _CONTROLLER),
    }


_EPOCH: Final = "1970-01-01T00:00:00+00:00"


def _evidence(payload: Mapping[str, Any]) -> dict[str, Any]:
    record = dict(payload)
    record["recorded_at"] = _time(record["recorded_at"])
    return record
