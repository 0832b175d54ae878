"""Controller metrics (OpenTelemetry): what an operator watches to know the group keeps up
and what it refuses.

Instruments (all prefixed `recovery.controller.`; the table is in docs/controller.md):
`events.processed`, `events.rejected` (decisions that changed nothing: rejected, refused,
final), `events.duplicated`, `events.dead_lettered` (by `reason`), `security_incidents` (by
`kind`: a dead letter that is an incident, `machines.opening`), `batches` (attempts
by `result`: committed, fenced, conflict, unavailable), `decision.latency` and
`batch.latency` (seconds), the `consumer.lag` gauge per owned partition (high
watermark minus the stored next offset), and `advisory_commit.failures` (by `reason`,
the Kafka error's name): offset commits to Kafka that failed. Those are advice only (the
ledger's offsets are authoritative), so a failure loses nothing, but while they fail
Kafka's tools show a stale lag.

Time (`machines.timers`): `timers.armed`, `timers.fired`, `timers.cancelled` (disarmed
before their event was decided: the state was left) and `timers.stale` (events of
timers disarmed meanwhile), by `kind`; and, read from the ledger every
`timer_gauges_s` for the partitions this member owns, the gauges `timers.pending`
(armed, not decided), `timers.overdue` (not decided `timer_overdue_after_s` past their
due time), `operations.waiting`, `operations.oldest_wait` (seconds) and
`operations.stalled`, by `machine` and `state`.

Counts are recorded only after the batch transaction commits, so a replayed batch is
never counted twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from consumer.batch import DecidedBatch
from ledger import FiredTimers, TimerSummary, WaitingState
from machines import Outcome

__all__ = ["ControllerMetrics"]

_UNCHANGED = frozenset({Outcome.REJECTED, Outcome.REFUSED, Outcome.FINAL})


class ControllerMetrics:
    """The controller's instruments on one meter provider."""

    def __init__(self, provider: metrics.MeterProvider, group: str) -> None:
        meter = provider.get_meter("consumer")
        self._group = {"consumer.group": group}
        self._processed = meter.create_counter(
            "recovery.controller.events.processed", unit="{event}", description="events decided"
        )
        self._rejected = meter.create_counter(
            "recovery.controller.events.rejected",
            unit="{event}",
            description="decisions that left the state unchanged",
        )
        self._duplicated = meter.create_counter(
            "recovery.controller.events.duplicated",
            unit="{event}",
            description="events already decided",
        )
        self._dead = meter.create_counter(
            "recovery.controller.events.dead_lettered",
            unit="{record}",
            description="records sent to the dead-letter topic",
        )
        self._incidents = meter.create_counter(
            "recovery.controller.security_incidents",
            unit="{incident}",
            description="records that are security incidents (by `kind`), also dead-lettered",
        )
        self._batches = meter.create_counter(
            "recovery.controller.batches", unit="{batch}", description="batch attempts"
        )
        self._decision_latency = meter.create_histogram(
            "recovery.controller.decision.latency", unit="s", description="decision core time"
        )
        self._batch_latency = meter.create_histogram(
            "recovery.controller.batch.latency", unit="s", description="consume to commit"
        )
        self._advice_failures = meter.create_counter(
            "recovery.controller.advisory_commit.failures",
            unit="{commit}",
            description="advisory offset commits to Kafka that failed (the ledger's stand)",
        )
        self._timers = {
            what: meter.create_counter(
                f"recovery.controller.timers.{what}", unit="{timer}", description=text
            )
            for what, text in (
                ("armed", "timers armed by committed decisions, by kind"),
                ("fired", "timers whose event was written to the outbox, by kind"),
                ("cancelled", "timers disarmed before their event was decided, by kind"),
                ("stale", "timer events that arrived after their timer was disarmed"),
            )
        }
        self._summary: TimerSummary | None = None
        self._summary_at: datetime | None = None
        for name, unit, text, callback in (
            ("timers.pending", "{timer}", "timers armed and not decided yet", self._pending),
            ("timers.overdue", "{timer}", "timers not decided long after due", self._overdue),
            ("operations.waiting", "{operation}", "operations per state", self._waiting),
            ("operations.oldest_wait", "s", "the longest wait per state", self._oldest),
            ("operations.stalled", "{operation}", "stalled operations per state", self._stalled),
        ):
            meter.create_observable_gauge(
                f"recovery.controller.{name}", callbacks=[callback], unit=unit, description=text
            )
        self._lag_lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        meter.create_observable_gauge(
            "recovery.controller.consumer.lag",
            callbacks=[self._observe_lag],
            unit="{record}",
            description="records behind the high watermark, per owned partition",
        )

    def decision_latency(self, seconds: float) -> None:
        """One decision's duration (called by the tracer's observer)."""
        self._decision_latency.record(seconds, self._group)

    def batch(self, result: str) -> None:
        """One batch attempt ended with `result` (committed, fenced, conflict, ...)."""
        self._batches.add(1, {**self._group, "result": result})

    def committed(self, planned: DecidedBatch, seconds: float) -> None:
        """Count what a committed batch held."""
        decisions = planned.decisions
        self._processed.add(len(decisions), self._group)
        self._rejected.add(sum(d.outcome in _UNCHANGED for d in decisions), self._group)
        self._duplicated.add(planned.duplicates, self._group)
        if planned.conflicts:
            self._dead.add(planned.conflicts, {**self._group, "reason": "event-id-conflict"})
        for _record, refusal in planned.refused:
            self._dead.add(1, {**self._group, "reason": refusal.code})
            if refusal.incident is not None:
                kind = str(refusal.incident.get("kind"))
                self._incidents.add(1, {**self._group, "kind": kind})
        self._batch_latency.record(seconds, self._group)
        self.timers_committed(planned.timer_counts())
        self.batch("committed")

    def timers_committed(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Count a committed batch's timers: (`armed`|`cancelled`|`stale`, kind) -> n."""
        for (what, kind), n in counts.items():
            self._timers[what].add(n, {**self._group, "kind": kind})

    def timers_fired(self, fired: FiredTimers) -> None:
        """Count the timers one firing wrote the events of."""
        for timer in fired.fired:
            self._timers["fired"].add(1, {**self._group, "kind": timer.kind})

    def set_timer_summary(self, summary: TimerSummary, now: datetime) -> None:
        """Replace what the timer and waiting gauges report (read at `now`)."""
        with self._lag_lock:
            self._summary, self._summary_at = summary, now

    def _summary_now(self) -> tuple[TimerSummary, datetime] | None:
        with self._lag_lock:
            if self._summary is None or self._summary_at is None:
                return None
            return self._summary, self._summary_at

    def _pending(self, _options: CallbackOptions) -> Iterable[Observation]:
        found = self._summary_now()
        if found is not None:
            yield Observation(found[0].armed, self._group)

    def _overdue(self, _options: CallbackOptions) -> Iterable[Observation]:
        found = self._summary_now()
        if found is not None:
            yield Observation(found[0].overdue, self._group)

    def _per_state(self, value: Callable[[WaitingState, datetime], float]) -> Iterable[Observation]:
        found = self._summary_now()
        if found is None:
            return
        summary, now = found
        for w in summary.waiting:
            labels = {**self._group, "machine": w.machine, "state": w.state}
            yield Observation(value(w, now), labels)

    def _waiting(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._per_state(lambda w, _now: w.operations)

    def _oldest(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._per_state(lambda w, now: max(0.0, (now - w.oldest_since).total_seconds()))

    def _stalled(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._per_state(lambda w, _now: w.stalled)

    def advisory_commit_failed(self, reason: str) -> None:
        """One advisory offset commit to Kafka failed with the error named `reason`."""
        self._advice_failures.add(1, {**self._group, "reason": reason})

    def set_lag(self, lags: Mapping[tuple[str, int], int]) -> None:
        """Replace the lag of the partitions this controller owns."""
        with self._lag_lock:
            self._lag = dict(lags)

    def lags(self) -> dict[tuple[str, int], int]:
        """The latest lag per owned partition (what the gauge reports)."""
        with self._lag_lock:
            return dict(self._lag)

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        lags = self.lags()
        for (topic, partition), lag in sorted(lags.items()):
            yield Observation(
                lag, {**self._group, "messaging.destination": topic, "partition": partition}
            )
