"""librdkafka's lines as logging records: the logger per component, the level mapping
confluent-kafka applies, librdkafka's own retries demoted to INFO, and warnings and
errors rate-limited per kind with a summary of what was held back."""

from __future__ import annotations

import logging
import re

import pytest

from schemas import KafkaLog, librdkafka_logger

# What confluent-kafka calls: log(python_level, "%s [%s] %s", facility, name, text).
_FORMAT = "%s [%s] %s"


def test_a_line_becomes_a_record_of_the_components_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bridge = librdkafka_logger("relay")
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        bridge.log(logging.ERROR, _FORMAT, "FAIL", "relay-1#producer-1", "Connect failed")
    (record,) = caplog.records
    assert (record.name, record.levelno) == ("librdkafka.relay", logging.ERROR)
    assert record.getMessage() == "FAIL [relay-1#producer-1] Connect failed"


def test_a_warning_librdkafka_retries_itself_is_info(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        "Failed to acquire idempotence PID from broker localhost:9092/1: "
        "Broker: Coordinator load in progress: retrying"
    )
    # A component of its own: the rate limit is shared per component by the whole
    # process, and another test's client may have logged the same line within 30 s.
    bridge = librdkafka_logger("client-retrying-itself")
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        bridge.log(logging.WARNING, _FORMAT, "GETPID", "rdkafka#producer-1", text)
        bridge.log(logging.WARNING, _FORMAT, "MAXPOLL", "rdkafka#consumer-1", "poll too late")
    assert [(r.levelno, r.getMessage().split()[0]) for r in caplog.records] == [
        (logging.INFO, "GETPID"),
        (logging.WARNING, "MAXPOLL"),
    ]


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _connect_failed(port: int, suppressed: int) -> str:
    # librdkafka adds its own count to some repeats and not to others.
    detail = f", {suppressed} identical error(s) suppressed" if suppressed % 3 else ""
    return (
        f"sasl_ssl://127.0.0.1:{port}/bootstrap: Connect to ipv4#127.0.0.1:{port} failed: "
        f"Connection refused (after {suppressed % 7}ms in state CONNECT{detail})"
    )


def test_an_outage_logs_each_kind_of_error_once_per_window_with_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What a controller's consumer logs while its broker is down for 78 s: a connect
    # failure and an all-brokers-down line several times a second (1,504 lines before).
    clock = Clock()
    bridge = KafkaLog("outage-test", clock=clock)
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        for tick in range(780):  # every 0.1 s for 78 s
            clock.now = 1000.0 + tick / 10
            failed = _connect_failed(9092, tick)
            bridge.log(logging.ERROR, _FORMAT, "FAIL", "c-1#consumer-1", failed)
            bridge.log(logging.ERROR, _FORMAT, "ERROR", "c-1#consumer-1", "1/1 brokers are down")
        bridge.flush()
    lines = [r.getMessage() for r in caplog.records]
    # Per kind: the first line of each 30 s window (0, 30, 60 s) and one summary at the
    # end of each window (the flush names the last, cut-short one).
    assert len(lines) == 12, "\n".join(lines)
    summaries = [line for line in lines if "[summary]" in line]
    assert len(summaries) == 6
    held = sum(int(re.search(r"\] (\d+) more", s)[1]) for s in summaries)  # type: ignore[index]
    assert held == 2 * 780 - 6  # nothing is lost: every line is logged or counted
    assert all(r.levelno == logging.ERROR for r in caplog.records)
    assert "1/1 brokers are down" in summaries[-1] or "1/1 brokers are down" in summaries[-2]


def test_different_errors_and_other_components_are_not_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    relay, worker = KafkaLog("limit-a", clock=clock), KafkaLog("limit-b", clock=clock)
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        relay.log(logging.ERROR, _FORMAT, "FAIL", "r#p-1", "Connect failed")
        relay.log(logging.ERROR, _FORMAT, "FAIL", "r#p-1", "SSL handshake failed")
        relay.log(logging.WARNING, _FORMAT, "FAIL", "r#p-1", "Connect failed")
        worker.log(logging.ERROR, _FORMAT, "FAIL", "w#c-1", "Connect failed")
        relay.log(logging.INFO, _FORMAT, "STATE", "r#p-1", "Broker is up")
        relay.log(logging.INFO, _FORMAT, "STATE", "r#p-1", "Broker is up")
    assert len(caplog.records) == 6
