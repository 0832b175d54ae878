"""Intake: one consumed Kafka record becomes either an event for a pinned machine or a
refusal with a stable reason code. Pure apart from the decoder's CPU work.

Checks, in order (each failure is a `Refusal` whose code is the dead-letter reason):

1. size: key, value and headers together at most `max_record_bytes` (`wire-oversized`);
2. decoding by `content-type` (Avro single-object or strict JSON; `schemas.WireCode`);
3. the record must be an event envelope (`schema-unexpected`) that validates into an
   `Event` (`envelope-invalid`);
   then, before anything about the event is believed, its producer: the record must be
   signed (`schemas.verify_record`: headers `recovery-producer`, `recovery-key-id`,
   `recovery-signature`) by a key of a producer in the roster, valid now and not
   revoked (the `machines.AuthRefusal` codes: `signature-missing`,
   `signature-malformed`, `producer-unknown`, `key-unknown`, `key-revoked`,
   `key-not-yet-valid`, `key-expired`, `signature-invalid`), and the envelope's
   `producer` must be that producer (`identity-mismatch`). Whether it may send this
   event for this operation (`role-not-permitted`) needs the operation's stored scope
   and is checked by `consumer.batch` (`machines.producer_roles`);
4. the Kafka key must be the operation id (`key-mismatch`): per-operation order and the
   partition's single owner both rest on it;
5. the named machine must be pinned (`machine-unknown`), and the `applies_to` of one
   of its pinned versions must admit what the envelope tells about the operation
   (`machine-not-applicable`): the affected agent (`lineage.agent`) always, and, when
   the envelope carries a `scope` block, its capability, tool and environment too,
   through `machines.applies` (the rule `select_machine` uses). An envelope without
   `scope` (schema v1/v2 producers) is checked on the agent only. Which *version*
   decides is the batch's call (`consumer.batch`): an operation stays on the version it
   opened under whatever version a later event names, and a new one opens on the
   version the lock marks current; an event naming a version that is not pinned is
   `Accepted` with `unpinned` set, and refused (`machine-unpinned`) only if it would
   open an operation. A later event naming another machine is refused by the batch;
6. the event time must lie in `EVENT_TIME_WINDOW` (`event-time-out-of-range`): a time
   like 9999-12-31 is no event's, and a deadline computed from it would overflow.

Whatever else goes wrong on one record (a bug met by odd input) is caught too: the
record is refused as `record-failed` with the stage (`intake`) and the exception, so no
record can stop the partition (`consumer.batch` guards the later stages the same way).

`IntakeResult` is what intake makes of one record: `Accepted` or `Rejected`. The dead
letters of a partition, intake's refusals and the batch's, are audited on the ledger's
intake chain of that partition (`ledger.intake_chain_id`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from machines import (
    OPENING_CONFLICT,
    AuthenticationError,
    AuthRefusal,
    Event,
    Machine,
    OperationScope,
    Pins,
    ProducerEntry,
    Roster,
    applies,
    minimize_event,
)
from schemas import (
    CONTENT_TYPE,
    EVENT_ENVELOPE,
    WireDecoder,
    WireError,
    event_to_record,
    header_value,
    verify_record,
)
from schemas import record_to_event as _record_to_event

__all__ = [
    "EVENT_TIME_WINDOW",
    "Accepted",
    "Intake",
    "IntakeResult",
    "RawRecord",
    "Refusal",
    "RefusalCode",
    "Rejected",
    "failed",
    "unpinned_refusal",
]

log = logging.getLogger("consumer")

Header = tuple[str, bytes | None]


class RefusalCode:
    """Reason codes the controller adds to `schemas.WireCode`'s."""

    OVERSIZED: Final = "wire-oversized"
    SCHEMA_UNEXPECTED: Final = "schema-unexpected"
    KEY_MISMATCH: Final = "key-mismatch"
    MACHINE_UNKNOWN: Final = "machine-unknown"
    MACHINE_UNPINNED: Final = "machine-unpinned"
    MACHINE_NOT_APPLICABLE: Final = "machine-not-applicable"
    EVENT_ID_CONFLICT: Final = "event-id-conflict"
    FORGED_SIGNATURE: Final = "forged-signature"
    NONCE_REPLAYED: Final = "approval-nonce-replayed"
    DECISION_FAILED: Final = "decision-failed"
    EVENT_TIME_OUT_OF_RANGE: Final = "event-time-out-of-range"
    # An exception met while handling one record, at any stage (the reason names it).
    RECORD_FAILED: Final = "record-failed"
    # A record the controller died on, uncatchably, at several starts in a row
    # (`consumer.quarantine`): dead-lettered without being handled again.
    RECORD_QUARANTINED: Final = "record-quarantined"
    # Skipped by an operator with `recoveryctl offsets skip` (the reason is theirs).
    RECORD_SKIPPED: Final = "record-skipped"
    # A tool report that disagrees with its operation's opening (`machines.opening`).
    OPENING_CONFLICT: Final = OPENING_CONFLICT
    # A signed migration (`machines.migration`) of an operation the ledger does not know.
    MIGRATION_UNKNOWN_OPERATION: Final = "migration-unknown-operation"


