"""The outbox relay: publishes committed outbox rows to Kafka, in order per key.

One pass (`OutboxRelay.relay_once`):

1. lease up to `lease_keys` keys' unpublished rows (`Ledger.lease_outbox`): the lease
   holds each key's oldest row, so another relay instance skips those keys entirely and
   several instances never reorder a key;
2. encode each row for its topic (`producers.encoding`) and hand the records to one
   idempotent producer (`enable.idempotence`, `acks=all`, at most 5 requests in flight,
   which librdkafka needs to keep order across its own retries), in lease order;
3. wait for every delivery report, then mark published, per key, the acknowledged
   prefix of its rows: a key's row after a failed one is never marked ahead of it;
   a key whose prefix stops at a row that cannot be encoded has that row **held**
   (`OutboxLease.hold`): leases skip the key from then on, so poison rows cannot fill
   every lease and starve the other keys, and `recoveryctl outbox release` retries it;
4. leave the lease, which commits the marks and holds.

A crash anywhere before 4 leaves the rows unpublished: they are published again, with
the same `recovery-record-id`, so consumers of the output topics dedupe (at-least-once
with deterministic ids). `run` loops until its stop event is set, waking on
LISTEN/NOTIFY (`ledger.outbox_watch`) with a polling fallback, and backs off when the
broker or the database is down. Run it as its own process with `recoveryctl run --role
relay` (`python -m ops.cli run --role relay`).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import SpanKind

from ledger import Ledger, LedgerError, LedgerUnavailable, OutboxRecord, OutboxWatch
from machines import Lineage
from producers.client import EventPublisher
from producers.encoding import EncodedRecord, RecordEncoder, UnpublishableRow
from producers.errors import DeliveryFailed, ProducersError, RecordRefused
from producers.relay_metrics import RelayMetrics
from producers.settings import RelaySettings
from producers.topics import check_message_limits
from schemas import (
    MAX_OUTBOX_RECORD_BYTES,
    TOPIC_MAX_MESSAGE_BYTES,
    KafkaSecurity,
    TopicNames,
    librdkafka_logger,
)

__all__ = [
    "LineageCache",
    "OutboxRelay",
    "PassResult",
    "RelayStats",
    "lineage_from_ledger",
]

_log = logging.getLogger(__name__)

# librdkafka keeps per-partition order across retries with idempotence only with at
# most 5 requests in flight; the client's settings add idempotence and acks=all.
_ORDERED_PRODUCER: Final[Mapping[str, Any]] = {"max.in.flight.requests.per.connection": 5}


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one lease did: rows leased, published (acknowledged and marked), failed."""

    leased: int
    published: int
    failed: int
    unpublishable: int


@dataclass(slots=True)
class RelayStats:
    """Counters of one `run`, returned when it stops."""

    passes: int = 0
    published: int = 0
    failed: int = 0
    unpublishable: int = 0
    outages: int = 0


def lineage_from_ledger(ledger: Ledger) -> Callable[[str], Lineage]:
    """A lineage lookup for command rows whose payload has none: the operation row's
    lineage, with the credentials delegated to the operation (a revoke worker reads them)."""

    def lookup(operation_id: str) -> Lineage:
        return ledger.operation(operation_id).lineage

    return lookup


