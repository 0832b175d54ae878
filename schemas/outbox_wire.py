"""The one encoding of an outbox row's payload as the Kafka record the relay publishes,
and the controller's signature over it.

The ledger stores outbox payloads as JSON; each stream has its own wire format:

- `commands`: a `recovery.CapabilityCommand` Avro single object. The ledger's command
  payload carries the invocation, the machine, the causing event and the operation's
  lineage (older rows without one get it from `lineage_of`).
- `evidence`: a `recovery.EvidenceEvent` Avro single object.
- `dlq`: a `recovery.DeadLetter` Avro single object. The payload is the record already
  (it has `reason_code`), with the original key, value and headers as consumed; rows
  written before conflicts carried the original bytes hold the ledger's older conflict
  form (`reason`, `code`, `envelope`, `source`), still published as before.
- `events`: a `recovery.EventEnvelope` Avro single object (the cascade events).
- `audit`: OCSF API Activity JSON (`schemas.ocsf`), every record of the topic: the
  audit records, each batch's `chain-heads` record (each chain the batch extended, with
  its newest sequence and hash, `schemas.heads_to_ocsf`) and a purge's `tombstone`
  (an audit record of its chain, activity Delete); header `recovery-kind` names the
  kind. A body without a time of its own (an `operation-opened` record, chain heads)
  takes the time the controller signed it (row header `published_time`), or else the
  relay's publish time. (Before, chain heads and tombstones went out as plain
  canonical JSON; `recoveryctl audit verify --against-topic` reads both forms.)

The controller encodes each row once, when it signs it (`OutboxSigner`, so the relay
never holds the controller's key), and the ledger stores what it signed: the value bytes
(`SignedRow.value`, outbox column `value`, migration 0012) and, among the row's headers,
the stream's own (`WIRE_ROW_HEADERS`: `content_type`, `schema`, `command_id`). The relay
publishes those as they are, without encoding anything again. A row stored without a
value (written before migration 0012, or by a writer without a signer) is encoded by the
relay with `encode_outbox_value`, the same function; the encoding is deterministic, so
the bytes it publishes are the bytes the controller signed, and a relay that changes one
breaks the signature.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from machines import Invocation, Lineage, canonical_ascii_json
from schemas.catalog import CAPABILITY_COMMAND, DEAD_LETTER, EVENT_ENVELOPE, EVIDENCE_EVENT
from schemas.codec import AvroSingleObjectCodec
from schemas.command import CapabilityCommand
from schemas.envelope import event_to_record, record_to_event
from schemas.headers import (
    CONTENT_TYPE,
    CONTENT_TYPE_JSON,
    HEADER_COMMAND_ID,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
)
from schemas.ocsf import (
    HEADS_KIND,
    TOMBSTONE_KIND,
    audit_to_ocsf,
    audit_to_ocsf_json,
    heads_to_ocsf,
)
from schemas.settings import DEFAULT_CONTROLLER_ID, TopicNames
from schemas.signing import HEADER_KEY_ID, HEADER_PRODUCER, HEADER_SIGNATURE, RecordSigner

__all__ = [
    "ANCHOR_KINDS",
    "OUTBOX_STREAMS",
    "PUBLISHED_TIME",
    "SIGNATURE_ROW_HEADERS",
    "WIRE_ROW_HEADERS",
    "OutboxSigner",
    "SignedRow",
    "WireValue",
    "encode_outbox_value",
    "needs_published_time",
    "outbox_stream",
]

OUTBOX_STREAMS: Final = ("commands", "audit", "dlq", "evidence", "events")
# The row header holding the time an audit record without its own was signed at.
PUBLISHED_TIME: Final = "published_time"
# The row headers the signature is stored in; the relay copies a row header `name` as
# `recovery-<name>`, so these become `recovery-producer`, `-key-id`, `-signature`.
SIGNATURE_ROW_HEADERS: Final = {
    "producer": HEADER_PRODUCER,
    "key_id": HEADER_KEY_ID,
    "signature": HEADER_SIGNATURE,
}
# The row headers a signed row stores its stream's Kafka headers in (row name -> Kafka
# header), so that the relay publishes the stored value without encoding it again. The
# relay copies a row header `name` as `recovery-<name>`, which gives `recovery-schema`
# and `recovery-command-id` already; `content_type` and `schema` it passes to the
# producer as the content type and schema fingerprint instead.
ROW_CONTENT_TYPE: Final = "content_type"
ROW_SCHEMA: Final = "schema"
ROW_COMMAND_ID: Final = "command_id"
WIRE_ROW_HEADERS: Final = {
    ROW_CONTENT_TYPE: CONTENT_TYPE,
    ROW_SCHEMA: HEADER_SCHEMA,
    ROW_COMMAND_ID: HEADER_COMMAND_ID,
}
_ROW_NAME_OF: Final = {header: name for name, header in WIRE_ROW_HEADERS.items()}
_DEFAULT_NAMES: Final = TopicNames()
_EPOCH: Final = "1970-01-01T00:00:00+00:00"
_OWN_TIMES: Final = ("occurred_at", "occurred_time", "decided_at")
# Audit-topic records that are not one decision's link: the batch's signed chain heads
# and a purge's tombstone (both OCSF, as every record of the topic).
ANCHOR_KINDS: Final = frozenset({HEADS_KIND, TOMBSTONE_KIND})

LineageLookup = Callable[[str], Lineage]


@dataclass(frozen=True, slots=True)
class WireValue:
    """A row's value bytes, content type, schema fingerprint (Avro) and the headers its
    stream adds (`recovery-command-id` for commands)."""

    value: bytes
    content_type: str
    fingerprint: str | None
    extra: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SignedRow:
    """What `OutboxSigner` makes of a row: its headers with the signature and the
    stream's headers added (`SIGNATURE_ROW_HEADERS`, `WIRE_ROW_HEADERS`, and
    `published_time` when it needed one), and the exact value bytes it signed."""

    headers: dict[str, str]
    value: bytes


def outbox_stream(topics: TopicNames, topic: str) -> str:
    """Which stream an outbox row belongs to: the configured topic names first, then the
    default names, which the ledger writes as logical stream names. Raises `ValueError`."""
    for names in (topics, _DEFAULT_NAMES):
        for stream in OUTBOX_STREAMS:
            if getattr(names, stream) == topic:
                return stream
    raise ValueError(
        f"topic {topic} is none of the recovery streams (configured: {', '.join(topics.all())})"
    )


def _no_lineage(operation_id: str) -> Lineage:
    raise ValueError(f"command payload of operation {operation_id} has no lineage")


def encode_outbox_value(
    stream: str,
    key: str,
    payload: Mapping[str, Any],
    codec: AvroSingleObjectCodec,
    *,
    lineage_of: LineageLookup = _no_lineage,
    published_time: str | None = None,
) -> WireValue:
    """The Kafka value of one outbox row of `stream`. Raises `WireError`, `KeyError`,
    `TypeError` or `ValueError` when the payload does not fit the stream's schema."""
    if stream == "audit":
        return WireValue(_ocsf(payload, published_time), CONTENT_TYPE_JSON, None, {})
    if stream == "commands":
        command = _command(payload, lineage_of)
        value, fingerprint = _avro(codec, command.to_record(), CAPABILITY_COMMAND)
        return WireValue(
            value, codec.content_type, fingerprint, {HEADER_COMMAND_ID: command.command_id}
        )
    if stream == "dlq":
        record = _dead_letter(key, payload)
    elif stream == "events":
        # A cascade event (ledger.cascade): the envelope any producer would send,
        # validated again so a bad row is held back, never published.
        record = event_to_record(record_to_event(payload))
    elif stream == "evidence":
        record = _evidence(payload)
    else:
        raise ValueError(f"stream {stream} is none of {', '.join(OUTBOX_STREAMS)}")
    schema = {"dlq": DEAD_LETTER, "events": EVENT_ENVELOPE, "evidence": EVIDENCE_EVENT}[stream]
    value, fingerprint = _avro(codec, record, schema)
    return WireValue(value, codec.content_type, fingerprint, {})


