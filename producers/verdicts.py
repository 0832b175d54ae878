"""The controller's verdict on an event a client published: decided, or dead-lettered
and why, read from the audit topic within a bound.

The broker's acknowledgement says only that a record was written. Whether the controller
decided it is another matter: a record signed with a key the roster does not list is
dead-lettered (`key-unknown`), one for an unpinned machine too, and without a running
controller nothing is decided at all. Every verdict is on `recovery.audit`, signed with
the controller's key (docs/audit-ocsf.md): a `decision` record names the event
(`api.request.uid`) on its operation's chain, an `event-conflict` record the event id
reused with another payload, and a `dead-letter` record the coordinates of the consumed
record with the reason code (`unmapped.recovery.record`).

`VerdictReader` reads the audit topic from a given time, in a consumer group of its own
that never commits (`recovery-verdicts-<random>`: the `tool` and `worker` principals may
read the audit topic in groups `recovery-verdicts*`), believes only records signed by a
roster `controller` key (`schemas.verify_record`), and answers `wait` for one event:
by operation and event id, or by the record's coordinates for a dead letter of bytes that
held no event. Verdicts it read before they were asked for are kept (bounded), so the
results of a worker's commands can be awaited after they were decided.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from confluent_kafka import OFFSET_END, Consumer, KafkaException, Message, TopicPartition

from machines import AuthenticationError, Role, Roster
from producers.errors import ProducersError
from schemas import KafkaSecurity, TopicNames, kafka_config, librdkafka_logger, ocsf_kind
from schemas import verify_record as verify_signed_record

__all__ = ["VERDICT_GROUP_PREFIX", "EventVerdict", "VerdictReader", "VerdictTimeout"]

# The consumer groups verdict readers use; the tool and worker principals may read the
# audit topic in them (producers.acls).
VERDICT_GROUP_PREFIX: Final = "recovery-verdicts"
# Verdicts read but not asked for yet, remembered for a later `wait` (FIFO beyond it).
_REMEMBERED: Final = 10_000
# How far before `since` reading starts: clocks of tools and brokers differ.
_CLOCK_SKEW: Final = timedelta(seconds=60)
_POLL_SECONDS: Final = 0.2
_METADATA_SECONDS: Final = 10.0

Coordinates = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class EventVerdict:
    """What the controller made of one event: `decided` (a decision was recorded, with
    its `outcome`: transitioned, rejected, refused, final) or not (dead-lettered, its
    `outcome` the reason code: `key-unknown`, `event-id-conflict`, ...), and why."""

    event_id: str
    operation_id: str | None
    decided: bool
    outcome: str
    event_type: str | None = None
    state_before: str | None = None
    state_after: str | None = None
    reason: str = ""

    @property
    def moved(self) -> bool:
        """Whether the decision moved the operation to another state."""
        return self.decided and self.outcome == "transitioned"

    def describe(self) -> str:
        """One line for a person: `decided: transitioned, a -> b` or `dead-lettered:
        key-unknown: producer t has no key ...`."""
        if not self.decided:
            return f"dead-lettered: {self.outcome}: {self.reason}"
        text = f"decided: {self.outcome}, {self.state_before} -> {self.state_after}"
        return f"{text} ({self.reason})" if self.reason else text


class VerdictTimeout(ProducersError):
    """No verdict on an event arrived on the audit topic within the bound."""


class VerdictReader:
    """Reads the controller's verdicts from the audit topic (module docstring); use as a
    context manager or call `close`."""

    def __init__(
        self,
        bootstrap: str,
        roster: Roster,
        *,
        since: datetime,
        topics: TopicNames | None = None,
        security: KafkaSecurity | None = None,
    ) -> None:
        if next(iter(roster.with_role(Role.CONTROLLER)), None) is None:
            raise ProducersError(
                "the roster names no controller, so no verdict could be believed: list the "
                "controller's public key with role controller (the stack's roster does)"
            )
        self.roster = roster
        self.topics = topics or TopicNames.from_env()
        self.read = 0
        self.unverified = 0
        self._known: OrderedDict[tuple[Any, ...], EventVerdict] = OrderedDict()
        self._consumer = Consumer(
            {
                **kafka_config(bootstrap, security),
                "group.id": f"{VERDICT_GROUP_PREFIX}-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "logger": librdkafka_logger("verdicts"),
            }
        )
        try:
            self._consumer.assign(self._positions(since - _CLOCK_SKEW))
        except BaseException:
            self._consumer.close()
            raise

    def _positions(self, start: datetime) -> list[TopicPartition]:
        topic = self.topics.audit
        try:
            metadata = self._consumer.list_topics(topic, timeout=_METADATA_SECONDS)
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                why = "it does not exist" if found is None else str(found.error or "no partitions")
                raise ProducersError(f"cannot read verdicts from {topic}: {why}")
            wanted = [
                TopicPartition(topic, p, int(start.timestamp() * 1000)) for p in found.partitions
            ]
            positions = self._consumer.offsets_for_times(wanted, timeout=_METADATA_SECONDS)
        except KafkaException as exc:
            raise ProducersError(f"cannot read verdicts from {topic}: {exc}") from exc
        # A partition with nothing at or after `start` starts at its end.
        return [
            TopicPartition(topic, p.partition, p.offset if p.offset >= 0 else OFFSET_END)
            for p in positions
        ]

    def wait(
        self,
        operation_id: str,
        event_id: str,
        *,
        coordinates: Coordinates | None = None,
        timeout: float = 30.0,
    ) -> EventVerdict:
        """The verdict on event `event_id` of `operation_id` (or on the record consumed at
        `coordinates`, for a dead letter whose bytes named no event), reading for at most
        `timeout` seconds. Raises `VerdictTimeout` saying what to check."""
        keys: list[tuple[Any, ...]] = [("event", operation_id, event_id)]
        if coordinates is not None:
            keys.append(("at", *coordinates))
        deadline = time.monotonic() + timeout
        while True:
            for key in keys:
                if key in self._known:
                    return self._known[key]
            left = deadline - time.monotonic()
            if left <= 0:
                break
            message = self._consumer.poll(min(_POLL_SECONDS, left))
            if message is not None and message.error() is None:
                self._take(message)
        unverified = (
            f", {self.unverified} of them not signed by a roster controller (ignored)"
            if self.unverified
            else ""
        )
        raise VerdictTimeout(
            f"no verdict on event {event_id} of operation {operation_id} within "
            f"{timeout:.0f} s ({self.read} record(s) of {self.topics.audit} read{unverified}): "
            f"is a controller running on {self.topics.events}, with its relay "
            "(`recoveryctl run`)? `recoveryctl offsets show` says whether it is behind"
        )

    def _take(self, message: Message[Any, Any]) -> None:
        self.read += 1
        topic, key, value = message.topic(), message.key(), message.value()
        found_headers = message.headers()
        pairs = list(found_headers.items()) if isinstance(found_headers, dict) else found_headers
        headers = [(str(k), v.encode("utf-8") if isinstance(v, str) else v) for k, v in pairs or ()]
        value = value if isinstance(value, bytes) else None
        # A key is judged at the time the record was written, not now (rotation).
        kind, stamp = message.timestamp()
        written = datetime.fromtimestamp(stamp / 1000, UTC) if kind and stamp > 0 else None
        try:
            entry = verify_signed_record(
                self.roster,
                str(topic),
                key if isinstance(key, bytes) else None,
                value,
                headers,
                at=written or datetime.now(UTC),
            )
            event = json.loads(value or b"") if Role.CONTROLLER in entry.roles() else None
        except (AuthenticationError, ValueError):
            event = None
        if not isinstance(event, dict):  # not the controller's word: believe none of it
            self.unverified += 1
            return
        for found_key, verdict in _verdicts(event):
            self._known[found_key] = verdict
            self._known.move_to_end(found_key)
        while len(self._known) > _REMEMBERED:
            self._known.popitem(last=False)

    def close(self) -> None:
        """Leave the (never committed) group."""
        self._consumer.close()

    def __enter__(self) -> VerdictReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _verdicts(event: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], EventVerdict]]:
    """The verdicts one audit event states, under the keys a `wait` looks them up by."""
    kind = ocsf_kind(event)
    recovery = event.get("unmapped", {}).get("recovery", {})
    chain = recovery.get("chain") or {}
    body = recovery.get("record") or {}
    operation_id = chain.get("operation_id")
    event_id = str(event.get("api", {}).get("request", {}).get("uid", ""))
    if kind == "decision":
        refusals = "; ".join(
            f"{r.get('code')}: {r.get('message')}" for r in body.get("refusals") or ()
        )
        verdict = EventVerdict(
            event_id,
            operation_id,
            True,
            str(body.get("outcome") or event.get("status_code")),
            event.get("api", {}).get("operation"),
            body.get("state_before"),
            body.get("state_after"),
            refusals,
        )
        return [(("event", operation_id, event_id), verdict)]
    if kind == "event-conflict":
        verdict = EventVerdict(
            event_id,
            operation_id,
            False,
            "event-id-conflict",
            reason=f"event id {event_id} was decided before with another payload; resend "
            "the same event, or send a new one with a new id",
        )
        return [(("event", operation_id, event_id), verdict)]
    if kind == "dead-letter":
        source = body.get("source") or {}
        refused = EventVerdict(
            str(body.get("event_id") or ""),
            body.get("operation_id"),
            False,
            str(body.get("reason_code") or event.get("status_code")),
            reason=str(body.get("reason") or ""),
        )
        at = ("at", source.get("topic"), source.get("partition"), source.get("offset"))
        found: list[tuple[tuple[Any, ...], EventVerdict]] = [(at, refused)]
        if refused.event_id and refused.operation_id:
            found.append((("event", refused.operation_id, refused.event_id), refused))
        return found
    return []