class LineageCache:
    """The lineage of the operations whose command rows the relay encodes, so that an
    operation costs at most one ledger query (`lookup`), and usually none.

    What is cached cannot go stale: the fields a command carries (agent, task,
    initiating principal, origin and parent as reported, delegated credentials) are
    written once, when the operation's first batch inserts its row, and never updated;
    linking below a parent later changes only the ledger's ancestor columns, which
    commands do not carry (docs/lineage.md). `learn` takes them from the
    `operation-opened` audit rows of a lease: that batch wrote the operation row from
    the same event (`ledger.records`), and its commands are leased with it (a lease
    holds all of a key's unpublished rows), so a new operation's commands need no
    query at all. Least recently used entries beyond `capacity` are dropped. One relay
    thread uses it; it is not locked."""

    def __init__(self, lookup: Callable[[str], Lineage], capacity: int = 10_000) -> None:
        self._lookup = lookup
        self._capacity = capacity
        self._known: OrderedDict[str, Lineage] = OrderedDict()

    def __call__(self, operation_id: str) -> Lineage:
        """The operation's lineage: cached, else from `lookup` (which may raise)."""
        found = self._known.get(operation_id)
        if found is None:
            found = self._lookup(operation_id)
            self._store(operation_id, found)
        else:
            self._known.move_to_end(operation_id)
        return found

    def learn(self, records: Sequence[OutboxRecord], audit_topics: Collection[str]) -> None:
        """Remember the lineage that `operation-opened` rows among `records` on one of
        `audit_topics` state; a body without every lineage field is skipped (its
        operation is looked up instead)."""
        for row in records:
            payload = row.payload
            if (
                row.topic in audit_topics
                and payload.get("kind") == "operation-opened"
                and row.key not in self._known
            ):
                lineage = _opened_lineage(payload.get("record"))
                if lineage is not None and payload.get("operation_id") == row.key:
                    self._store(row.key, lineage)

    def _store(self, operation_id: str, lineage: Lineage) -> None:
        self._known[operation_id] = lineage
        if len(self._known) > self._capacity:
            self._known.popitem(last=False)


def _opened_lineage(body: Any) -> Lineage | None:
    """The lineage an `operation-opened` audit body states, or None when it lacks a
    field or a field has the wrong type (never guess a command's lineage)."""
    if not isinstance(body, Mapping) or not all(name in body for name in _LINEAGE_FIELDS):
        return None
    agent, task, principal = body["agent"], body["task"], body["initiating_principal"]
    origin, parent = body["origin_operation"], body["parent_operation"]
    credentials = body["delegated_credentials"]
    if not (
        all(isinstance(v, str) for v in (agent, task, principal))
        and all(v is None or isinstance(v, str) for v in (origin, parent))
        and isinstance(credentials, list)
        and all(isinstance(c, str) for c in credentials)
    ):
        return None
    return Lineage(
        agent=agent,
        task=task,
        initiating_principal=principal,
        origin_operation=origin,
        parent_operation=parent,
        delegated_credentials=tuple(credentials),
    )


_LINEAGE_FIELDS: Final = (
    "agent",
    "task",
    "initiating_principal",
    "origin_operation",
    "parent_operation",
    "delegated_credentials",
)