# The event times intake accepts: generous for clock skew and replays of old streams,
# far enough from `datetime.max` that every deadline and lease computed from an event
# time (days to years ahead) fits.
EVENT_TIME_WINDOW: Final = (
    datetime(2000, 1, 1, tzinfo=UTC),
    datetime(2200, 1, 1, tzinfo=UTC),
)


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A consumed Kafka record as plain values: nothing here refers to the client."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_ms: int | None = None

    @property
    def coordinates(self) -> str:
        """`topic[partition]@offset`, the way operators name a record."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    @property
    def size(self) -> int:
        """Bytes of key, value and headers together."""
        headers = sum(len(k) + len(v or b"") for k, v in self.headers)
        return len(self.key or b"") + len(self.value or b"") + headers


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a record is dead-lettered; `event_id`/`operation_id` when they were readable."""

    code: str
    reason: str
    event_id: str | None = None
    operation_id: str | None = None
    # A refusal that is a security incident (`machines.OpeningConflict.to_json`): its
    # audit record holds it, and operators list it (`recoveryctl incidents`).
    incident: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Accepted:
    """A record that decoded into an event for a pinned machine that applies to it,
    signed by `producer` (the authenticated roster entry, whose id is the event's
    `producer`). `machine` is the version the event names, or, when that version is not
    pinned (`unpinned`), the version the lock marks current; the batch picks the version
    that decides (module docstring). `event` is already minimized under the audit block
    of every pinned version of its machine (`machines.minimize_event`), and `record`
    holds it in place of the consumed value: nothing after intake sees a redacted
    value."""

    record: RawRecord
    event: Event
    machine: Machine
    producer: ProducerEntry
    unpinned: bool = False


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record refused at intake."""

    record: RawRecord
    refusal: Refusal


# What intake makes of one record.
IntakeResult = Accepted | Rejected


class Intake:
    """Turns raw records into `Accepted` or `Rejected`. `machines` are the pinned ones,
    keyed `name@version` (what `machines.provenance.load_locked_machines` returns, a
    `machines.Pins`; a plain mapping pins one version per name); `roster` the producers
    whose signatures are accepted (the policy's); `clock` the time keys must be valid
    at (the controller's clock, never the record's)."""

    def __init__(
        self,
        machines: Mapping[str, Machine],
        *,
        roster: Roster,
        max_record_bytes: int,
        decoder: WireDecoder | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._roster = roster
        self._clock = clock or _utc_now
        self._pins = machines if isinstance(machines, Pins) else Pins(machines)
        self._max = max_record_bytes
        self._decoder = decoder or WireDecoder(max_bytes=max_record_bytes)

    def examine(self, record: RawRecord) -> IntakeResult:
        """The intake verdict on one record; never raises: an exception met on it is the
        record's refusal (`record-failed`, stage `intake`)."""
        try:
            return self._examine(record)
        except Exception as exc:
            return Rejected(record, failed(record, "intake", exc))

    def _examine(self, record: RawRecord) -> IntakeResult:
        if record.size > self._max:
            return Rejected(
                record,
                Refusal(
                    RefusalCode.OVERSIZED,
                    f"record {record.coordinates} is {record.size} bytes with key and "
                    f"headers; the limit is {self._max}",
                ),
            )
        try:
            schema, data = self._decoder.decode(
                record.value, header_value(record.headers, CONTENT_TYPE)
            )
            if schema != EVENT_ENVELOPE:
                return Rejected(
                    record,
                    Refusal(
                        RefusalCode.SCHEMA_UNEXPECTED,
                        f"record {record.coordinates} holds a {schema}, not an "
                        f"{EVENT_ENVELOPE}; only events belong on the events topic",
                    ),
                )
            event = _record_to_event(data)
        except WireError as exc:
            return Rejected(
                record, Refusal(str(exc.code), f"record {record.coordinates}: {exc.reason}")
            )
        try:
            producer = self._authenticate(record, event)
        except AuthenticationError as exc:
            return Rejected(
                record,
                Refusal(
                    str(exc.code),
                    f"{_where(record, event)}: {exc.reason}",
                    event.event_id,
                    event.operation_id,
                ),
            )
        versions = self._pins.versions(event.machine_name)
        if versions:
            kept = event
            for version in versions:
                kept = minimize_event(version.audit, kept)
            if kept is not event:
                # From here on, dead letters included, the record holds only what the
                # ledger may keep (SPEC §10): its payload redacted and, unless
                # `audit.record` keeps it, referenced (`machines.minimize_event`), under
                # every pinned version of the machine, whichever of them decides.
                record, event = self._kept_record(record, kept), kept
        refusal = self._check_key(record, event) or _check_time(record, event)
        if refusal is None:
            if not versions:
                refusal = self._unknown(record, event)
            else:
                return self._admitted(record, event, producer, versions)
        return Rejected(record, refusal)

    def _admitted(
        self,
        record: RawRecord,
        event: Event,
        producer: ProducerEntry,
        versions: tuple[Machine, ...],
    ) -> IntakeResult:
        """`Accepted` when a pinned version of the event's machine applies to it (the
        named one first), else the named (or current) version's refusal."""
        named = self._pins.get(f"{event.machine_name}@{event.machine_version}")
        machine = named or self._pins.current(event.machine_name) or versions[0]
        refusal = _check_applies(record, event, machine)
        if refusal is not None and len(versions) > 1:
            if any(_check_applies(record, event, v) is None for v in versions):
                refusal = None
        if refusal is not None:
            return Rejected(record, refusal)
        return Accepted(record, event, machine, producer, unpinned=named is None)

    def _kept_record(self, record: RawRecord, kept: Event) -> RawRecord:
        """`record` with `kept` (the minimized event) in place of the consumed value, in
        the same encoding. Its signature headers no longer match: a dead letter of it
        cannot be redriven, and the producer must send it again."""
        codec = self._decoder.codec_for(header_value(record.headers, CONTENT_TYPE))
        data = kept.content() if codec is self._decoder.json else event_to_record(kept)
        return replace(record, value=codec.encode(data, EVENT_ENVELOPE))

    def _authenticate(self, record: RawRecord, event: Event) -> ProducerEntry:
        entry = verify_record(
            self._roster,
            record.topic,
            record.key,
            record.value,
            record.headers,
            at=self._clock(),
        )
        if event.producer != entry.id:
            raise AuthenticationError(
                AuthRefusal.IDENTITY_MISMATCH,
                f"the envelope names producer {event.producer!r} but the record is signed "
                f"by producer {entry.id}; the producer field is always the signer's id",
            )
        return entry

    @staticmethod
    def _check_key(record: RawRecord, event: Event) -> Refusal | None:
        key = None
        if record.key is not None:
            try:
                key = record.key.decode("utf-8")
            except UnicodeDecodeError:
                key = None
        if key == event.operation_id:
            return None
        return Refusal(
            RefusalCode.KEY_MISMATCH,
            f"record {record.coordinates}: event {event.event_id} is for operation "
            f"{event.operation_id} but its key is {record.key!r}; key events by operation id",
            event.event_id,
            event.operation_id,
        )

    def _unknown(self, record: RawRecord, event: Event) -> Refusal:
        pinned = ", ".join(sorted(self._pins)) or "none"
        return Refusal(
            RefusalCode.MACHINE_UNKNOWN,
            f"{_where(record, event)} names machine "
            f"{event.machine_name}@{event.machine_version}, which is not pinned (pinned: "
            f"{pinned}); pin and sign it, or send events for a pinned machine",
            event.event_id,
            event.operation_id,
        )


def unpinned_refusal(record: RawRecord, event: Event, pins: Pins) -> Refusal:
    """The refusal of `event`, which names a version of its machine the lock does not
    pin, where that version would have to decide (it opens an operation, or names a
    migration's target): `machine-unpinned`."""
    ref = f"{event.machine_name}@{event.machine_version}"
    pinned = ", ".join(pins.refs(event.machine_name)) or "none"
    return Refusal(
        RefusalCode.MACHINE_UNPINNED,
        f"{_where(record, event)} names machine {ref}, which is not pinned (pinned: "
        f"{pinned}); pin and sign it, or send events for a pinned version",
        event.event_id,
        event.operation_id,
    )


def _check_applies(record: RawRecord, event: Event, machine: Machine) -> Refusal | None:
    # Messages (and their `where` prefix) are built only for a refusal: most records
    # are accepted, and the formatting cost as much as the check.
    ref = f"{machine.name}@{machine.version}"
    agents = machine.applies_to.agents
    if agents and event.lineage.agent not in agents:
        return Refusal(
            RefusalCode.MACHINE_NOT_APPLICABLE,
            f"{_where(record, event)}: machine {ref} applies to agents "
            f"{', '.join(agents)}, not {event.lineage.agent}",
            event.event_id,
            event.operation_id,
        )
    scope = event.scope
    if scope is None:
        return None
    operation = OperationScope(
        capability=scope.capability,
        tool=scope.tool,
        agent=event.lineage.agent,
        environment=scope.environment,
    )
    if applies(machine.applies_to, operation):
        return None
    allowed = machine.applies_to
    return Refusal(
        RefusalCode.MACHINE_NOT_APPLICABLE,
        f"{_where(record, event)}: machine {ref} does not apply to capability "
        f"{scope.capability}, tool {scope.tool}, environment {scope.environment} (it "
        f"applies to capabilities {_listed(allowed.capabilities)}, tools "
        f"{_listed(allowed.tools)}, environments {_listed(allowed.environments)}); send "
        "the event for the machine that governs this operation, or correct the scope",
        event.event_id,
        event.operation_id,
    )


def _utc_now() -> datetime:
    return datetime.now(UTC)


def failed(
    record: RawRecord, stage: str, exc: BaseException, event: Event | None = None
) -> Refusal:
    """The refusal of a record whose handling raised `exc` at `stage` (a bug met by this
    record: dead-lettered with the exception so it can be reported, never retried)."""
    log.error("record %s failed at %s", record.coordinates, stage, exc_info=exc)
    what = "" if event is None else f" (event {event.event_id}, operation {event.operation_id})"
    return Refusal(
        RefusalCode.RECORD_FAILED,
        f"record {record.coordinates}{what}: {stage} failed: {type(exc).__name__}: "
        f"{str(exc)[:500]}; the record is dead-lettered, report it with this record",
        None if event is None else event.event_id,
        None if event is None else event.operation_id,
    )


def _check_time(record: RawRecord, event: Event) -> Refusal | None:
    low, high = EVENT_TIME_WINDOW
    if low <= event.event_time < high:
        return None
    return Refusal(
        RefusalCode.EVENT_TIME_OUT_OF_RANGE,
        f"{_where(record, event)} has event_time {event.event_time.isoformat()}, outside "
        f"{low.date()} .. {high.date()}; send the time the event happened, in UTC",
        event.event_id,
        event.operation_id,
    )


def _where(record: RawRecord, event: Event) -> str:
    return f"record {record.coordinates}: event {event.event_id} (operation {event.operation_id})"


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(values) if values else "any"
