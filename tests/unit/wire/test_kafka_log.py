"""librdkafka's lines as logging records: the logger per component, the level mapping
confluent-kafka applies, and librdkafka's own retries demoted to INFO."""

from __future__ import annotations

import logging

import pytest

from schemas import librdkafka_logger

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
    bridge = librdkafka_logger("client")
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        bridge.log(logging.WARNING, _FORMAT, "GETPID", "rdkafka#producer-1", text)
        bridge.log(logging.WARNING, _FORMAT, "MAXPOLL", "rdkafka#consumer-1", "poll too late")
    assert [(r.levelno, r.getMessage().split()[0]) for r in caplog.records] == [
        (logging.INFO, "GETPID"),
        (logging.WARNING, "MAXPOLL"),
    ]
