"""The relay's OpenTelemetry metrics: records published, rows it cannot encode, and the
outbox backlog.

Instruments come from the meter provider the relay is given, else the global one:
without an SDK configured they are no-ops (the API's default). `recoveryctl run` hands
in the providers of the configured exporter (OTLP, console or none, the controller's
`RECOVERY_CONTROLLER_EXPORTER` setting). Names follow the OpenTelemetry convention of
dotted, lower-case names with a unit.

- `recovery.relay.published` (counter, `{record}`): records acknowledged by the broker
  and marked published, by `topic`;
- `recovery.relay.unpublishable` (counter, `{row}`): rows that could not be encoded
  (each one holds back its key until fixed: alert on any);
- `recovery.outbox.backlog` (gauge, `{row}`): unpublished outbox rows, all relays
  together, sampled every few seconds by each relay;
- `recovery.outbox.held` (gauge, `{row}`): rows held as unpublishable (their keys wait
  for `recoveryctl outbox release`), all relays together, sampled with the backlog.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from ledger import OutboxRecord

__all__ = ["RelayMetrics"]


class RelayMetrics:
    """The instruments of one relay instance (its id is the `relay` attribute)."""

    def __init__(self, instance: str, provider: metrics.MeterProvider | None = None) -> None:
        meter = metrics.get_meter("producers.relay", meter_provider=provider)
        self._attributes = {"relay": instance}
        self._published = meter.create_counter(
            "recovery.relay.published",
            unit="{record}",
            description="Outbox records acknowledged by the broker and marked published",
        )
        self._unpublishable = meter.create_counter(
            "recovery.relay.unpublishable",
            unit="{row}",
            description="Outbox rows that could not be encoded for their topic",
        )
        self._lock = threading.Lock()
        self._backlog: int | None = None
        self._held: int | None = None
        meter.create_observable_gauge(
            "recovery.outbox.backlog",
            callbacks=[self._observe_backlog],
            unit="{row}",
            description="Unpublished outbox rows (all relays together)",
        )
        meter.create_observable_gauge(
            "recovery.outbox.held",
            callbacks=[self._observe_held],
            unit="{row}",
            description="Outbox rows held as unpublishable (all relays together)",
        )
        self.published_total = 0

    def published(self, rows: Iterable[OutboxRecord]) -> None:
        """Count rows marked published, per topic."""
        per_topic = Counter(row.topic for row in rows)
        for topic, count in per_topic.items():
            self._published.add(count, {**self._attributes, "topic": topic})
            self.published_total += count

    def unpublishable(self, count: int) -> None:
        """Count rows that could not be encoded in a pass."""
        self._unpublishable.add(count, self._attributes)

    def backlog(self, rows: int) -> None:
        """Record the latest backlog measurement (reported at the next collection)."""
        with self._lock:
            self._backlog = rows

    @property
    def last_backlog(self) -> int | None:
        """The latest backlog measurement, None before the first."""
        with self._lock:
            return self._backlog

    def _observe_backlog(self, _options: CallbackOptions) -> Iterable[Observation]:
        value = self.last_backlog
        return [] if value is None else [Observation(value, self._attributes)]

    def held(self, rows: int) -> None:
        """Record the latest count of held rows (reported at the next collection)."""
        with self._lock:
            self._held = rows

    def _observe_held(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            value = self._held
        return [] if value is None else [Observation(value, self._attributes)]
