"""Crash quarantine: a record that kills the controller process at every start is found
and dead-lettered as `record-quarantined`, and everything else is decided.

The controller is the test build `tests.faults.killer` (the real controller, which
SIGKILLs itself when intake reaches the crafted record: an uncatchable death, like an
OOM kill or a segfault). Each time it dies the test starts a new one, as a supervisor
would. With the default threshold of three, the partition is decided one record at a
time after three starts died on the same offset, three more starts die on the poison
alone, and the next start quarantines it.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from consumer import ControllerSettings
from tests.faults.hostile import Outgoing, RecordingProducer
from tests.faults.killer import ENV_MARKER
from tests.faults.processes import FaultError, RoleProcess, log_tail, wait_until
from tests.faults.stream import FaultRun, drain, workload
from tests.faults.verify import dead_letter_reasons, progress, verify_run
from tests.support.kafka import TopicFactory
from tests.support.roles import role_argv

pytestmark = [pytest.mark.slow, pytest.mark.integration]

THRESHOLD = ControllerSettings.model_fields["quarantine_after_starts"].default
KILLER_ARGV = [role_argv("controller")[0], "-m", "tests.faults.killer"]


def _say(message: str) -> None:
    print(f"[quarantine {time.strftime('%X')}] {message}", flush=True)


@pytest.mark.timeout(300)
def test_a_record_that_kills_the_controller_at_every_start_is_quarantined(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path, partitions=2)
    marker = f"killer-{uuid.uuid4().hex}"
    records, _ = workload(400, seed=17, bad_rate=0.0)
    stream = [
        Outgoing(r.kind, r.key.encode(), r.value, r.content_type, producer=r.producer)
        for r in records
    ]
    # Not even an event: intake would refuse it, but the test build dies first.
    poison = Outgoing("poison", b"op-poison", f"poison {marker}".encode(), "application/json")
    stream.insert(len(stream) // 2, poison)
    producer = RecordingProducer(kafka_bootstrap, run.topics.events)
    for record in stream:
        producer.send(record)
    producer.flush()
    (where,) = [landed for landed in producer.landed if landed.record is poison]
    coordinates = where.coordinates(run.topics.events)
    _say(f"{len(stream)} records produced; the poison is {coordinates}")
    deaths = 0
    try:
        relay = run.start("relay")
        # Restarted as a supervisor restarts its unit: under the same static member id
        # (docs/operations.md), so each start takes the partitions back at once rather
        # than after the dead one's session expired.
        member = {ENV_MARKER: marker, "RECOVERY_CONTROLLER_GROUP_INSTANCE_ID": run.group}
        controller = run.start("controller", argv=KILLER_ARGV, env=member)
        while True:
            wait_until(
                lambda c=controller: not c.alive() or _consumed(run) >= len(stream),  # type: ignore[misc]
                120,
                "the controller to die on the poison or consume every record",
                detail=lambda c=controller: log_tail(c.log_path),  # type: ignore[misc]
            )
            if controller.alive():
                break
            if controller.exit_code() != -9:
                raise FaultError(
                    f"{controller} exited with {controller.exit_code()}, not SIGKILL:\n"
                    f"{log_tail(controller.log_path)}"
                )
            deaths += 1
            _say(f"death {deaths}: {progress(database_url, run.group, run.topics.events)}")
            if deaths > 2 * THRESHOLD + 3:
                raise FaultError(f"{deaths} starts died and the poison is still not quarantined")
            controller = run.start("controller", argv=KILLER_ARGV, env=member)
        drain(run, len(stream), [controller, relay], 90, _say)
        _check_logs(controller)
        controller.terminate()
        relay.terminate()
    finally:
        run.close()
    # Three starts died with it in their batch, three more on it alone: the next
    # quarantined it. A start whose first batch stopped short of it may add one more.
    assert 2 * THRESHOLD <= deaths <= 2 * THRESHOLD + 1, deaths
    letters = dead_letter_reasons(kafka_bootstrap, run.topics)
    # The poison alone: every other record (signed by its own producer) was decided.
    assert letters == {coordinates: "record-quarantined"}, letters
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT operation_id, record->>'reason' FROM audit_records "
            "WHERE kind = 'dead-letter' AND record->>'coordinates' = %s",
            (coordinates,),
        ).fetchall()
    (chain, reason), *more = rows
    assert not more
    assert chain == f"intake:{run.group}:{run.topics.events}[{where.partition}]"
    named = re.match(
        rf"record {re.escape(coordinates)}: (\d+) starts .* \((\d+) of them while handling",
        reason,
    )
    assert named is not None, reason
    assert 2 * THRESHOLD <= int(named.group(1)) <= deaths
    assert int(named.group(2)) == THRESHOLD
    _say(f"{deaths} deaths; audit reason: {reason[:120]}...")
    # Every other record was decided exactly once, outputs and chains as the replay says.
    report = verify_run(kafka_bootstrap, database_url, run.topics)
    _say(str(report))


def _consumed(run: FaultRun) -> int:
    return progress(run.database_url, run.group, run.topics.events).consumed


def _check_logs(controller: RoleProcess) -> None:
    text = controller.log_path.read_text(encoding="utf-8")
    if "quarantining " not in text:
        raise FaultError(
            f"{controller} never logged the quarantine:\n{log_tail(controller.log_path)}"
        )
