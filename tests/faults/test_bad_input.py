"""Bad input: a realistic stream mixed with more than 200 malformed or hostile records is
fully processed; each bad record is on the dead-letter topic with its reason and
coordinates and has an audit record; every good record is decided."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.faults.hostile import (
    MAX_RECORD_BYTES,
    Hostile,
    Landed,
    Outgoing,
    RecordingProducer,
    matches,
)
from tests.faults.processes import FaultError
from tests.faults.stream import FaultRun, drain, workload
from tests.faults.verify import audit_chains_verify, dead_letter_reasons, progress
from tests.support.kafka import TopicFactory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROUNDS = 15  # each round: one record of every hostile kind


def _say(message: str) -> None:
    print(f"[bad-input {time.strftime('%X')}] {message}", flush=True)


def _merge(a: list[Outgoing], b: list[Outgoing], rng: random.Random) -> list[Outgoing]:
    """`a` and `b` interleaved at random, each keeping its own order (an operation's
    records stay in order)."""
    slots = [0] * len(a) + [1] * len(b)
    rng.shuffle(slots)
    sources = (iter(a), iter(b))
    return [next(sources[s]) for s in slots]


@pytest.mark.timeout(180)
def test_a_stream_with_hundreds_of_hostile_records_dead_letters_each_and_decides_the_rest(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    rng = random.Random(31)
    run = FaultRun(
        kafka_bootstrap,
        database_url,
        topic_factory,
        tmp_path,
        extra_env={"RECOVERY_CONTROLLER_MAX_RECORD_BYTES": str(MAX_RECORD_BYTES)},
    )
    hostile = Hostile(f"hostile-{run.group}", seed=31)
    records, _ = workload(1_500, seed=31, bad_rate=0.0)
    stream = [
        Outgoing(r.kind, r.key.encode(), r.value, r.content_type,
                 "forged-signature" if r.kind == "forged" else None, producer=r.producer)
        for r in records
    ]  # fmt: skip
    bad: list[Outgoing] = []
    used: list[tuple[str, str]] = []
    for _ in range(ROUNDS):
        bad.extend(hostile.intake_refusals())
        first, pairs = hostile.first_uses()
        bad.extend(first)
        used.extend(pairs)
    phase1 = _merge(stream, bad, rng)
    phase2 = [record for pair in used for record in hostile.reuses(pair)]
    producer = RecordingProducer(kafka_bootstrap, run.topics.events)
    try:
        controller, relay = run.start("controller"), run.start("relay")
        controller.wait_assigned(60)
        for record in phase1:
            producer.send(record)
        producer.flush()
        _say(f"phase 1: {len(phase1):,} records produced")
        # Reuse needs the first use decided: otherwise the good one could be refused.
        drain(run, len(phase1), [controller, relay], 90, _say)
        for record in phase2:
            producer.send(record)
        producer.flush()
        total = len(phase1) + len(phase2)
        _say(f"phase 2: {len(phase2)} records reusing ids and nonces; {total:,} in all")
        drain(run, total, [controller, relay], 90, _say)
        _say(str(progress(database_url, run.group, run.topics.events)))
        controller.terminate()
        relay.terminate()
    finally:
        run.close()
    _check(run, producer.landed)


def _check(run: FaultRun, landed: list[Landed]) -> None:
    topic = run.topics.events
    letters = dead_letter_reasons(run.bootstrap, run.topics)
    with psycopg.connect(run.database_url, autocommit=True) as conn:
        decided = {
            (int(p), int(o))
            for p, o in conn.execute("SELECT source_partition, source_offset FROM events")
        }
        decided_ids = {str(e) for (e,) in conn.execute("SELECT event_id FROM decisions")}
        audited = {
            str(c): str(r)
            for c, r in conn.execute(
                "SELECT record->>'coordinates', record->>'reason_code' FROM audit_records "
                "WHERE kind = 'dead-letter'"
            )
        }
    problems: list[str] = []
    kinds: Counter[str] = Counter()
    for item in landed:
        record, where = item.record, item.coordinates(topic)
        if record.reason is None:
            if where in letters:
                problems.append(
                    f"good {record.kind} record {where} dead-lettered: {letters[where]}"
                )
            elif record.kind != "duplicate" and (item.partition, item.offset) not in decided:
                if record.event_id is None or record.event_id not in decided_ids:
                    problems.append(f"good {record.kind} record {where} was not decided")
            continue
        kinds[record.kind] += 1
        reason = letters.get(where)
        if reason is None or not matches(reason, record.reason):
            problems.append(
                f"{record.kind} record {where}: dead letter {reason!r}, expected {record.reason}"
            )
        if audited.get(where) != reason:
            problems.append(f"{record.kind} record {where}: audit record {audited.get(where)!r}")
    if problems:
        raise FaultError(f"{len(problems)} problems; first:\n" + "\n".join(problems[:10]))
    bad = sum(kinds.values())
    assert bad >= 200, kinds
    assert len(letters) == bad, f"{len(letters)} dead letters for {bad} bad records"
    audit_chains_verify(run.database_url)
    reasons = Counter(letters.values())
    _say(f"{bad} bad records dead-lettered with reason and audit record: {dict(kinds)}")
    _say(f"reasons: {dict(reasons)}")
    _say(f"{len(landed) - bad:,} good records decided; audit chains verify")
