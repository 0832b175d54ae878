"""Building consumed records and events for the controller's unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache
from typing import Any

from consumer import ControllerSettings, DecidedBatch, Intake, RawRecord, decide_batch, load_rules
from consumer.batch import claim_keys, openings, operation_ids, positions_for
from ledger import Ledger
from machines import Event, EvidencePayload, Lineage, Machine, Policy, Rules, matching_scope
from schemas import (
    CONTENT_TYPE,
    CONTENT_TYPE_AVRO,
    EVENT_ENVELOPE,
    AvroSingleObjectCodec,
    event_to_record,
)
from tests.support.producers import roster, signer, with_roster

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TOPIC = "recovery.events"
GROUP = "group-1"
CONTROLLER = "controller-1"
FOUND = EvidencePayload(outcome="applied", verifier="verifier-1", reference="v-1")


@cache
def pinned() -> tuple[dict[str, Machine], Rules]:
    """The catalogue's pinned machines and rules trusting `verifier-1`."""
    machines, rules = load_rules(
        ControllerSettings(bootstrap="unused", database_url="unused", demo_mode=True)
    )
    policy = with_roster(Policy(id="unit", trusted_verifiers=("verifier-1",)))
    return machines, Rules(policy=policy, registry=rules.registry)


def event(
    event_type: str,
    operation: str = "op-1",
    *,
    event_id: str | None = None,
    machine: str = "email-send",
    version: str = "1.0.0",
    agent: str = "agent-1",
    **fields: Any,
) -> Event:
    """A valid event of `machine` for `operation`, with a scope its `applies_to` admits
    (an operation opens only with one) unless `scope` is given, from `tool-1` unless
    `producer` is given (or the evidence names a verifier or the decision an approver:
    they are its signer)."""
    if "scope" not in fields:
        known = pinned()[0].get(f"{machine}@{version}")
        fields["scope"] = None if known is None else matching_scope(known.applies_to)
    evidence = fields.get("evidence")
    decision = fields.get("human_decision")
    default = "tool-1"
    if evidence is not None and evidence.verifier is not None:
        default = evidence.verifier
    elif decision is not None:
        default = decision.approver
    fields.setdefault("producer", default)
    return Event(
        event_type=event_type,
        event_id=event_id or f"{operation}-{event_type.lower()}",
        operation_id=operation,
        correlation_id=fields.pop("correlation_id", f"corr-{operation}"),
        machine_name=machine,
        machine_version=version,
        event_time=T0,
        evidence_ref="ref-1",
        lineage=Lineage(agent=agent, task="task-1", initiating_principal="alice"),
        **fields,
    )


def record(
    value: bytes | None,
    offset: int,
    *,
    key: bytes | None = b"op-1",
    partition: int = 0,
    headers: tuple[tuple[str, bytes | None], ...] | None = None,
    producer: str | None = "tool-1",
) -> RawRecord:
    """A consumed record at `offset`, signed by test producer `producer` (None: unsigned)."""
    raw = RawRecord(
        topic=TOPIC,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=headers
        if headers is not None
        else ((CONTENT_TYPE, CONTENT_TYPE_AVRO.encode("utf-8")),),
        timestamp_ms=1_700_000_000_000,
    )
    return raw if producer is None else signed(raw, producer)


def signed(raw: RawRecord, producer: str) -> RawRecord:
    """`raw` with its headers signed by test producer `producer`."""
    headers = signer(producer).sign(raw.topic, raw.key, raw.value, raw.headers)
    return replace(raw, headers=tuple(headers))


def encoded(
    ev: Event, offset: int, *, partition: int = 0, producer: str | None = None
) -> RawRecord:
    """`ev` as the client library writes it (Avro single-object), keyed by operation and
    signed by its producer's test key (or `producer`'s)."""
    value = AvroSingleObjectCodec().encode(event_to_record(ev), EVENT_ENVELOPE)
    key = ev.operation_id.encode("utf-8")
    return record(value, offset, key=key, partition=partition, producer=producer or ev.producer)


def decide(
    ledger: Ledger,
    raws: Sequence[RawRecord],
    *,
    now: datetime,
    partitions: Sequence[int] = (0,),
    intake: Intake | None = None,
    rules: Rules | None = None,
    lineage: bool = False,
    owners: bool = False,
    **kwargs: Any,
) -> DecidedBatch:
    """Decide `raws` as the controller does, at `now`: claim `partitions` of TOPIC for
    CONTROLLER, examine each record with `intake` (the pinned machines and the test
    roster unless given) and decide on the views `ledger` stores with `rules` (the pinned
    ones unless given). As the controller reads them: `lineage`, the arrival lineage of
    the operations the batch opens; `owners`, the stored owners of the claim keys they
    declare. `kwargs` go to `decide_batch` as they are."""
    machines, pinned_rules = pinned()
    claimed = ledger.claim(GROUP, TOPIC, list(partitions), CONTROLLER)
    epochs = {(c.topic, c.partition): c.epoch for c in claimed}
    intake = intake or Intake(machines, roster=roster(), max_record_bytes=65536)
    outcomes = [intake.examine(r) for r in raws]
    views = ledger.load_views(operation_ids(outcomes))
    return decide_batch(
        outcomes,
        views,
        rules or pinned_rules,
        group=GROUP,
        controller=CONTROLLER,
        positions=positions_for(raws, epochs),
        now=now,
        arrivals=ledger.arrival_lineage(openings(outcomes, views)) if lineage else None,
        claims=ledger.key_claims(claim_keys(outcomes, views)) if owners else None,
        **kwargs,
    )
