"""Tracing: W3C trace context from Kafka headers, a span per batch and per decision, and
the decision's context injected into the commands it emits.

Both spans follow OpenTelemetry's messaging semantic conventions for Kafka (semconv
1.27 and later): kind CONSUMER, named `process <topic>` (`process recovery.events`),
with `messaging.system=kafka`, `messaging.operation.type=process`,
`messaging.destination.name`, `messaging.consumer.group.name` and `messaging.client.id`;
the batch span adds `messaging.batch.message_count`, the decision span the record's
`messaging.destination.partition.id`, `messaging.kafka.offset` and
`messaging.kafka.message.key`. The `recovery.*` attributes are this project's own.

A decision span's parent is the context the producing tool put in the record's headers
(`traceparent`, `tracestate`), so one trace runs from the tool through the controller to
the capability worker that receives the command; the span also links to its batch span,
which is where retries, fencing and commit time show. Attributes name the operation, the
machine, the event and the states before and after (no payloads: those belong in the
ledger, not in a tracing backend). With the no-op provider (exporter `none`) no decision
span is made at all; the commands still carry the producer's trace context.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from consumer.batch import Observer
from consumer.intake import Accepted, RawRecord
from machines import Decision
from schemas import TRACEPARENT, TRACESTATE

__all__ = ["BatchTracer", "extract_context", "producer_trace_headers", "trace_headers"]

_PROPAGATOR: Final = TraceContextTextMapPropagator()
_NAME: Final = "consumer"


def _text_headers(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers:
        if value is None:
            continue
        try:
            out[key] = value.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a hostile header is ignored, never fatal
    return out


def extract_context(record: RawRecord) -> Context:
    """The W3C trace context the producer put in the record's headers (an empty context
    when there is none or it is malformed)."""
    return _PROPAGATOR.extract(_text_headers(record.headers))


def producer_trace_headers(record: RawRecord) -> dict[str, str]:
    """The trace headers a non-recording span parented by `record`'s producer context
    carries: the producer's `traceparent` (and `tracestate`) as the W3C propagator
    re-encodes them, or none when they are absent or malformed."""
    traceparent: str | None = None
    for key, value in record.headers:
        if key == TRACESTATE and value is not None:
            return _reencoded(record)
        if key == TRACEPARENT and value is not None:
            try:
                traceparent = value.decode("utf-8")
            except UnicodeDecodeError:
                continue  # as `_text_headers`: an undecodable value is skipped
    if traceparent is None:
        return {}
    # A traceparent already in canonical form (version 00, lowercase hex, nothing
    # around it) with non-zero ids comes back from extract-then-inject unchanged, so
    # it is passed on as it is; anything else (other versions, whitespace, a
    # tracestate to normalise, zero ids, invalid text) goes through the propagator,
    # whose extract/inject round trip would otherwise be most of this shortcut's cost.
    match = _CANONICAL_TRACEPARENT.fullmatch(traceparent)
    if match is None or match.group(1) == _ZERO_TRACE or match.group(2) == _ZERO_SPAN:
        return _reencoded(record)
    return {TRACEPARENT: traceparent}


_CANONICAL_TRACEPARENT: Final = re.compile("00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16


def _reencoded(record: RawRecord) -> dict[str, str]:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=extract_context(record))
    return carrier


def trace_headers(span: Span) -> dict[str, str]:
    """`traceparent` (and `tracestate`) of `span`, for an emitted record's headers."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


class BatchTracer:
    """Creates the controller's spans with the tracer of one provider."""

    def __init__(
        self, provider: trace.TracerProvider, *, group: str | None = None, client: str | None = None
    ) -> None:
        self._tracer = provider.get_tracer(_NAME)
        # Attributes every span of this consumer carries.
        self._common: dict[str, AttributeValue] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
        }
        if group is not None:
            self._common["messaging.consumer.group.name"] = group
        if client is not None:
            self._common["messaging.client.id"] = client

    @contextmanager
    def batch(self, records: int, partitions: Sequence[tuple[str, int]]) -> Iterator[Span]:
        """The span of one batch attempt; an exception marks it failed and propagates."""
        attributes: dict[str, AttributeValue] = {
            **self._common,
            "messaging.batch.message_count": records,
            "recovery.partitions": [f"{t}[{p}]" for t, p in partitions],
        }
        topics = sorted({topic for topic, _ in partitions})
        # The convention's name is `{operation} {destination}`, the operation alone when
        # a batch spans several destinations.
        name = "process"
        if len(topics) == 1:
            name = f"process {topics[0]}"
            attributes["messaging.destination.name"] = topics[0]
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            yield span

    def observer(self, batch_span: Span, latency: Callable[[float], None]) -> Observer:
        """An `Observer` for `consumer.batch.decide_batch`: one span per decision,
        parented by the producer's context and linked to `batch_span`; `latency` gets
        each decision's duration in seconds. Without an exporter (the no-op provider)
        no span is made: the commands carry the producer's context, as they would
        through the no-op tracer's spans."""
        if isinstance(self._tracer, trace.NoOpTracer):
            return _untraced(latency)
        link = Link(batch_span.get_span_context())

        def observe(
            item: Accepted, run: Callable[[], Decision]
        ) -> tuple[Decision, Mapping[str, str]]:
            event, record = item.event, item.record
            with self._tracer.start_as_current_span(
                f"process {record.topic}",
                context=extract_context(record),
                kind=SpanKind.CONSUMER,
                links=[link],
                attributes={
                    **self._common,
                    **_record_attributes(record),
                    "recovery.operation_id": event.operation_id,
                    "recovery.correlation_id": event.correlation_id,
                    "recovery.event_id": event.event_id,
                    "recovery.event_type": event.event_type,
                    "recovery.machine": f"{item.machine.name}@{item.machine.version}",
                    "recovery.record": record.coordinates,
                },
            ) as span:
                started = time.perf_counter()
                decision = run()
                latency(time.perf_counter() - started)
                span.set_attribute("recovery.state_before", decision.state_before)
                span.set_attribute("recovery.state_after", decision.state_after)
                span.set_attribute("recovery.outcome", str(decision.outcome))
                span.set_attribute("recovery.sequence", decision.sequence)
                if decision.errors:
                    span.set_status(Status(StatusCode.ERROR, decision.errors[0].code))
                return decision, trace_headers(span)

        return observe


def _record_attributes(record: RawRecord) -> dict[str, AttributeValue]:
    """The semantic-convention attributes of one consumed record."""
    attributes: dict[str, AttributeValue] = {
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
    }
    if record.key is not None:
        # The convention sets the key as a string; a key that is not UTF-8 is left out
        # rather than mangled (the controller's keys are operation ids).
        try:
            attributes["messaging.kafka.message.key"] = record.key.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return attributes


def _untraced(latency: Callable[[float], None]) -> Observer:
    # The no-op tracer's decision span is the producer's own span context wrapped as a
    # non-recording span, so its trace headers are the producer's, re-encoded by the
    # propagator (malformed ones dropped). Producing them directly skips starting,
    # attaching, annotating and ending a span that nobody exports, a large share of
    # the CPU a decision takes (the commit that kept this path has the numbers). Unit
    # tests hold both paths to the same headers (tests/unit/consumer/test_trace_headers.py).
    def observe(item: Accepted, run: Callable[[], Decision]) -> tuple[Decision, Mapping[str, str]]:
        started = time.perf_counter()
        decision = run()
        latency(time.perf_counter() - started)
        return decision, producer_trace_headers(item.record)

    return observe
