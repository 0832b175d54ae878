"""The controller: a Kafka consumer group around the pure decision core (SPEC §8).

One loop, one thread: `consume` up to N records or T milliseconds, turn them into plain
values, plan the batch (`consumer.batch`), commit it in one ledger transaction with the
next offsets, repeat. PostgreSQL holds the authoritative offsets, written in the same
transaction as the decisions they caused, so an offset is never ahead of durable state
and a crash at any point replays exactly the batches that did not commit. After each
ledger commit the same offsets are also committed to Kafka, asynchronously and only as
advice, so Kafka's tools (`kafka-consumer-groups --describe`) show the group's lag; the
controller never reads them back (`on_assign` starts from the ledger's offsets), and a
failed advisory commit is logged at DEBUG and counted, never fatal.

Assignment uses the cooperative-sticky protocol: a rebalance moves only the partitions
that change owner, so the other partitions' batches keep flowing while a member joins or
leaves (eager assignment would stop the whole group on every change). `on_assign`
claims the new partitions in the ledger (a new epoch fences any previous owner's
in-flight batch) and assigns them at the stored next offsets. Rebalance callbacks run
only inside `consume`/`close`, never while a batch is being planned or committed, so a
revocation always finds the previous batch committed or abandoned; an abandoned batch's
transaction never committed, and the stored offsets make the next owner replay it.

Timers (`machines.timers`, `ledger.timers`): between batches, every `timer_poll_ms` (at
once again while the last slice came back full), the member fires up to `timer_slice`
timers due on the partitions it owns, by its own clock, in a ledger transaction fenced
by the same epochs as its batches; their events come back through `recovery.events` and
are decided in order with everything else. A backlog of due timers drains slice by
slice, a batch of live events between each two, and never runs ahead of deciding: while
a slice's worth of the timer events it fired are not decided yet, the member fires no
more (so at most about two slices wait in the topic, behind whatever live events came
first). Every `timer_gauges_s` it reads the waiting and overdue gauges of its
partitions.

Failures: a `VersionConflict` replans the batch on reloaded views; a conflicting id the
ledger names is dead-lettered and the batch replanned without it; `FencedError` drops the
batch and pauses the partitions (another member owns them now); an unreachable database
or any other ledger failure rewinds the batch's partitions to its first offsets and
backs off with full jitter before consuming again, so nothing is ever half-applied.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
)
from confluent_kafka import TopicPartition as KafkaPartition

from consumer.batch import (
    DecidedBatch,
    claim_keys,
    decide_batch,
    decide_on_openers,
    openings,
    operation_ids,
    positions_for,
    unbuildable,
)
from consumer.errors import ControllerError
from consumer.heap import settle_heap
from consumer.intake import Intake, IntakeResult, RawRecord, Refusal, RefusalCode, Rejected
from consumer.metrics import ControllerMetrics
from consumer.quarantine import Watch, quarantine_refusal, watch_after_claim
from consumer.reload import (
    RULES_CHANGE_REFUSED,
    RULES_CHANGED,
    RULES_LOADED,
    RulesWatch,
    change_record,
    rules_chain_id,
    rules_digests,
)
from consumer.settings import ControllerSettings
from consumer.signing import controller_signer
from consumer.telemetry import Telemetry
from consumer.tracing import BatchTracer
from ledger import (
    Batch,
    DeadLetter,
    EventIdReused,
    FencedError,
    Ledger,
    LedgerError,
    NonceReused,
    PartitionAttempt,
    Position,
    RetryableConflict,
)
from machines import (
    ClaimKey,
    Decision,
    Grant,
    Machine,
    Outcome,
    Pins,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    Rules,
    is_timer_event,
    public_key_text,
)
from schemas import OutboxSigner, RecordSigner, kafka_config, librdkafka_logger

__all__ = ["Controller", "consumer_config"]

log = logging.getLogger("consumer")

TopicPartition = tuple[str, int]

# A batch is replanned at most this many times beyond one per record (each conflicting
# id the ledger names removes one record); past that the database is misbehaving and
# the batch is rewound and retried after a backoff.
_EXTRA_REPLANS: Final = 5
_LAG_INTERVAL: Final = 1.0
# librdkafka's `auto.commit.interval.ms` for the advisory offset commits.
ADVISORY_COMMIT_INTERVAL_MS: Final = 1000
# How long `_fire_timers` waits for a slice's timer events to be decided before it fires
# again anyway (they may have been decided by another member, or disarmed).
_IN_FLIGHT_PATIENCE: Final = 30.0


def consumer_config(settings: ControllerSettings) -> dict[str, Any]:
    """The librdkafka configuration of the controller's consumer. Settings in
    `consumer_config` apply first; the safety settings below always win."""
    classic = settings.group_protocol == "classic"
    config: dict[str, Any] = {
        **kafka_config(settings.bootstrap, settings.kafka_security),
        "group.id": settings.group_id,
        "client.id": settings.instance_id,
        "auto.offset.reset": settings.auto_offset_reset,
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "queued.max.messages.kbytes": settings.max_queued_kbytes,
        "isolation.level": "read_committed",
        # How often librdkafka commits the offsets `Controller._advise` stored (advice
        # only, below); `consumer_config` may change it.
        "auto.commit.interval.ms": ADVISORY_COMMIT_INTERVAL_MS,
        # librdkafka's lines become records of logger librdkafka.controller, not stderr.
        "logger": librdkafka_logger("controller"),
    }
    if classic:  # KIP-848 keeps the session timeout on the broker
        config["session.timeout.ms"] = settings.session_timeout_ms
        # Sent from librdkafka's own thread, not the loop: a long batch holding the GIL
        # does not delay it (max.poll.interval.ms bounds the loop instead).
        config["heartbeat.interval.ms"] = settings.heartbeat_ms
    else:
        config["group.protocol"] = "consumer"
    if settings.group_instance_id is not None:
        config["group.instance.id"] = settings.group_instance_id
    config.update(settings.consumer_config)
    config.update(
        {
            # The ledger's offsets are authoritative, written with the decisions they
            # caused; Kafka gets them afterwards, as advice (`Controller._advise`): only
            # offsets the controller stored after its ledger commit are ever committed.
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
        }
    )
    if classic:
        # KIP-848's protocol is incremental by design, its assignor on the broker.
        config["partition.assignment.strategy"] = "cooperative-sticky"
    return config


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _headers(message: Message[Any, Any]) -> list[tuple[str, str | bytes | None]]:
    found = message.headers()
    if isinstance(found, dict):
        return list(found.items())
    return list(found) if found else []


def _raw(message: Message[Any, Any]) -> RawRecord:
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None
    assert partition is not None
    assert offset is not None
    key, value = message.key(), message.value()
    headers = tuple(
        (str(k), v.encode("utf-8") if isinstance(v, str) else v) for k, v in _headers(message)
    )
    kind, stamp = message.timestamp()
    return RawRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key if isinstance(key, bytes) else None,
        value=value if isinstance(value, bytes) else None,
        headers=headers,
        timestamp_ms=stamp if kind != 0 else None,
    )


class _Backoff:
    """Exponential backoff with full jitter, interruptible by the stop event."""

    def __init__(self, initial_ms: int, max_ms: int) -> None:
        self._initial = initial_ms / 1000
        self._max = max_ms / 1000
        self._next = self._initial

    def reset(self) -> None:
        self._next = self._initial

    def wait(self, stop: threading.Event) -> None:
        delay = random.uniform(0, self._next)  # jitter, not security
        self._next = min(self._next * 2, self._max)
        stop.wait(delay)


def with_own_key(roster: Roster, signer: RecordSigner) -> Roster:
    """`roster` with the controller itself (its signing key, role `controller`) when the
    roster does not list its id: the cascade events it emits on `recovery.events` come
    back through intake, signed with that key. A roster that lists the id is taken as
    it is (its keys, rotation and revocation are the operator's)."""
    if roster.producer(signer.producer) is not None:
        return roster
    own = ProducerEntry(
        id=signer.producer,
        keys=(ProducerKey(public_key=public_key_text(signer.private_key.public_key())),),
        grants=(Grant(role=Role.CONTROLLER),),
    )
    return Roster(producers=(*roster.producers, own))


def roster_gap(roster: Roster, controller: str) -> str | None:
    """What is missing from a roster for the controller to decide anything, or None:
    no producer but the controller itself (every event is dead-lettered
    `producer-unknown`), or no producer that may open an operation (role `tool`)."""
    others = [p for p in roster.producers if p.id != controller]
    if not others:
        return (
            "THE ROSTER ADMITS NOBODY: it lists no producer but the controller, so every "
            "event will be dead-lettered as producer-unknown"
        )
    if not any(g.role == Role.TOOL for p in others for g in p.grants):
        listed = ", ".join(sorted(p.id for p in others)[:10])
        return (
            f"NO PRODUCER MAY OPEN AN OPERATION: the roster lists {listed} but none holds "
            "role tool, so every opening event will be dead-lettered as role-not-permitted"
        )
    return None


class Controller:
    """One member of the controller group. `run(stop)` consumes until `stop` is set, then
    leaves the group cleanly; the ledger and telemetry passed in stay open (the caller
    owns them)."""

    def __init__(
        self,
        settings: ControllerSettings,
        ledger: Ledger,
        *,
        machines: Mapping[str, Machine],
        rules: Rules,
        telemetry: Telemetry | None = None,
        clock: Callable[[], datetime] = _utcnow,
        signer: OutboxSigner | None = None,
        reload: Callable[[], tuple[Pins, Rules]] | None = None,
        watch: RulesWatch | None = None,
    ) -> None:
        self.settings = settings
        # Fail closed: no key, no controller (`consumer.signing`).
        self.signer = signer or controller_signer(settings)
        self.ledger = ledger
        self._clock = clock
        self._use_rules(machines if isinstance(machines, Pins) else Pins(machines), rules)
        # Reloading the rules without a restart (`consumer.reload`): how to load them
        # again, and when to.
        self._reload = reload
        self._rules_watch = watch
        self.rules_changes = 0
        telemetry = telemetry or Telemetry.disabled()
        self._tracer = BatchTracer(
            telemetry.tracer_provider, group=settings.group_id, client=settings.instance_id
        )
        self.metrics = ControllerMetrics(telemetry.meter_provider, settings.group_id)
        self._topics = settings.topics
        self._backoff = _Backoff(settings.backoff_initial_ms, settings.backoff_max_ms)
        # Owned partitions: their epoch and the next offset the ledger stores for them.
        self._epochs: dict[TopicPartition, int] = {}
        self._next: dict[TopicPartition, int] = {}
        # Claimed partitions whose attempt this start has not recorded yet, or that are
        # decided one record at a time (crash quarantine, `consumer.quarantine`).
        self._watch: dict[TopicPartition, Watch] = {}
        # Assigned by Kafka but not yet claimed in the ledger (it was unreachable).
        self._pending: set[TopicPartition] = set()
        # When each newly claimed partition was claimed, until its first commit (logged:
        # the controller's share of a failover, docs/controller.md "Failover").
        self._claimed_at: dict[TopicPartition, float] = {}
        self._pending_at = 0.0
        self._lag_at = 0.0
        # When to look for due timers next, and to read the timer gauges (monotonic).
        self._timers_at = 0.0
        self._gauges_at = 0.0
        # Timer events this member fired that none of its batches has decided yet, and
        # when that last changed (monotonic): `_fire_timers` holds off while a slice is
        # in flight.
        self._in_flight = 0
        self._in_flight_at = 0.0
        self._stop = threading.Event()
        # When the loop last turned (monotonic), for the liveness probe.
        self.last_step = time.monotonic()
        self.committed_batches = 0
        # Advisory offset commits to Kafka that the broker refused (never fatal).
        self.advisory_commit_failures = 0

    def _use_rules(self, pins: Pins, rules: Rules) -> None:
        """Decide from now on under `pins` and `rules` (at start, and on a reload)."""
        self.rules = rules
        self.pins = pins
        self._intake = Intake(
            pins,
            roster=with_own_key(rules.policy.roster, self.signer.signer),
            max_record_bytes=self.settings.max_record_bytes,
            clock=self._clock,
        )
        empty = roster_gap(rules.policy.roster, self.signer.producer)
        if empty is not None:
            # Loud, at start and on a reload: otherwise the first sign is a dead-letter
            # topic filling up.
            log.error(
                "controller %s: %s (policy %s from %s, roster file %s); add them to the "
                'roster (`recoveryctl roster add`, docs/operations.md "Producer roster") '
                "and reload",
                self.settings.instance_id,
                empty,
                rules.policy.id,
                self.settings.policy_path or "<built-in>",
                self.settings.roster_path or "none",
            )

    # -- reloading the rules ---------------------------------------------------------

    def _maybe_reload(self) -> None:
        """Reload the rules when asked or when their files changed (`consumer.reload`),
        between batches; keep the old ones when the new ones do not load."""
        if self._rules_watch is None or self._reload is None:
            return
        trigger = self._rules_watch.due()
        if trigger is None:
            return
        old = rules_digests(self.pins, self.rules)
        try:
            pins, rules = self._reload()
        except Exception as exc:
            log.error(
                "controller %s keeps its rules (policy %s): the changed rules do not load (%s): %s",
                self.settings.instance_id,
                self.rules.policy.digest,
                trigger,
                exc,
            )
            self._record_change(RULES_CHANGE_REFUSED, trigger, old, None, str(exc), (self.rules,))
            return
        new = rules_digests(pins, rules)
        if new == old:
            log.info("rules reloaded (%s): unchanged, policy %s", trigger, old["policy"]["digest"])
            return
        before = self.rules
        self._use_rules(pins, rules)
        self.rules_changes += 1
        log.warning(
            "controller %s reloaded its rules (%s): policy %s -> %s, lock %s -> %s",
            self.settings.instance_id,
            trigger,
            old["policy"]["digest"],
            new["policy"]["digest"],
            old["lock_digest"],
            new["lock_digest"],
        )
        dropped = sorted(set(old["machines"]) - set(new["machines"]))
        if dropped:
            # Not refused: the operator may have migrated every operation. If one is
            # still on such a version, its events are dead-lettered machine-unpinned.
            log.warning(
                "controller %s no longer pins %s: an operation still in flight on it is "
                "stranded (`recoveryctl machines rollout` shows any; pin it again, or "
                "migrate them with `recoveryctl ops migrate`)",
                self.settings.instance_id,
                ", ".join(dropped),
            )
        self._record_change(RULES_CHANGED, trigger, old, new, None, (before, rules))

    def _record_change(
        self,
        kind: str,
        trigger: str,
        old: Mapping[str, Any],
        new: Mapping[str, Any] | None,
        error: str | None,
        rules: Sequence[Rules],
    ) -> None:
        """Append the change's audit record to the group's rules chain, signed and for
        `recovery.audit`, in a transaction of its own. A ledger outage loses the record,
        not the reload: the log line says what changed either way."""
        group = self.settings.group_id
        chain = rules_chain_id(group)
        at = self._clock()
        body = change_record(
            kind,
            controller=self.settings.instance_id,
            group=group,
            trigger=trigger,
            old=old,
            new=new,
            error=error,
            at=at.isoformat(),
            policies=[r.policy for r in rules],
        )
        letter = DeadLetter(
            record_id=f"{chain}:{self.settings.instance_id}:{at.isoformat()}",
            chain_id=chain,
            key=chain,
            reason_code=kind,
            payload={},
            headers={},
            audit=body,
            kind=kind,
            publish=False,
        )
        batch = Batch(
            group=group,
            positions=(),
            views={},
            dead_letters=(letter,),
            topics=self._topics,
            sign=self.signer,
        )
        try:
            self.ledger.commit(batch)
        except LedgerError as exc:
            log.error("the %s audit record was not written: %s", kind, exc)

    # -- the loop -------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume, decide and commit until `stop` is set; then close the consumer, which
        leaves the group (its partitions move to the other members at once)."""
        self._stop = stop
        if self._reload is not None:
            # What this member decides under from now on, in the audit stream.
            loaded = rules_digests(self.pins, self.rules)
            self._record_change(RULES_LOADED, "start", {}, loaded, None, (self.rules,))
        consumer = Consumer({**consumer_config(self.settings), "on_commit": self._advised})
        settle_heap("controller")
        topic = self.settings.topics.events
        log.info(
            "controller %s joining group %s on %s",
            self.settings.instance_id,
            self.settings.group_id,
            topic,
        )
        try:
            consumer.subscribe(
                [topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
            while not stop.is_set():
                self._step(consumer)
        finally:
            consumer.close()
            librdkafka_logger("controller").flush()  # the lines held back, summarised
            self._epochs.clear()
            log.info(
                "controller %s left group %s", self.settings.instance_id, self.settings.group_id
            )

    def _step(self, consumer: Consumer) -> None:
        self.last_step = time.monotonic()
        self._maybe_reload()
        if self._pending and time.monotonic() >= self._pending_at:
            self._claim_pending(consumer)
        # Wait for the first record only, then take what has already arrived: one
        # `consume(batch_max_records, wait)` holds every record until the batch is full
        # or the wait is over, which at a few hundred events per second is the whole
        # wait (200 ms) on every event. Under load the prefetched queue fills the batch.
        messages = consumer.consume(num_messages=1, timeout=self.settings.batch_max_wait_ms / 1000)
        if messages and self.settings.batch_max_records > 1:
            messages.extend(
                consumer.consume(num_messages=self.settings.batch_max_records - 1, timeout=0)
            )
        records = self._records(messages)
        if records:
            self._process(consumer, records)
        if time.monotonic() >= self._timers_at:
            self._fire_timers(consumer)
        if time.monotonic() >= self._gauges_at:
            self._read_timer_gauges()
        if time.monotonic() >= self._lag_at:
            self._lag_at = time.monotonic() + _LAG_INTERVAL
            self._update_lag(consumer)

    def _records(self, messages: Sequence[Message[Any, Any]]) -> list[RawRecord]:
        records: list[RawRecord] = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._broker_error(error)
                continue
            record = _raw(message)
            tp = (record.topic, record.partition)
            # Records of partitions not (or no longer) claimed, or below the stored
            # offset (prefetched before a rewind), are not ours to decide.
            if tp in self._epochs and record.offset >= self._next.get(tp, 0):
                records.append(record)
        return records

    def _broker_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise ControllerError(f"the Kafka consumer failed fatally: {error}; restart it")
        if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
            # The broker would refuse every join: never a member, never a partition.
            raise ControllerError(
                f"the broker refuses session_timeout_ms={self.settings.session_timeout_ms} "
                f"({error}): lower the broker's group.min.session.timeout.ms (fast failover, "
                "docs/controller.md) or raise RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS"
            )
        if error.code() != KafkaError._PARTITION_EOF:
            # librdkafka retries transient broker errors itself; say so and go on.
            log.warning("Kafka consumer error (retrying): %s", error)

    # -- one batch --------------------------------------------------------------------

    def _process(self, consumer: Consumer, records: list[RawRecord]) -> None:
        if self._watch:
            self._process_watched(consumer, records)
        else:
            self._commit_batch(consumer, records)

    def _process_watched(self, consumer: Consumer, records: list[RawRecord]) -> None:
        """Crash quarantine (`consumer.quarantine`): record this start's attempt on each
        newly claimed partition before its first batch, and decide the partitions under
        suspicion one record at a time."""
        by_tp: dict[TopicPartition, list[RawRecord]] = {}
        for r in records:
            by_tp.setdefault((r.topic, r.partition), []).append(r)
        batched: list[RawRecord] = []
        singly: list[list[RawRecord]] = []
        due: list[PartitionAttempt] = []
        for tp, part in by_tp.items():
            watch = self._watch.get(tp)
            if watch is not None and watch.single:
                singly.append(part)
                continue
            if watch is not None:
                due.append(watch.attempt(part[0].offset, part[-1].offset))
            batched.extend(part)
        if due:
            if not self._record_attempts(consumer, due, records):
                return
            for a in due:
                self._watch.pop((a.topic, a.partition), None)
            batched = [r for r in batched if (r.topic, r.partition) in self._epochs]
        if batched:
            # Whatever becomes of it, the partitions decided singly go on: each failure
            # rewinds only the records it concerns.
            self._commit_batch(consumer, batched)
        for part in singly:
            self._commit_singly(consumer, part)

    def _commit_singly(self, consumer: Consumer, part: list[RawRecord]) -> None:
        """Decide one partition's records one at a time, each after recording its
        attempt, until the suspected range is passed; then the rest as one batch."""
        for i, record in enumerate(part):
            tp = (record.topic, record.partition)
            watch = self._watch.get(tp)
            if tp not in self._epochs:
                return
            through = None if watch is None else watch.through
            if watch is None or through is None or record.offset > through:
                self._watch.pop(tp, None)
                log.info("%s[%d]: past the suspected range; batching again", *tp)
                self._commit_batch(consumer, part[i:])
                return
            attempt = watch.attempt(record.offset, through)
            if not self._record_attempts(consumer, [attempt], part[i:]):
                return
            if not self._commit_batch(consumer, [record]):
                return
            if watch.quarantine is not None and watch.quarantine <= record.offset:
                self._watch[tp] = watch = watch.quarantined()
            if record.offset >= through:
                self._watch.pop(tp, None)

    def _record_attempts(
        self, consumer: Consumer, attempts: list[PartitionAttempt], records: Sequence[RawRecord]
    ) -> bool:
        """Record `attempts` durably before deciding; False when nothing may be decided
        now (the ledger is unreachable: `records` rewound, backed off). A partition a
        newer claim took is dropped and paused, as a fenced batch is."""
        try:
            fenced = self.ledger.record_attempts(self.settings.group_id, attempts, self._epochs)
        except LedgerError as exc:
            log.error("cannot record this start's attempt, will replay: %s", exc)
            self._rewind(consumer, records)
            self._backoff.wait(self._stop)
            return False
        if fenced:
            self.metrics.batch("fenced")
        for topic, partition in fenced:
            log.error("batch dropped: %s[%d] is owned by a newer claim", topic, partition)
            self._fence(consumer, (topic, partition))
        return True

    def _examine(self, record: RawRecord) -> IntakeResult:
        watch = self._watch.get((record.topic, record.partition)) if self._watch else None
        if watch is not None and watch.quarantine == record.offset:
            log.error(
                "quarantining %s: %d starts died without committing past it",
                record.coordinates,
                watch.deaths,
            )
            return Rejected(record, quarantine_refusal(record, watch.deaths, watch.alone))
        return self._intake.examine(record)

    def _commit_batch(self, consumer: Consumer, records: list[RawRecord]) -> bool:
        """Decide and commit one batch; True when it committed."""
        started = time.monotonic()
        outcomes = [self._examine(r) for r in records]
        positions = positions_for(records, self._epochs)
        excluded: dict[str, Refusal] = {}
        for _attempt in range(len(records) + _EXTRA_REPLANS):
            result, planned = self._attempt(outcomes, positions, excluded)
            if result == "committed" and planned is not None:
                self._committed(planned, positions, time.monotonic() - started)
                self._advise(consumer, positions)
                return True
            self.metrics.batch(result)
            if result == "fenced":
                self._fenced(consumer, records, positions)
                return False
            if result == "unavailable":
                self._rewind(consumer, records)
                self._backoff.wait(self._stop)
                return False
        log.error("batch of %d records could not be committed; replaying it", len(records))
        self._rewind(consumer, records)
        self._backoff.wait(self._stop)
        return False

    def _attempt(
        self,
        outcomes: list[IntakeResult],
        positions: tuple[Position, ...],
        excluded: dict[str, Refusal],
    ) -> tuple[str, DecidedBatch | None]:
        """Plan and commit once. Returns the result (committed, conflict, fenced,
        unavailable) and the plan; a conflicting id the ledger names is added to
        `excluded` for the next attempt."""
        partitions = [(p.topic, p.partition) for p in positions]
        planned: DecidedBatch | None = None
        with self._tracer.batch(len(outcomes), partitions) as span:
            try:
                views = self.ledger.load_views(operation_ids(outcomes))
                now = self._clock()

                def decide(
                    read: Mapping[str, str | None], keys: Sequence[ClaimKey]
                ) -> DecidedBatch:
                    return decide_batch(
                        outcomes,
                        views,
                        self.rules,
                        group=self.settings.group_id,
                        controller=self.settings.instance_id,
                        positions=positions,
                        now=now,
                        excluded=excluded,
                        observe=self._tracer.observer(span, self.metrics.decision_latency),
                        topics=self._topics,
                        arrivals=self.ledger.arrival_lineage(read),
                        sign=self.signer,
                        claims=self.ledger.key_claims(keys),
                        pins=self.pins,
                    )

                planned = decide_on_openers(
                    decide, openings(outcomes, views, excluded), claim_keys(outcomes, views)
                )
                self.ledger.commit(planned.batch)
            except RetryableConflict as exc:
                log.info("batch replanned: %s", exc)
                return "conflict", planned
            except (EventIdReused, NonceReused) as exc:
                found = None if planned is None else _named_record(exc, planned)
                if found is not None:
                    log.warning("dead-lettering %s: %s", found[0], exc)
                    excluded[found[0]] = found[1]
                return "conflict", planned
            except FencedError as exc:
                log.error("batch dropped: %s", exc)
                return "fenced", planned
            except LedgerError as exc:
                log.error("batch abandoned, will replay from the stored offsets: %s", exc)
                return "unavailable", planned
            except Exception as exc:
                # Rows one record's decision cannot be built from: dead-letter that
                # record and plan again; anything else is not a record's fault.
                found = None if planned is None else unbuildable(planned, exc)
                if found is None:
                    raise
                log.error("dead-lettering %s: %s", found[0], found[1].reason)
                excluded[found[0]] = found[1]
                return "conflict", planned
        return "committed", planned

    def _committed(
        self, planned: DecidedBatch, positions: Sequence[Position], seconds: float
    ) -> None:
        for p in positions:
            self._next[(p.topic, p.partition)] = p.next_offset
        self._timers_decided(planned.decisions)
        if self._claimed_at:
            self._first_commits(positions)
        self.metrics.committed(planned, seconds)
        self._backoff.reset()
        self.committed_batches += 1

    def _first_commits(self, positions: Sequence[Position]) -> None:
        now = time.monotonic()
        for p in positions:
            claimed = self._claimed_at.pop((p.topic, p.partition), None)
            if claimed is not None:
                log.info(
                    "%s[%d]: first batch committed %.0f ms after the claim (epoch %d)",
                    p.topic,
                    p.partition,
                    (now - claimed) * 1000,
                    p.epoch,
                )

    def _advise(self, consumer: Consumer, positions: Sequence[Position]) -> None:
        """Hand the offsets the ledger just stored to librdkafka, which commits the
        newest of them to Kafka every `auto.commit.interval.ms` (and when a partition
        is revoked or the consumer closes), so Kafka's tools see the group's lag. Advice
        only: the ledger's offsets stay the ones the controller starts from, so a lost
        or late commit changes nothing. One commit request per batch cost the broker
        about half its CPU per event at a steady 200 ev/s (docs/PERFORMANCE.md, eighth
        round)."""
        offsets = [
            KafkaPartition(p.topic, p.partition, p.next_offset)
            for p in positions
            if (p.topic, p.partition) in self._epochs
        ]
        if not offsets:
            return
        try:
            consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:  # a partition revoked under us, say
            self._advice_failed(exc)

    def _advised(self, error: KafkaError | None, partitions: list[KafkaPartition]) -> None:
        """librdkafka's `on_commit` callback (run inside `consume`). A periodic
        commit with nothing stored since the last one reports `_NO_OFFSET`: not a
        failure."""
        if error is not None and error.code() == KafkaError._NO_OFFSET:
            return
        failed = [p for p in partitions if p.error is not None]
        if error is not None or failed:
            self._advice_failed(error or failed[0].error)

    def _advice_failed(self, error: object) -> None:
        self.advisory_commit_failures += 1
        self.metrics.advisory_commit_failed(_error_name(error))
        log.debug("advisory offset commit to Kafka failed (the ledger's offsets stand): %s", error)

    def _rewind(self, consumer: Consumer, records: Sequence[RawRecord]) -> None:
        """Seek each partition of an abandoned batch back to its first record, so the
        next consume replays it (it is what the ledger's stored offsets say)."""
        first: dict[TopicPartition, int] = {}
        for r in records:
            tp = (r.topic, r.partition)
            first[tp] = min(first.get(tp, r.offset), r.offset)
        for (topic, partition), offset in first.items():
            if (topic, partition) not in self._epochs:
                continue
            try:
                consumer.seek(KafkaPartition(topic, partition, offset))
            except KafkaException as exc:  # a failed seek must not lose the batch
                log.warning("seek %s[%d]@%d failed (%s); rejoining", topic, partition, offset, exc)
                self._epochs.pop((topic, partition), None)
                self._pending.add((topic, partition))

    def _fenced(
        self, consumer: Consumer, records: list[RawRecord], positions: Sequence[Position]
    ) -> None:
        """A newer epoch owns a partition of the batch. With one partition, stop
        consuming it (`_fence`: the rebalance that moved it is normally on its way; if
        none comes, it is claimed back a session timeout later). With several,
        decide each partition's records on its own: only the fenced ones are dropped,
        the others commit (an operation's events all sit on one partition)."""
        if len(positions) == 1:
            (p,) = positions
            self._fence(consumer, (p.topic, p.partition))
            return
        for p in positions:
            part = [r for r in records if (r.topic, r.partition) == (p.topic, p.partition)]
            if (p.topic, p.partition) in self._epochs:
                self._commit_batch(consumer, part)

    def _fence(self, consumer: Consumer, tp: TopicPartition) -> None:
        """Stop deciding a partition a newer claim owns. If Kafka still assigns it to us
        a session timeout later (no rebalance moved it: the claim was an operator's, e.g.
        `recoveryctl offsets skip`, or a zombie's that is gone), claim it back then and
        resume from the stored offset; a revocation in between forgets it."""
        self._epochs.pop(tp, None)
        self._watch.pop(tp, None)
        consumer.pause([KafkaPartition(*tp)])
        self._pending.add(tp)
        self._pending_at = time.monotonic() + self.settings.session_timeout_ms / 1000

    # -- timers -------------------------------------------------------------------------

    def _fire_timers(self, consumer: Consumer) -> None:
        """Fire one slice of the timers due on the owned partitions (module docstring);
        look again at the next turn while slices come back full, else after
        `timer_poll_ms`. A partition the ledger says a newer claim owns is fenced."""
        settings = self.settings
        now = time.monotonic()
        if self._in_flight >= settings.timer_slice:
            if now - self._in_flight_at < _IN_FLIGHT_PATIENCE:
                # A storm of due timers must not crowd out live events: the next slice
                # waits until this one's events are being decided (look every turn).
                self._timers_at = 0.0
                return
            # Decided by another member, disarmed, or dead-lettered: stop waiting.
            log.info("%d fired timer event(s) not seen decided; firing again", self._in_flight)
            self._in_flight = 0
        self._timers_at = now + settings.timer_poll_ms / 1000
        if not self._epochs:
            return
        try:
            fired = self.ledger.fire_timers(
                settings.group_id,
                dict(self._epochs),
                self._clock(),
                limit=settings.timer_slice,
                topics=self._topics,
                sign=self.signer,
            )
        except LedgerError as exc:
            log.warning("firing due timers failed (they stay due, tried again): %s", exc)
            return
        self.metrics.timers_fired(fired)
        if fired.fired:
            log.debug("fired %d timer(s)", len(fired.fired))
            self._in_flight += len(fired.fired)
            self._in_flight_at = time.monotonic()
        for topic, partition in fired.fenced:
            log.error("timers not fired: %s[%d] is owned by a newer claim", topic, partition)
            self._fence(consumer, (topic, partition))
        if fired.full:
            self._timers_at = 0.0

    def _timers_decided(self, decisions: Sequence[Decision]) -> None:
        """Count the timer events a committed batch decided off those in flight."""
        timed = sum(1 for d in decisions if is_timer_event(d.event_id))
        if timed and self._in_flight:
            self._in_flight = max(0, self._in_flight - timed)
            self._in_flight_at = time.monotonic()

    def _read_timer_gauges(self) -> None:
        settings = self.settings
        self._gauges_at = time.monotonic() + settings.timer_gauges_s
        now = self._clock()
        try:
            summary = self.ledger.timer_summary(
                sorted(self._epochs), now, timedelta(seconds=settings.timer_overdue_after_s)
            )
        except LedgerError as exc:
            log.debug("timer gauges not read: %s", exc)
            return
        self.metrics.set_timer_summary(summary, now)

    # -- rebalance ----------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        log.info("assigned %s", ", ".join(f"{t}[{p}]" for t, p in tps))
        try:
            offsets = self._claim(tps)
        except LedgerError as exc:
            # Assign them paused; the loop claims them when the ledger is back.
            log.error("cannot claim %s yet: %s", tps, exc)
            consumer.incremental_assign(partitions)
            consumer.pause(partitions)
            self._pending.update(tps)
            return
        consumer.incremental_assign([KafkaPartition(t, p, o) for (t, p), o in offsets.items()])
        # A partition this member was fenced on was paused (`_fenced`); librdkafka keeps
        # that pause across unassign and assign, so without this a partition given back
        # to a former zombie would never be fetched again.
        consumer.resume(partitions)

    def _claim(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Claim `tps` in the ledger; returns the offset to start each one from."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in tps:
            by_topic.setdefault(topic, []).append(partition)
        reset = OFFSET_BEGINNING if self.settings.auto_offset_reset == "earliest" else OFFSET_END
        offsets: dict[TopicPartition, int] = {}
        for topic, partitions in by_topic.items():
            claims = self.ledger.claim(
                self.settings.group_id, topic, partitions, self.settings.instance_id
            )
            for c in claims:
                tp = (c.topic, c.partition)
                self._epochs[tp] = c.epoch
                self._claimed_at[tp] = time.monotonic()
                self._next[tp] = c.next_offset if c.next_offset is not None else 0
                self._pending.discard(tp)
                self._watch[tp] = watch = watch_after_claim(
                    c, self.settings.quarantine_after_starts
                )
                if watch.single:
                    log.warning(
                        "%s[%d]: %d starts in a row died without committing past offset "
                        "%d; deciding up to offset %s one record at a time",
                        c.topic,
                        c.partition,
                        watch.starts - 1,
                        c.next_offset if c.next_offset is not None else -1,
                        watch.through,
                    )
                offsets[tp] = c.next_offset if c.next_offset is not None else reset
        return offsets

    def _claim_pending(self, consumer: Consumer) -> None:
        pending = sorted(self._pending)
        try:
            offsets = self._claim(pending)
        except LedgerError as exc:
            log.error("cannot claim %s yet: %s", pending, exc)
            self._pending_at = time.monotonic() + 1.0
            return
        for (topic, partition), offset in offsets.items():
            # Re-assigning is the one way to set a start offset for a partition whose
            # fetcher may not have started yet (seek needs it running).
            consumer.incremental_unassign([KafkaPartition(topic, partition)])
            consumer.incremental_assign([KafkaPartition(topic, partition, offset)])
            consumer.resume([KafkaPartition(topic, partition)])

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        self._forget(partitions, "revoked")
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        # Lost without a clean revoke (session timeout): whoever owns them now has a
        # newer epoch, so nothing we still hold could commit anyway.
        self._forget(partitions, "lost")
        consumer.incremental_unassign(partitions)

    def _forget(self, partitions: Sequence[KafkaPartition], why: str) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self._epochs.pop(tp, None)
            self._next.pop(tp, None)
            self._claimed_at.pop(tp, None)
            self._pending.discard(tp)
            self._watch.pop(tp, None)
        # The timer events fired on them are another member's to decide now.
        self._in_flight = 0
        log.info("%s %s", why, ", ".join(f"{p.topic}[{p.partition}]" for p in partitions))

    # -- lag ----------------------------------------------------------------------------

    def _update_lag(self, consumer: Consumer) -> None:
        lags: dict[TopicPartition, int] = {}
        for tp, next_offset in list(self._next.items()):
            if tp not in self._epochs:
                continue
            try:
                _low, high = consumer.get_watermark_offsets(KafkaPartition(*tp), cached=True)
            except KafkaException:  # lag is best effort, never fatal
                continue
            if high >= 0:
                lags[tp] = max(0, high - next_offset)
        self.metrics.set_lag(lags)

    @property
    def owned(self) -> dict[TopicPartition, int]:
        """The partitions this member owns now, with their epochs."""
        return dict(self._epochs)


def _named_record(
    exc: EventIdReused | NonceReused, planned: DecidedBatch
) -> tuple[str, Refusal] | None:
    """The record a reuse error names, with the refusal to dead-letter it with; None
    when the error does not name one (plan again and the ledger will)."""
    for entry in reversed(planned.batch.entries):
        event, decision = entry.event, entry.decision
        if decision.outcome in (Outcome.DUPLICATE, Outcome.CONFLICT) or entry.source is None:
            continue
        coords = f"{entry.source.topic}[{entry.source.partition}]@{entry.source.offset}"
        if isinstance(exc, EventIdReused) and exc.event_id == event.event_id:
            code = RefusalCode.EVENT_ID_CONFLICT
        elif (
            isinstance(exc, NonceReused)
            and event.human_decision is not None
            and event.human_decision.nonce == exc.nonce
            and decision.evidence.approval is not None
        ):
            code = RefusalCode.NONCE_REPLAYED
        else:
            continue
        return coords, Refusal(code, f"record {coords}: {exc}", event.event_id, event.operation_id)
    return None


def _error_name(error: object) -> str:
    """The name of a Kafka error (`REBALANCE_IN_PROGRESS`, `_TRANSPORT`, ...), from a
    `KafkaError` or a `KafkaException` holding one; `unknown` otherwise. Bounded, so fit
    for a metric label."""
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaError):
        return str(error.name())
    return "unknown"
