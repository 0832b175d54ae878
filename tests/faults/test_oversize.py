"""One record must never stop the outbox: every oversized shape a producer with nothing
but the `tool` password can put on the events topic (a megabyte of bytes, a megabyte
signature header, a huge key, a payload of 900 KB or 100 KB inside a signed envelope,
thousands of headers) is dead-lettered as a bounded record with its reason, and the
commands of the operations around them keep flowing. An outbox row too large for the
broker (an older controller wrote it) is held with its reason; the relay goes on."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, Message, Producer

from schemas import (
    CONTENT_TYPE,
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    HEADER_RECORD_ID,
    MAX_EVENT_RECORD_BYTES,
    AvroSingleObjectCodec,
    kafka_config,
)
from tests.faults.hostile import Hostile, Outgoing
from tests.faults.processes import FaultError, RoleProcess, log_tail
from tests.faults.stream import FaultRun
from tests.faults.verify import audit_chains_verify, dead_letter_reasons, read_topic
from tests.support.kafka import TopicFactory
from tests.support.producers import signer

pytestmark = [pytest.mark.slow, pytest.mark.integration]

_AVRO = AvroSingleObjectCodec()
# Larger than the controller's bound, within the broker's (1,048,588 per topic).
_MEGABYTE = 1_000_000
# A dead letter of an oversized record is an excerpt: far below the topic's limit.
_BOUNDED_DEAD_LETTER = 32 * 1024


class _Producer:
    """Produces records with whatever headers a hostile client chooses, noting where
    each landed; its own size limit is the broker's, not ours."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.landed: dict[str, str] = {}  # kind -> coordinates
        self.errors: list[str] = []
        self._producer = Producer(
            {**kafka_config(bootstrap), "acks": "all", "message.max.bytes": 1_048_000}
        )

    def send(
        self, kind: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes | None]]
    ) -> None:
        def delivered(error: KafkaError | None, message: Message[Any, Any]) -> None:
            if error is not None:
                self.errors.append(f"{kind}: {error}")
            else:
                self.landed[kind] = f"{self.topic}[{message.partition()}]@{message.offset()}"

        self._producer.produce(
            self.topic, key=key, value=value, headers=list(headers), on_delivery=delivered
        )
        self._producer.poll(0)

    def signed(self, record: Outgoing) -> None:
        plain: list[tuple[str, bytes | None]] = [
            (CONTENT_TYPE, record.content_type.encode()),
            (HEADER_RECORD_ID, f"fault:{uuid.uuid4().hex}".encode()),
        ]
        headers = signer(record.producer).sign(self.topic, record.key, record.value, plain)
        self.send(record.kind, record.key, record.value, headers)

    def flush(self) -> None:
        left = self._producer.flush(60)
        if left or self.errors:
            raise FaultError(f"{left} records undelivered; errors: {self.errors}")


def _hostile_records(hostile: Hostile, producer: _Producer) -> dict[str, str]:
    """Produce every oversized shape; returns kind -> the dead-letter reason it must get."""
    op = hostile.op
    big = hostile.event(op(), payload={"blob": "x" * 900_000})
    middling = hostile.event(op(), payload={"blob": "y" * 100_000})
    producer.signed(Hostile.good(big, "payload-900k"))
    producer.signed(Hostile.good(middling, "payload-100k"))
    # Unsigned: the attacker has the `tool` password, not a producer key.
    plain = [(CONTENT_TYPE, CONTENT_TYPE_AVRO.encode())]
    producer.send("unsigned-megabyte", op().encode(), b"\xc3\x01" + b"z" * _MEGABYTE, plain)
    producer.send(
        "signature-header",
        op().encode(),
        b"{}",
        [(CONTENT_TYPE, CONTENT_TYPE_JSON.encode()), ("recovery-signature", b"s" * 900_000)],
    )
    producer.send("huge-key", b"k" * 600_000, b"{}", [(CONTENT_TYPE, CONTENT_TYPE_JSON.encode())])
    many = [(f"h{i}", b"v" * 150) for i in range(3_000)]
    producer.send("many-headers", op().encode(), b"{}", many)
    return {
        "payload-900k": "wire-oversized",
        "payload-100k": "envelope-field-invalid",
        "unsigned-megabyte": "wire-oversized",
        "signature-header": "wire-oversized",
        "huge-key": "wire-oversized",
        "many-headers": "wire-oversized",
    }


