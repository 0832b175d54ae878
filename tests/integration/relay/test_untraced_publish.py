"""A relay without an exporter (`recoveryctl run`'s default: the no-op tracer provider)
starts no publish span, yet every record carries exactly the trace headers a no-op
publish span would have given it: the row's own context, as the propagator re-encodes
it, malformed ones dropped, none when the row has none."""

from __future__ import annotations

import pytest
from opentelemetry import propagate
from opentelemetry.trace import NoOpTracerProvider, get_current_span

from ledger import PostgresLedger
from producers.relay import OutboxRelay
from schemas import TRACEPARENT, TRACESTATE, TopicNames
from tests.integration.relay.outbox import Row, command_row, insert_rows, read_all

pytestmark = pytest.mark.integration

_CARRIERS: dict[str, dict[str, str]] = {
    "op-canonical": {TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    "op-state": {
        TRACEPARENT: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        TRACESTATE: "vendor=a1, other=b2",
    },
    "op-upper": {TRACEPARENT: "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"},
    "op-malformed": {TRACEPARENT: "not-a-traceparent"},
    "op-none": {},
}


def _span_headers(carrier: dict[str, str]) -> dict[str, str]:
    """The trace headers a record published inside a no-op publish span gets."""
    parent = propagate.extract(dict(carrier)) if carrier else None
    tracer = NoOpTracerProvider().get_tracer("expected")
    with tracer.start_as_current_span("publish", context=parent):
        headers: dict[str, str] = {}
        propagate.inject(headers)
    return headers


def test_an_untraced_relay_gives_each_record_the_headers_a_no_op_span_would(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    rows = []
    for op, carrier in _CARRIERS.items():
        row = command_row(relay_topics, op, 1)
        rows.append(Row(row.record_id, row.topic, row.key, {**row.headers, **carrier}, row.payload))
    insert_rows(database_url, rows)
    relay = OutboxRelay(
        ledger, kafka_bootstrap, topics=relay_topics, tracer_provider=NoOpTracerProvider()
    )

    assert relay.relay_once().published == len(rows)

    seen = {s.key: s for s in read_all(kafka_bootstrap, [relay_topics.commands], len(rows))}
    for op, carrier in _CARRIERS.items():
        published = {k: v for k, v in seen[op].headers.items() if k in (TRACEPARENT, TRACESTATE)}
        assert published == _span_headers(carrier), op
    assert seen["op-canonical"].headers[TRACEPARENT] == _CARRIERS["op-canonical"][TRACEPARENT]
    assert TRACEPARENT not in seen["op-none"].headers
    assert not get_current_span().get_span_context().is_valid  # every context detached