def needs_published_time(payload: Mapping[str, Any]) -> bool:
    """Whether an audit payload has no time of its own for OCSF's `time` (chain heads
    never have one; a tombstone has its `purged_at`)."""
    if any(payload.get(k) for k in _OWN_TIMES):
        return False
    body = payload.get("record")
    return not (isinstance(body, Mapping) and bool(body.get("decided_at") or body.get("purged_at")))


class OutboxSigner:
    """The controller's signature on the outbox rows it writes: called with a row's
    topic, key, record id, headers and payload text when the row is built, it encodes the
    row once and returns a `SignedRow`: the value bytes, and the row's headers with
    `producer`, `key_id` and `signature` added, the stream's headers (`content_type`,
    `schema`, `command_id`) and `published_time` for an audit record without its own
    time. The signature is over the exact record the relay publishes
    (`schemas.RecordSigner`: topic, key, value, signed headers)."""

    def __init__(
        self,
        signer: RecordSigner,
        topics: TopicNames,
        codec: AvroSingleObjectCodec | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.signer = signer
        self.topics = topics
        self._codec = codec or AvroSingleObjectCodec()
        self._clock = clock

    @property
    def producer(self) -> str:
        """The controller's producer id in the roster."""
        return self.signer.producer

    def __call__(
        self,
        topic: str,
        key: str,
        record_id: str,
        headers: Mapping[str, str],
        payload_json: str,
    ) -> SignedRow:
        stream = outbox_stream(self.topics, topic)
        payload = orjson.loads(payload_json)
        out = {
            k: v
            for k, v in headers.items()
            if k not in SIGNATURE_ROW_HEADERS and k not in WIRE_ROW_HEADERS
        }
        published = None
        if stream == "audit" and needs_published_time(payload):
            published = out.get(PUBLISHED_TIME) or self._clock().isoformat()
            out[PUBLISHED_TIME] = published
        wire = encode_outbox_value(stream, key, payload, self._codec, published_time=published)
        kafka_headers: list[tuple[str, bytes | None]] = [
            (CONTENT_TYPE, wire.content_type.encode("utf-8")),
            (HEADER_RECORD_ID, record_id.encode("utf-8")),
        ]
        out[ROW_CONTENT_TYPE] = wire.content_type
        if wire.fingerprint is not None:
            kafka_headers.append((HEADER_SCHEMA, wire.fingerprint.encode("utf-8")))
            out[ROW_SCHEMA] = wire.fingerprint
        for name, text in wire.extra.items():
            kafka_headers.append((name, text.encode("utf-8")))
            out[_ROW_NAME_OF[name]] = text
        signed = dict(
            self.signer.sign(
                getattr(self.topics, stream), key.encode("utf-8"), wire.value, kafka_headers
            )
        )
        for row_name, header in SIGNATURE_ROW_HEADERS.items():
            value = signed[header]
            out[row_name] = "" if value is None else value.decode("utf-8")
        return SignedRow(out, wire.value)


def _avro(
    codec: AvroSingleObjectCodec, record: Mapping[str, Any], schema: str
) -> tuple[bytes, str]:
    return codec.encode(record, schema), codec.fingerprint(schema)


def _command(payload: Mapping[str, Any], lineage_of: LineageLookup) -> CapabilityCommand:
    operation_id = str(payload["operation_id"])
    raw = payload.get("lineage")
    lineage = _lineage(raw) if isinstance(raw, Mapping) else lineage_of(operation_id)
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


def _ocsf(payload: Mapping[str, Any], published_time: str | None) -> bytes:
    """The OCSF event of an audit record as compact JSON with sorted keys. Some audit
    bodies carry no time of their own (`operation-opened`, for one): OCSF needs one, so
    the controller's signing time (or, for an unsigned row, the relay's publish time)
    stands in and `unmapped.recovery.time_source` says which. The chain hash
    (`metadata.uid`) and the record id are unaffected, so a republished record still
    dedupes."""
    if not needs_published_time(payload):
        return audit_to_ocsf_json(payload)
    when = published_time or datetime.now(UTC).isoformat()
    if payload.get("kind") == HEADS_KIND:
        event = heads_to_ocsf(payload, when)
    else:
        event = audit_to_ocsf({**payload, "occurred_at": when})
    source = "controller-sign-time" if published_time else "relay-publish-time"
    event["unmapped"]["recovery"]["time_source"] = source
    return canonical_ascii_json(event)


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


def _dead_letter(key: str, payload: Mapping[str, Any]) -> dict[str, Any]:
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
        "original_key": key.encode("utf-8"),
        "original_value": json.dumps(envelope, sort_keys=True).encode("utf-8"),
        "original_headers": [],
        "event_id": envelope.get("event_id") if isinstance(envelope, Mapping) else None,
        "operation_id": key,
        # Deterministic (a republished dead letter is byte-identical): the refused
        # event's own time stands in when the writer recorded none.
        "dead_lettered_at": _time(payload.get("dead_lettered_at") or when or _EPOCH),
        "controller": str(payload.get("controller") or DEFAULT_CONTROLLER_ID),
    }


def _evidence(payload: Mapping[str, Any]) -> dict[str, Any]:
    record = dict(payload)
    record["recorded_at"] = _time(record["recorded_at"])
    return record