def _plant_legacy_row(database_url: str, commands_topic: str) -> str:
    """An outbox row larger than any topic takes, as an older controller could write."""
    record_id = f"legacy-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (record_id, topic, key, headers, payload, value) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (
                record_id,
                commands_topic,
                "op-legacy",
                '{"content_type": "application/vnd.apache.avro.single-object"}',
                b"{}",
                b"\xc3\x01" + b"L" * 1_100_000,
            ),
        )
    return record_id


def _published(database_url: str, operations: list[str]) -> tuple[int, int]:
    """(rows of `operations` published, rows of theirs still unpublished)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE published_at IS NOT NULL), "
            "count(*) FILTER (WHERE published_at IS NULL) FROM outbox WHERE key = ANY(%s)",
            (operations,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _held(database_url: str, record_id: str) -> str | None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT held_reason FROM outbox WHERE record_id = %s", (record_id,)
        ).fetchone()
    return None if row is None else row[0]


@pytest.mark.timeout(240)
def test_no_oversized_record_stops_the_outbox_and_each_is_dead_lettered_bounded(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path)
    hostile = Hostile(f"oversize-{run.group}", seed=11)
    legacy = _plant_legacy_row(database_url, run.topics.commands)
    producer = _Producer(kafka_bootstrap, run.topics.events)
    try:
        controller, relay = run.start("controller"), run.start("relay")
        controller.wait_assigned(60)
        expected = _hostile_records(hostile, producer)
        good = [hostile.event(hostile.op()) for _ in range(6)]
        for event in good:
            producer.signed(Hostile.good(event))
        producer.flush()
        operations = [e.operation_id for e in good]
        deadline = time.monotonic() + 90
        while True:
            for process in (controller, relay):
                _alive(process)
            published, unpublished = _published(database_url, operations)
            if published >= len(good) * 2 and unpublished == 0:
                break  # every good operation's commands and audit went out
            if time.monotonic() > deadline:
                raise FaultError(f"{published} rows of the good operations published, "
                                 f"{unpublished} not, after 90 s")  # fmt: skip
            time.sleep(0.5)
        reason = _held(database_url, legacy)
        assert reason is not None, "the legacy oversized row was neither held nor skipped"
        assert "refused" in reason, reason
        _alive(relay)
        controller.terminate()
        relay.terminate()
    finally:
        run.close()
    letters = dead_letter_reasons(run.bootstrap, run.topics)
    for kind, code in expected.items():
        where = producer.landed[kind]
        assert letters.get(where) == code, (kind, where, letters.get(where))
    sizes = _dead_letter_sizes(run)
    for kind in ("unsigned-megabyte", "signature-header", "huge-key", "payload-900k"):
        assert sizes[producer.landed[kind]] < _BOUNDED_DEAD_LETTER, (kind, sizes)
    assert MAX_EVENT_RECORD_BYTES < _MEGABYTE
    audit_chains_verify(run.database_url)


def _alive(process: RoleProcess) -> None:
    if not process.alive():
        raise FaultError(
            f"{process} exited with status {process.exit_code()}:\n{log_tail(process.log_path)}"
        )


def _dead_letter_sizes(run: FaultRun) -> dict[str, int]:
    return {
        str(record.header("recovery-coordinates")): len(record.value or b"")
        + sum(len(v or b"") for _, v in record.headers)
        for record in read_topic(run.bootstrap, run.topics.dlq)
    }
