"""`consumer.tracing.producer_trace_headers` passes a canonical `traceparent` through
without the propagator's round trip; these tests hold it to what a decision span of the
no-op tracer hands the commands, for well-formed, odd and hostile headers alike."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace

from consumer import extract_context, trace_headers
from consumer.tracing import producer_trace_headers
from tests.unit.consumer.support import record

Headers = tuple[tuple[str, bytes | None], ...]

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


def _reference(headers: Headers) -> dict[str, str]:
    """The headers a no-op decision span parented by the record's context gives."""
    tracer = trace.NoOpTracerProvider().get_tracer("reference")
    context = extract_context(record(b"x", 0, headers=headers))
    with tracer.start_as_current_span("recovery.decide", context=context) as span:
        return trace_headers(span)


def _headers(*pairs: tuple[str, str | bytes | None]) -> Headers:
    return tuple((k, v.encode() if isinstance(v, str) else v) for k, v in pairs)


CASES: dict[str, Headers] = {
    "no trace headers": _headers(("content-type", "application/json")),
    "canonical sampled": _headers(("traceparent", f"00-{TRACE}-{SPAN}-01")),
    "canonical not sampled": _headers(("traceparent", f"00-{TRACE}-{SPAN}-00")),
    "canonical with tracestate": _headers(
        ("traceparent", f"00-{TRACE}-{SPAN}-01"), ("tracestate", "vendor=abc, other=1")
    ),
    "tracestate before traceparent": _headers(
        ("tracestate", "vendor=abc"), ("traceparent", f"00-{TRACE}-{SPAN}-01")
    ),
    "invalid tracestate": _headers(("traceparent", f"00-{TRACE}-{SPAN}-01"), ("tracestate", "=")),
    "tracestate alone": _headers(("tracestate", "vendor=abc")),
    "zero trace id": _headers(("traceparent", f"00-{'0' * 32}-{SPAN}-01")),
    "zero span id": _headers(("traceparent", f"00-{TRACE}-{'0' * 16}-01")),
    "uppercase hex": _headers(("traceparent", f"00-{TRACE.upper()}-{SPAN}-01")),
    "future version with suffix": _headers(("traceparent", f"01-{TRACE}-{SPAN}-01-extra")),
    "version 00 with suffix": _headers(("traceparent", f"00-{TRACE}-{SPAN}-01-extra")),
    "version ff": _headers(("traceparent", f"ff-{TRACE}-{SPAN}-01")),
    "surrounding whitespace": _headers(("traceparent", f" \t00-{TRACE}-{SPAN}-01 ")),
    "trailing newline": _headers(("traceparent", f"00-{TRACE}-{SPAN}-01\n")),
    "too long": _headers(("traceparent", f"00-{TRACE}-{SPAN}-01" + " " * 600)),
    "empty": _headers(("traceparent", "")),
    "garbage": _headers(("traceparent", "garbage")),
    "not utf-8": _headers(("traceparent", b"\xff\xfe")),
    "later value wins": _headers(
        ("traceparent", f"00-{'1' * 32}-{SPAN}-01"), ("traceparent", f"00-{TRACE}-{SPAN}-01")
    ),
    "undecodable later value is skipped": _headers(
        ("traceparent", f"00-{TRACE}-{SPAN}-01"), ("traceparent", b"\xff")
    ),
    "null value": _headers(("traceparent", None)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trace_headers_for_commands_match_a_no_op_decision_span(name: str) -> None:
    headers = CASES[name]
    assert producer_trace_headers(record(b"x", 0, headers=headers)) == _reference(headers)


def test_a_canonical_traceparent_is_passed_on_unchanged() -> None:
    headers = CASES["canonical sampled"]
    assert producer_trace_headers(record(b"x", 0, headers=headers)) == {
        "traceparent": f"00-{TRACE}-{SPAN}-01"
    }


_HEX = "0123456789abcdefABCDEF"
_traceparents = st.one_of(
    st.builds(
        lambda v, t, s, f, tail: f"{v}-{t}-{s}-{f}{tail}",
        st.sampled_from(["00", "01", "ff", "0g", "0"]),
        st.text(_HEX, min_size=31, max_size=33),
        st.text(_HEX, min_size=15, max_size=17),
        st.text(_HEX, min_size=1, max_size=3),
        st.sampled_from(["", " ", "\n", "-x", "\t", "-"]),
    ),
    st.text(max_size=80),
)


@settings(max_examples=400, deadline=None)
@given(
    traceparents=st.lists(_traceparents, max_size=2),
    tracestate=st.one_of(st.none(), st.text(max_size=40)),
)
def test_any_traceparent_gives_what_a_no_op_decision_span_gives(
    traceparents: list[str], tracestate: str | None
) -> None:
    pairs: list[tuple[str, str | bytes | None]] = [("traceparent", t) for t in traceparents]
    if tracestate is not None:
        pairs.append(("tracestate", tracestate))
    headers = _headers(*pairs)
    assert producer_trace_headers(record(b"x", 0, headers=headers)) == _reference(headers)
