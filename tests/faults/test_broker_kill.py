"""Broker kill on a real three-node cluster: the node that coordinates the controller's
consumer group (and leads some of the run's partitions) is SIGKILLed mid-stream, the
stream goes on on the other two, and the node is restarted on its own data; afterwards
nothing acknowledged is lost, nothing is decided twice and every command is published.

The cluster is the test's own (`tests.support.services.lease_kafka_cluster`): three
KRaft nodes, secured like the session's broker, every topic with three replicas and
`min.insync.replicas` 2, so the feeder's and the relay's `acks=all` writes survive one
node's loss (docs/faults.md, "Broker kill").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from schemas import HEADER_RECORD_ID, kafka_config
from tests.faults.processes import wait_until
from tests.faults.stream import FaultRun, Feeder, drain, workload
from tests.faults.verify import progress, read_topic, verify_run
from tests.support.kafka import TopicFactory
from tests.support.services import LeasedCluster, lease_kafka_cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EVENTS = 5_000
RATE = 250.0  # records/s: about 20 s of input, the kill in the middle of it
DOWN_SECONDS = 8.0  # long enough for the node to be fenced and the stream to move on


def _say(message: str) -> None:
    print(f"[broker-kill {time.strftime('%X')}] {message}", flush=True)


@pytest.fixture
def cluster() -> Iterator[LeasedCluster]:
    """A secured three-node cluster of this test's own, removed afterwards."""
    started = time.monotonic()
    leased = lease_kafka_cluster()
    _say(f"cluster {leased.bootstrap} ready in {time.monotonic() - started:.1f} s")
    try:
        yield leased
    finally:
        leased.release()


def _coordinator_and_leaders(
    bootstrap: str, group: str, topics: list[str]
) -> tuple[int, dict[int, list[str]]]:
    """The id of the node coordinating `group`, and node id -> the partitions of
    `topics` it leads."""
    admin = AdminClient(kafka_config(bootstrap))
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    metadata = admin.list_topics(timeout=30)
    leads: dict[int, list[str]] = {}
    for topic in topics:
        for p, partition in metadata.topics[topic].partitions.items():
            leads.setdefault(partition.leader, []).append(f"{topic[-10:]}/{p}")
    return int(description.coordinator.id), leads


def _fully_replicated(bootstrap: str, topics: list[str], nodes: int) -> bool:
    """Whether every partition of `topics` has all `nodes` replicas in sync again."""
    metadata = AdminClient(kafka_config(bootstrap)).list_topics(timeout=30)
    return all(
        len(partition.isrs) == nodes
        for topic in topics
        for partition in metadata.topics[topic].partitions.values()
    )


@pytest.mark.timeout(360)
def test_a_killed_broker_loses_and_repeats_nothing(
    cluster: LeasedCluster, database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    records, stats = workload(EVENTS, seed=17)
    _say(
        f"workload: {stats.records:,} records, {stats.operations:,} operations, "
        f"{stats.commands:,} commands expected, {stats.dead_letters} dead letters expected"
    )
    admin = cluster.cluster.admin
    topics = TopicFactory(cluster.bootstrap, request.node.name, admin, replication=3)
    run = FaultRun(cluster.bootstrap, database_url, topics, tmp_path, partitions=4)
    names = [getattr(run.topics, s) for s in ("events", "commands", "evidence", "audit", "dlq")]
    try:
        controller, relay = run.start("controller"), run.start("relay")
        controller.wait_assigned(90)
        feeder = Feeder(run, records, RATE, _say).start()
        time.sleep(6)
        victim, leads = _coordinator_and_leaders(cluster.bootstrap, run.group, names)
        before = progress(database_url, run.group, run.topics.events)
        _say(
            f"kill -9 node {victim} (group coordinator; leads {leads.get(victim, [])}); "
            f"{feeder.sent:,} produced; {before}"
        )
        cluster.kill(victim)
        time.sleep(DOWN_SECONDS)
        run.check_alive(controller, relay)
        during = progress(database_url, run.group, run.topics.events)
        _say(f"node {victim} down {DOWN_SECONDS:.0f} s; {feeder.sent:,} produced; {during}")
        assert during.consumed > before.consumed, "nothing was decided on the two live nodes"
        started = time.monotonic()
        cluster.restart(victim)
        _say(f"node {victim} restarted in {time.monotonic() - started:.1f} s")
        produced = feeder.join(120)
        drain(run, produced, [controller, relay], 150, _say)
        wait_until(
            lambda: _fully_replicated(cluster.bootstrap, names, 3),
            60,
            f"node {victim} back in sync on every partition",
        )
        for process in (controller, relay):
            status = process.terminate()
            assert status == 0, f"{process} exited {status} after the broker kill"

        # Nothing the feeder had acknowledged is missing from the input, nor doubled.
        input_records = read_topic(cluster.bootstrap, names[0])
        on_topic = Counter(r.header(HEADER_RECORD_ID) for r in input_records)
        assert on_topic == Counter(r.record_id for r in records)
        report = verify_run(cluster.bootstrap, database_url, run.topics)
    finally:
        run.close()
        topics.delete_all()
    _say(f"input: {sum(on_topic.values()):,} records on the events topic; {report}")
    assert report.outputs.rows.get("dlq", 0) == stats.dead_letters, report.outputs.rows
    assert report.outputs.rows.get("commands", 0) == stats.commands, report.outputs.rows