class OutboxRelay:
    """One relay instance over one ledger and one producer; `run` in its own thread or
    process. Several instances may share an outbox."""

    def __init__(
        self,
        ledger: Ledger,
        bootstrap: str,
        *,
        database_url: str | None = None,
        topics: TopicNames | None = None,
        settings: RelaySettings | None = None,
        producer_config: Mapping[str, Any] | None = None,
        instance: str | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        security: KafkaSecurity | None = None,
    ) -> None:
        self.settings = settings or RelaySettings.load()
        self.instance = instance or f"relay-{uuid.uuid4().hex[:8]}"
        self._ledger = ledger
        self._database_url = database_url
        self._topics = topics or TopicNames.from_env()
        # The relay's records are the controller's; they are signed with its key on the
        # relay's own path, not as a producer of events.
        self._publisher = EventPublisher(
            bootstrap,
            security=security,  # the relay principal's (else the environment's)
            signer=None,  # the rows are signed by the controller; never re-signed
            topics=self._topics,
            producer_config={
                "client.id": self.instance,
                "logger": librdkafka_logger("relay"),
                "delivery.timeout.ms": int(self.settings.delivery_timeout * 1000),
                # A pass produces its rows in a burst and flushes, which sends at once:
                # the linger only lets the burst travel in fewer requests.
                "linger.ms": 5,
                # Above the relay's own bound, so that a row too large is held by the
                # relay with its reason before librdkafka sees it (schemas.limits).
                "message.max.bytes": TOPIC_MAX_MESSAGE_BYTES,
                **(producer_config or {}),
                **_ORDERED_PRODUCER,
            },
            max_record_bytes=MAX_OUTBOX_RECORD_BYTES,
        )
        self._bootstrap, self._security = bootstrap, security
        # Why the topics' limits are not known to admit every row yet (`run` checks them
        # before its first pass, and again after each failure); None once they are.
        self.limits_problem: str | None = "not checked yet"
        self._reported: set[str] = set()
        self._lineage = LineageCache(lineage_from_ledger(ledger))
        # Rows name the configured topic or the default name (producers.encoding).
        self._audit_topics = frozenset({self._topics.audit, TopicNames().audit})
        self._encoder = RecordEncoder(self._topics, self._lineage)
        # The process-global providers unless the caller hands in its own (tests, or a
        # process running several roles with separate exporters).
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        # Only a tracer that is no-op for good (`recoveryctl run` without an exporter):
        # a proxy of the global provider may start recording later.
        self._untraced = isinstance(self._tracer, trace.NoOpTracer)
        self._metrics = RelayMetrics(self.instance, meter_provider)
        # When the loop last turned (monotonic), for the liveness probe.
        self.last_loop = time.monotonic()

    # -- one pass ---------------------------------------------------------------------

    def relay_once(self) -> PassResult:
        """Lease, publish, wait for the acknowledgements and mark what was acknowledged.
        Raises `LedgerError` (database) or `ProducersError` (broker) when the pass could
        not finish; nothing unacknowledged is ever marked."""
        with self._tracer.start_as_current_span("relay pass", kind=SpanKind.INTERNAL) as span:
            with self._ledger.lease_outbox(self.settings.lease_keys, payloads=False) as lease:
                records = lease.records
                if not records:
                    return PassResult(0, 0, 0, 0)
                sent, blocked = self._send_all(records)
                failed, refused = self._await_delivery()
                blocked.update(refused)
                marked, holds = _acknowledged_prefixes(records, sent, failed, blocked)
                if marked:
                    lease.mark_published([r.record_id for r in marked])
                for row, reason in holds:
                    lease.hold(row.record_id, reason)
            for row, reason in holds:
                _log.error(
                    "relay %s: held outbox row %s (key %s, topic %s): its key waits until "
                    "`recoveryctl outbox release %s` after the cause is fixed: %s",
                    self.instance,
                    row.record_id,
                    row.key,
                    row.topic,
                    row.record_id,
                    reason,
                )
            # The lease committed: only now are the rows published as far as anyone knows.
            self._metrics.published(marked)
            result = PassResult(len(records), len(marked), len(failed), len(blocked))
            span.set_attribute("recovery.relay.leased", result.leased)
            span.set_attribute("recovery.relay.published", result.published)
            return result

    def _send_all(self, records: Sequence[OutboxRecord]) -> tuple[set[str], dict[str, str | None]]:
        """Hand every row to the producer in lease order. A row that cannot be encoded
        blocks the rest of its key for this pass (and, once held, every pass until an
        operator releases it); the second result maps such rows to why (None when the
        cause was a database outage while encoding: no verdict, nothing is held)."""
        self._lineage.learn(records, self._audit_topics)
        sent: set[str] = set()
        blocked_keys: set[str] = set()
        unpublishable: dict[str, str | None] = {}
        for row in records:
            if row.key in blocked_keys:
                continue
            try:
                encoded = self._encoder.encode(row)
            except (UnpublishableRow, LedgerError) as exc:
                # Loud once per row, then quiet: the row is retried every pass.
                level = logging.DEBUG if row.record_id in self._reported else logging.ERROR
                self._reported.add(row.record_id)
                _log.log(level, "%s", exc)
                blocked_keys.add(row.key)
                # An outage is no verdict on the row: it stays unheld and is retried.
                transient = isinstance(exc, LedgerUnavailable)
                unpublishable[row.record_id] = None if transient else str(exc)
                continue
            try:
                self._send(encoded)
            except RecordRefused as exc:
                # Too large (or otherwise refused) for what it is: held like a row that
                # cannot be encoded; its key waits, every other key goes on.
                _log.error("relay %s: %s", self.instance, exc)
                blocked_keys.add(row.key)
                unpublishable[row.record_id] = f"the producer refused it: {exc.reason}"
                continue
            sent.add(row.record_id)
        if unpublishable:
            self._metrics.unpublishable(len(unpublishable))
        return sent, unpublishable

    def _send(self, record: EncodedRecord) -> None:
        # Continue the trace of whoever caused the row (the controller's decision span):
        # the publish span is its child, and the record's traceparent names this span.
        parent = propagate.extract(dict(record.trace_carrier)) if record.trace_carrier else None
        if self._untraced:
            # A no-op tracer's span is the parent's own non-recording span (or, without
            # a parent, the current one), so the record's trace headers come from the
            # parent context alone: attaching it gives the same headers without
            # starting, attaching and ending a span per record (about 3 us of CPU).
            token = None if parent is None else otel_context.attach(parent)
            try:
                self._publish(record)
            finally:
                if token is not None:
                    otel_context.detach(token)
            return
        # OpenTelemetry's messaging conventions for Kafka (semconv 1.27+, where the
        # operation type `send` replaced `publish`): `send <topic>`, kind PRODUCER.
        with self._tracer.start_as_current_span(
            f"send {record.topic}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": record.topic,
                "messaging.kafka.message.key": record.key,
                "messaging.client.id": self.instance,
                "recovery.record_id": record.record_id,
                "recovery.operation_id": record.key,
            },
        ):
            self._publish(record)

    def _publish(self, record: EncodedRecord) -> None:
        self._publisher.send(
            record.topic,
            key=record.key,
            value=record.value,
            record_id=record.record_id,
            content_type=record.content_type,
            fingerprint=record.fingerprint,
            extra_headers=record.headers,
        )

    def _await_delivery(self) -> tuple[set[str], dict[str, str]]:
        """The rows not acknowledged (retried by a later pass), and of those the ones
        the broker refused for what they are, with why (held: retrying cannot help)."""
        try:
            self._publisher.flush(self.settings.delivery_timeout)
        except DeliveryFailed as exc:
            for rid, why in exc.failures[:5]:
                _log.warning("relay %s: record %s not acknowledged: %s", self.instance, rid, why)
            refused = {rid: f"the broker refused it: {why}" for rid, why in exc.refused.items()}
            return {rid for rid, _ in exc.failures}, refused
        return set(), {}

    # -- the loop -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> RelayStats:
        """Relay until `stop` is set, then finish the current pass and return. Before
        the first pass it checks that every topic admits the largest row
        (`check_message_limits`): nothing is published until they do, and a broker that
        cannot be asked, or a topic too small, is logged and checked again with the
        outages' backoff (readiness says which). Passes follow each other without
        waiting while rows keep coming; when idle the relay waits for a notification
        (or `idle_poll`). Broker and database outages are logged and retried with
        exponential backoff; nothing is lost meanwhile."""
        stats = RelayStats()
        backoff = self.settings.backoff_initial
        last_backlog = 0.0
        waker = _Waker(self.settings, self._database_url, stop, self.instance)
        _settle_heap(self.instance)
        try:
            while not stop.is_set():
                self.last_loop = time.monotonic()
                try:
                    self._check_limits()
                    result = self.relay_once()
                    if time.monotonic() - last_backlog >= self.settings.backlog_every:
                        last_backlog = time.monotonic()
                        self._refresh_backlog(waker)
                except (LedgerError, ProducersError) as exc:
                    stats.outages += 1
                    _log.warning("relay %s: %s; retrying in %.1fs", self.instance, exc, backoff)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, self.settings.backoff_max)
                    continue
                backoff = self.settings.backoff_initial
                _count(stats, result)
                if result.failed:
                    stop.wait(backoff)  # the broker refused some: do not spin on it
                elif result.leased < self.settings.lease_keys and not result.unpublishable:
                    waker.wait(self.settings.idle_poll)
                elif result.unpublishable and result.published == 0:
                    waker.wait(self.settings.idle_poll)  # only poison left: no hurry
        finally:
            stats.outages += waker.losses
            waker.close()
        try:
            self._publisher.close(self.settings.delivery_timeout)
        except DeliveryFailed as exc:  # pragma: no cover - every pass flushed already
            _log.warning("relay %s: %s", self.instance, exc)
        librdkafka_logger("relay").flush()  # the lines held back, summarised
        return stats

    def _check_limits(self) -> None:
        if self.limits_problem is None:
            return
        try:
            check_message_limits(self._bootstrap, self._topics.all(), security=self._security)
        except ProducersError as exc:
            self.limits_problem = str(exc)
            raise
        self.limits_problem = None

    def _refresh_backlog(self, waker: _Waker) -> None:
        rows = waker.backlog()
        if rows is not None:
            self._metrics.backlog(rows)
        try:
            self._metrics.held(len(self._ledger.held_outbox()))
        except LedgerError as exc:  # a measurement, never fatal
            _log.debug("relay %s: cannot count held rows: %s", self.instance, exc)


