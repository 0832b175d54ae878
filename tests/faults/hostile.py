"""Malformed and hostile input records, each with the dead-letter reason the controller
must give it, and a producer that notes where every record landed.

Every kind is something a broken or malicious producer can really put on the events
topic: bytes that are no Avro, Avro cut short or naming a schema nobody has, JSON that
breaks the envelope schema or nests 30,000 levels deep, events for machines that are
unknown, not pinned or not applicable, records over the size limit, keys that are missing
or name another operation, approvals signed by the wrong key, event ids and approval
nonces already used by another operation.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from confluent_kafka import KafkaError, Message, Producer

from machines.approvals import insecure_test_key, sign_decision
from machines.event import Event, HumanDecision, Lineage
from ops.bench.workload import APPROVER, pinned_machines
from schemas import (
    CONTENT_TYPE,
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    EVENT_ENVELOPE,
    HEADER_RECORD_ID,
    AvroSingleObjectCodec,
    event_to_json,
    event_to_record,
    kafka_config,
)
from tests.support.producers import signer
from tests.support.scopes import catalogue_scope

__all__ = ["MAX_RECORD_BYTES", "Hostile", "Landed", "Outgoing", "RecordingProducer"]

# The controller's record size limit in the bad-input test (RECOVERY_CONTROLLER_MAX_RECORD_BYTES).
MAX_RECORD_BYTES: Final = 65_536
_AVRO = AvroSingleObjectCodec()
# JSON nested this deep stays under the size limit but far beyond any parser's recursion
# limit: it must be refused as malformed, not crash the controller.
_DEPTH: Final = 30_000


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One record to produce: `reason` is the dead-letter code it must get (a prefix
    when it ends with `*`), None for a good record that must be decided."""

    kind: str
    key: bytes | None
    value: bytes
    content_type: str
    reason: str | None = None
    event_id: str | None = None
    producer: str = "fault-tool"  # the test producer whose key signs it


@dataclass(frozen=True, slots=True)
class Landed:
    """Where a produced record landed."""

    record: Outgoing
    partition: int
    offset: int

    def coordinates(self, topic: str) -> str:
        """`topic[partition]@offset`, as dead letters name it."""
        return f"{topic}[{self.partition}]@{self.offset}"