class _Waker:
    """How an idle relay waits: on LISTEN/NOTIFY when configured and a database URL is
    known (reconnected after a loss, polling meanwhile), otherwise an interruptible sleep.
    Its connection also measures the backlog."""

    def __init__(
        self, settings: RelaySettings, database_url: str | None, stop: threading.Event, name: str
    ) -> None:
        self._settings = settings
        self._url = database_url if settings.wake == "notify" else None
        self._stop = stop
        self._name = name
        self._watch: OutboxWatch | None = None
        self.losses = 0  # watch connections lost: database outages too, for RelayStats
        self._connect()

    def _connect(self) -> None:
        if self._watch is None and self._url is not None:
            try:
                self._watch = OutboxWatch(self._url)
            except LedgerError as exc:
                _log.warning("relay %s: %s", self._name, exc)

    def _lost(self, exc: LedgerError) -> None:
        self.losses += 1
        _log.warning("relay %s: %s", self._name, exc)
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def wait(self, timeout: float) -> None:
        """Return at the next notification, after `timeout`, or when stopping."""
        self._connect()
        if self._watch is None:
            self._stop.wait(timeout)
            return
        # Short slices so that a stop request is seen within a quarter second.
        deadline = time.monotonic() + timeout
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                if self._watch.wait(min(left, 0.25)):
                    return
            except LedgerError as exc:
                self._lost(exc)
                self._stop.wait(min(left, self._settings.backoff_initial))
                return

    def backlog(self) -> int | None:
        """Unpublished rows now, or None when not measurable (no watch connection)."""
        if self._watch is None:
            return None
        try:
            return self._watch.backlog()
        except LedgerError as exc:
            self._lost(exc)
            return None

    def close(self) -> None:
        """Close the watch connection."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None


def _acknowledged_prefixes(
    records: Sequence[OutboxRecord],
    sent: set[str],
    failed: set[str],
    blocked: Mapping[str, str | None],
) -> tuple[list[OutboxRecord], list[tuple[OutboxRecord, str]]]:
    """Per key, the rows before its first unsent, unacknowledged or blocked row: marking
    a later row of a key without an earlier one would let the earlier one be published
    after it on the next pass. Second: the keys' stopping rows that are blocked (they
    become their keys' heads when the lease commits, and are held there)."""
    stopped: set[str] = set()
    marked: list[OutboxRecord] = []
    holds: list[tuple[OutboxRecord, str]] = []
    for row in records:
        if row.key in stopped:
            continue
        if row.record_id in failed or row.record_id in blocked or row.record_id not in sent:
            stopped.add(row.key)
            reason = blocked.get(row.record_id)
            if reason is not None:
                holds.append((row, reason))
            continue
        marked.append(row)
    return marked, holds


def _count(stats: RelayStats, result: PassResult) -> None:
    stats.passes += 1
    stats.published += result.published
    stats.failed += result.failed
    stats.unpublishable += result.unpublishable


def _settle_heap(instance: str) -> None:
    # As the controller does (consumer/heap.py, docs/controller.md): collect what
    # start-up left behind and freeze the survivors out of the cyclic collector, so a
    # full collection walks only what relaying allocated since, not the tens of
    # thousands of long-lived objects loaded at start.
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    _log.info("%s: %d startup objects frozen out of garbage collection", instance, frozen)