class RecordingProducer:
    """An idempotent producer that records each record's partition and offset."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.landed: list[Landed] = []
        self.errors: list[str] = []
        self._producer = Producer(
            {**kafka_config(bootstrap), "enable.idempotence": True, "acks": "all"}
        )

    def send(self, record: Outgoing) -> None:
        """Produce `record` (its key may be None: a record without a key)."""

        def delivered(error: KafkaError | None, message: Message[Any, Any]) -> None:
            if error is not None:
                self.errors.append(f"{record.kind}: {error}")
                return
            partition, offset = message.partition(), message.offset()
            assert partition is not None
            assert offset is not None
            self.landed.append(Landed(record, partition, offset))

        plain: list[tuple[str, bytes | None]] = [
            (CONTENT_TYPE, record.content_type.encode()),
            (HEADER_RECORD_ID, f"fault:{uuid.uuid4().hex}".encode()),
        ]
        # Signed by its producer, as every client library record is: the hostile part is
        # the content, which intake must refuse for its own reason.
        headers: list[tuple[str, str | bytes | None]] = list(
            signer(record.producer).sign(self.topic, record.key, record.value, plain)
        )
        self._producer.produce(
            self.topic, value=record.value, key=record.key, headers=headers, on_delivery=delivered
        )
        self._producer.poll(0)

    def flush(self) -> None:
        """Wait for every delivery report; raises if any record was not delivered."""
        left = self._producer.flush(60)
        if left or self.errors:
            raise AssertionError(f"{left} records undelivered; errors: {self.errors[:5]}")


class Hostile:
    """Builds good and hostile records for operations named `<prefix>-<n>`."""

    def __init__(self, prefix: str, seed: int) -> None:
        self.prefix = prefix
        self.rng = random.Random(seed)
        machines, _ = pinned_machines()
        self.machines = machines
        self.serial = 0
        self.approver = insecure_test_key(APPROVER)
        self.forger = insecure_test_key("mallory")

    # -- events -----------------------------------------------------------------------

    def op(self) -> str:
        """A fresh operation id."""
        self.serial += 1
        return f"{self.prefix}-{self.serial}"

    def event(
        self,
        op: str,
        event_type: str = "TOOL_TIMEOUT",
        *,
        machine: str = "email-send",
        version: str = "1.0.0",
        agent: str = "mail-agent",
        event_id: str | None = None,
        **fields: Any,
    ) -> Event:
        """An event of `op` (email-send by default: TOOL_TIMEOUT leads to `unresolved`,
        where a human rejection is accepted)."""
        self.serial += 1
        fields.setdefault("scope", catalogue_scope(machine))
        return Event(
            event_type=event_type,
            event_id=event_id or f"{op}-e{self.serial}",
            operation_id=op,
            correlation_id=f"corr-{op}",
            machine_name=machine,
            machine_version=version,
            event_time=datetime.now(UTC),
            evidence_ref=f"fault-tool:{op}:{self.serial}",
            producer="fault-tool",
            lineage=Lineage(agent=agent, task=f"task-{op}", initiating_principal="oncall"),
            **fields,
        )

    def rejection(self, op: str, nonce: str, *, forged: bool = False) -> Event:
        """A signed HUMAN_REJECTED of email-send `op` in `unresolved`."""
        decision = sign_decision(
            HumanDecision(
                approver=APPROVER,
                operation_id=op,
                state="unresolved",
                transition="containing",
                machine_digest=self.machines["email-send"].digest,
                expires_at=datetime.now(UTC) + timedelta(hours=1),
                nonce=nonce,
                decision="rejected",
            ),
            self.forger if forged else self.approver,
        )
        return replace(
            self.event(op, "HUMAN_REJECTED", event_id=f"decision:{op}:{nonce}"),
            producer=APPROVER,
            evidence_ref=f"approval:{APPROVER}:{nonce}",
            human_decision=decision,
        )

    @staticmethod
    def good(event: Event, kind: str = "good") -> Outgoing:
        """`event` as a well-formed Avro record keyed by its operation."""
        return Outgoing(
            kind,
            event.operation_id.encode(),
            _AVRO.encode(event_to_record(event), EVENT_ENVELOPE),
            CONTENT_TYPE_AVRO,
            None,
            event.event_id,
            event.producer,
        )

    @staticmethod
    def bad(event: Event, kind: str, reason: str, *, key: bytes | str | None = "op") -> Outgoing:
        """`event` encoded well but refused for `reason` (key: the operation by default)."""
        raw_key = event.operation_id.encode() if key == "op" else key
        assert not isinstance(raw_key, str)
        value = _AVRO.encode(event_to_record(event), EVENT_ENVELOPE)
        return Outgoing(
            kind, raw_key, value, CONTENT_TYPE_AVRO, reason, event.event_id, event.producer
        )

    # -- records refused at intake ------------------------------------------------------

    def intake_refusals(self) -> list[Outgoing]:
        """One record of each kind refused at intake (or by the core, for the forged
        approval, which follows the event that opens its operation)."""
        op = self.op
        good_avro = self.good(self.event(op())).value
        cut = good_avro[: len(good_avro) // 2]
        wrong_fingerprint = good_avro[:2] + self.rng.randbytes(8) + good_avro[10:]
        envelope = event_to_json(self.event(op()))
        violation = {k: v for k, v in envelope.items() if k != "operation_id"} | {"extra": 1}
        huge_event = self.event(op(), machine="m" * 40_000)
        huge = json.dumps(event_to_json(huge_event))
        forged_op = op()
        records = [
            Outgoing("undecodable", op().encode(), b"\xc3\x01" + self.rng.randbytes(40),
                     CONTENT_TYPE_AVRO, "avro-*"),
            Outgoing("truncated-avro", op().encode(), cut, CONTENT_TYPE_AVRO, "avro-*"),
            Outgoing("wrong-fingerprint", op().encode(), wrong_fingerprint, CONTENT_TYPE_AVRO,
                     "avro-unknown-fingerprint"),
            Outgoing("schema-violation", op().encode(), json.dumps(violation).encode(),
                     CONTENT_TYPE_JSON, "json-schema-violation"),
            self.bad(self.event(op(), machine="no-such-machine"), "unknown-machine",
                     "machine-unknown"),
            self.bad(self.event(op(), version="9.9.9"), "unpinned-version", "machine-unpinned"),
            self.bad(self.event(op(), machine="delegated-research", agent="intruder"),
                     "not-applicable", "machine-not-applicable"),
            Outgoing("oversized", op().encode(), b"x" * (MAX_RECORD_BYTES + 100),
                     CONTENT_TYPE_JSON, "wire-oversized"),
            self.bad(self.event(op()), "missing-key", "key-mismatch", key=None),
            self.bad(self.event(op()), "key-mismatch", "key-mismatch", key=b"someone-else"),
            Outgoing("deep-json", op().encode(), b"[" * _DEPTH + b"]" * _DEPTH,
                     CONTENT_TYPE_JSON, "json-*"),
            # A 40,000-character machine name is over the envelope's bound (SPEC 6.2).
            Outgoing("huge-strings", huge_event.operation_id.encode(), huge.encode(),
                     CONTENT_TYPE_JSON, "envelope-field-invalid"),
            self.good(self.event(forged_op), "good"),
            self.bad(self.rejection(forged_op, uuid.uuid4().hex, forged=True),
                     "forged-signature", "forged-signature"),
        ]  # fmt: skip
        return records

    def first_uses(self) -> tuple[list[Outgoing], list[tuple[str, str]]]:
        """Good records that use an event id and a nonce first (phase 1): an operation
        opened and rejected by a valid signed decision. Returns the records and
        (event id, nonce) pairs for `reuses`."""
        op = self.op()
        nonce = uuid.uuid4().hex
        opened = self.event(op)
        return (
            [self.good(opened), self.good(self.rejection(op, nonce))],
            [(opened.event_id, nonce)],
        )

    def reuses(self, used: tuple[str, str]) -> list[Outgoing]:
        """Phase 2: an event id and an approval nonce already used by another operation."""
        event_id, nonce = used
        thief, replayer = self.op(), self.op()
        return [
            self.bad(self.event(thief, event_id=event_id), "event-id-reuse", "event-id-conflict"),
            self.good(self.event(replayer)),
            self.bad(self.rejection(replayer, nonce), "replayed-nonce", "approval-nonce-replayed"),
        ]


def matches(reason: str, expected: str) -> bool:
    """Whether a dead letter's `reason` is the `expected` code (a prefix when it ends
    with `*`; `*` alone accepts any reason)."""
    if expected.endswith("*"):
        return reason.startswith(expected[:-1])
    return reason == expected


def reasons_by_kind(
    landed: list[Landed], letters: Mapping[str, str], topic: str
) -> dict[str, set[str]]:
    """The dead-letter reasons each kind of record got (for the progress output)."""
    out: dict[str, set[str]] = {}
    for item in landed:
        reason = letters.get(item.coordinates(topic))
        if reason is not None:
            out.setdefault(item.record.kind, set()).add(reason)
    return out
