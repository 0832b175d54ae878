"""The secured broker's own defences, tried as an attacker with any Kafka client would:
no anonymous or plaintext client, no wrong password, and each principal limited to its
ACLs (`producers.acl_bindings`) on a deployment's topics. Every test provisions the ACLs
for topics of its own, as `recoveryctl topics create` does, on the real secured broker.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from ops.cli import main
from producers import (
    DEFAULT_GROUP_PREFIXES,
    VERDICT_GROUP_PREFIX,
    CapabilityWorker,
    EventPublisher,
    ExecutionStore,
    ProducersError,
    RecoveryClient,
    acl_bindings,
    provision_acls,
)
from schemas import ENV_KAFKA_CONFIG_FILE, KafkaSecurity, TopicNames, kafka_config
from tests.support.commands import worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import signers
from tests.support.services import SecuredBroker

pytestmark = pytest.mark.integration

_DENIED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}


@pytest.fixture
def deployment(
    secured_kafka: SecuredBroker, request: pytest.FixtureRequest
) -> Iterator[TopicNames]:
    """Topics of this test's own on the secured broker, with the ACLs provisioned."""
    admin = secured_kafka.security.client("admin")
    factory = TopicFactory(secured_kafka.bootstrap, request.node.name, admin)
    names = TopicNames(**{stream: factory() for stream in TopicNames.model_fields})
    report = provision_acls(secured_kafka.bootstrap, names, security=admin)
    assert report.enabled
    yield names
    factory.delete_all()


def _as(broker: SecuredBroker, component: str) -> KafkaSecurity:
    return broker.security.client(component)


def _group(component: str) -> str:
    return f"{DEFAULT_GROUP_PREFIXES[component]}-{uuid.uuid4().hex[:8]}"


def _produce(broker: SecuredBroker, who: KafkaSecurity, topic: str) -> KafkaError | None:
    """Produce one record as `who`; the delivery error, or None when delivered."""
    producer = Producer(
        {**kafka_config(broker.bootstrap, who), "message.timeout.ms": 15_000, "log_level": 0}
    )
    outcome: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, _message: Message[Any, Any]) -> None:
        outcome.append(error)

    producer.produce(topic, key=b"op-1", value=b"forged", on_delivery=delivered)
    producer.flush(20)
    assert outcome, "no delivery report within 20 s"
    return outcome[0]


def _read(
    broker: SecuredBroker, who: KafkaSecurity, topic: str, group: str, expected: int = 1
) -> tuple[list[bytes], KafkaError | None]:
    """Read `topic` from the start as `who` in `group` (subscribe, commit): the values
    read and the first error met."""
    consumer = Consumer(
        {
            **kafka_config(broker.bootstrap, who),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and len(values) < expected:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() in _DENIED:
                    return values, error
                continue
            values.append(message.value() or b"")
        if values:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values, None


def _fetch(broker: SecuredBroker, who: KafkaSecurity, topic: str) -> KafkaError | None:
    """Fetch partition 0 of `topic` from the start as `who`, without a group's offsets:
    the topic authorization error, or None when records (or the end) came back."""
    consumer = Consumer(
        {
            **kafka_config(broker.bootstrap, who),
            "group.id": "unused",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                return None
            if error.code() in _DENIED:
                return error
    finally:
        consumer.close()
    return None


def _commit(broker: SecuredBroker, who: KafkaSecurity, topic: str, group: str) -> KafkaError | None:
    """Commit offset 0 of `topic` partition 0 for `group` as `who` (an OffsetCommit, as
    a consumer's commit sends it, through the AdminClient)."""
    admin = AdminClient({**kafka_config(broker.bootstrap, who), "log_level": 0})
    offsets = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 0)])
    try:
        admin.alter_consumer_group_offsets([offsets])[group].result(timeout=15)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def _code(error: KafkaError | None) -> int | None:
    return None if error is None else error.code()


def test_anonymous_plaintext_client_is_refused(secured_kafka: SecuredBroker) -> None:
    admin = AdminClient(
        {
            **kafka_config(secured_kafka.bootstrap, KafkaSecurity(protocol="PLAINTEXT")),
            "log_level": 0,
        }
    )
    with pytest.raises(KafkaException, match=r"transport|TIMED_OUT|timed out"):
        admin.list_topics(timeout=5)


def test_a_tls_client_without_sasl_credentials_is_refused(secured_kafka: SecuredBroker) -> None:
    tls_only = KafkaSecurity(protocol="SSL", ssl_ca_location=str(secured_kafka.security.ca_path))
    admin = AdminClient({**kafka_config(secured_kafka.bootstrap, tls_only), "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)


def test_a_wrong_password_is_refused(secured_kafka: SecuredBroker) -> None:
    wrong = _as(secured_kafka, "tool").as_principal("tool", "not-the-password")
    errors: list[KafkaError] = []
    admin = AdminClient(
        {**kafka_config(secured_kafka.bootstrap, wrong), "log_level": 0, "error_cb": errors.append}
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        admin.poll(0.5)  # serves error_cb
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert "SASL authentication error" in str(errors[0]), errors


def test_the_right_password_is_accepted(secured_kafka: SecuredBroker) -> None:
    admin = AdminClient(kafka_config(secured_kafka.bootstrap, _as(secured_kafka, "tool")))
    assert admin.list_topics(timeout=10).brokers


def test_tool_writes_events_but_cannot_read_commands_or_write_commands_or_audit(
    secured_kafka: SecuredBroker, deployment: TopicNames
) -> None:
    tool = _as(secured_kafka, "tool")
    assert _produce(secured_kafka, tool, deployment.events) is None
    assert _code(_produce(secured_kafka, tool, deployment.commands)) in _DENIED
    assert _code(_produce(secured_kafka, tool, deployment.audit)) in _DENIED
    assert _code(_fetch(secured_kafka, tool, deployment.commands)) in _DENIED
    assert _code(_fetch(secured_kafka, tool, deployment.events)) in _DENIED
    # It reads the controller's verdicts on the audit topic, in a verdict reader's
    # group only (producers.verdicts), and no other group.
    assert _produce(secured_kafka, _as(secured_kafka, "relay"), deployment.audit) is None
    group = f"{VERDICT_GROUP_PREFIX}-{uuid.uuid4().hex[:8]}"
    assert _read(secured_kafka, tool, deployment.audit, group) == ([b"forged"], None)
    _, error = _read(secured_kafka, tool, deployment.audit, _group("siem"))
    assert _code(error) in _DENIED


def test_a_worker_in_a_group_its_principal_may_not_use_stops_saying_so(
    secured_kafka: SecuredBroker, deployment: TopicNames, tmp_path: Path
) -> None:
    # Issue #31: the worker guide's group `coupa-workers` was refused by the ACLs and
    # the worker stayed up doing nothing.
    worker_security = _as(secured_kafka, "worker")
    with EventPublisher(
        secured_kafka.bootstrap, signer=signers(), topics=deployment, security=worker_security
    ) as publisher:
        worker = CapabilityWorker(
            secured_kafka.bootstrap,
            "coupa-workers",
            RecoveryClient(publisher, "worker-x"),
            {},
            topics=deployment,
            security=worker_security,
            roster=worker_roster(),
            store=ExecutionStore(tmp_path / "store.sqlite"),
            poll_timeout=0.2,
        )
        stop = threading.Event()
        timer = threading.Timer(45, stop.set)  # a bound, should the refusal never come
        timer.start()
        try:
            with pytest.raises(ProducersError, match=r"groups named recovery-worker\*"):
                worker.run(stop)
        finally:
            timer.cancel()
    assert not stop.is_set(), "the worker ran on for 45 s in a group it may not use"


def test_worker_reads_commands_in_its_group_but_cannot_commit_the_controllers_offsets(
    secured_kafka: SecuredBroker, deployment: TopicNames
) -> None:
    assert _produce(secured_kafka, _as(secured_kafka, "relay"), deployment.commands) is None
    worker = _as(secured_kafka, "worker")
    values, error = _read(secured_kafka, worker, deployment.commands, _group("worker"))
    assert (values, error) == ([b"forged"], None)
    assert _produce(secured_kafka, worker, deployment.events) is None

    controller_group = _group("controller")
    assert _code(_commit(secured_kafka, worker, deployment.events, controller_group)) in _DENIED
    # ... nor join it, nor read the controller's topic in a group of its own.
    _, joined = _read(secured_kafka, worker, deployment.commands, controller_group)
    assert _code(joined) in _DENIED
    assert _code(_fetch(secured_kafka, worker, deployment.events)) in _DENIED
    # The controller itself may.
    controller = _as(secured_kafka, "controller")
    assert _commit(secured_kafka, controller, deployment.events, controller_group) is None


def test_siem_reads_audit_and_nothing_else(
    secured_kafka: SecuredBroker, deployment: TopicNames
) -> None:
    assert _produce(secured_kafka, _as(secured_kafka, "relay"), deployment.audit) is None
    siem = _as(secured_kafka, "siem")
    values, error = _read(secured_kafka, siem, deployment.audit, _group("siem"))
    assert (values, error) == ([b"forged"], None)
    for topic in (deployment.events, deployment.commands, deployment.dlq, deployment.evidence):
        assert _code(_fetch(secured_kafka, siem, topic)) in _DENIED, topic
    for topic in deployment.all():
        assert _code(_produce(secured_kafka, siem, topic)) in _DENIED, topic
    _, error = _read(secured_kafka, siem, deployment.audit, _group("worker"))
    assert _code(error) in _DENIED


def test_relay_writes_every_topic_it_publishes_and_reads_none(
    secured_kafka: SecuredBroker, deployment: TopicNames
) -> None:
    relay = _as(secured_kafka, "relay")
    for topic in deployment.all():
        assert _produce(secured_kafka, relay, topic) is None, topic
    assert _code(_fetch(secured_kafka, relay, deployment.commands)) in _DENIED


def test_controller_reads_events_in_its_group_and_cannot_write_commands(
    secured_kafka: SecuredBroker, deployment: TopicNames
) -> None:
    assert _produce(secured_kafka, _as(secured_kafka, "tool"), deployment.events) is None
    controller = _as(secured_kafka, "controller")
    values, error = _read(secured_kafka, controller, deployment.events, _group("controller"))
    assert (values, error) == ([b"forged"], None)
    assert _code(_produce(secured_kafka, controller, deployment.commands)) in _DENIED


def test_no_component_can_administer_topics_or_rewind_a_worker_group(
    secured_kafka: SecuredBroker, deployment: TopicNames
) -> None:
    worker_group = _group("worker")
    worker = _as(secured_kafka, "worker")
    assert _commit(secured_kafka, worker, deployment.commands, worker_group) is None
    for component in ("tool", "controller", "relay", "siem"):
        admin = AdminClient(
            {**kafka_config(secured_kafka.bootstrap, _as(secured_kafka, component)), "log_level": 0}
        )
        name = f"t-intruder-{uuid.uuid4().hex[:8]}"
        created = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
        with pytest.raises(KafkaException, match="AUTHORIZATION"):
            created[name].result(timeout=15)
        deleted = admin.delete_topics([deployment.commands], operation_timeout=15)
        with pytest.raises(KafkaException, match="AUTHORIZATION"):
            deleted[deployment.commands].result(timeout=15)
        # The attack: rewind the worker group so it re-executes old commands.
        rewind = ConsumerGroupTopicPartitions(
            worker_group, [TopicPartition(deployment.commands, 0, 0)]
        )
        altered = admin.alter_consumer_group_offsets([rewind])
        with pytest.raises(KafkaException, match="AUTHORIZATION"):
            altered[worker_group].result(timeout=15)


def test_acls_show_lists_the_provisioned_bindings(
    secured_kafka: SecuredBroker,
    deployment: TopicNames,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_KAFKA_CONFIG_FILE, str(secured_kafka.security.client_file("admin")))
    assert main(["acls", "show", "--bootstrap", secured_kafka.bootstrap, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["authorizer"] is True
    mine = {
        (row["principal"], row["operation"], row["resource"])
        for row in shown["acls"]
        if row["resource"] in deployment.all()
    }
    assert ("User:tool", "WRITE", deployment.events) in mine
    assert ("User:siem", "READ", deployment.audit) in mine
    assert ("User:worker", "READ", deployment.commands) in mine
    assert not {row for row in mine if row[0] == "User:siem" and row[2] != deployment.audit}

    assert main(["acls", "show", "--bootstrap", secured_kafka.bootstrap]) == 0
    table = capsys.readouterr().out
    assert "PRINCIPAL" in table
    rows = [line.split() for line in table.splitlines()]
    assert ["User:tool", "ALLOW", "WRITE", "TOPIC", deployment.events, "LITERAL"] in rows
    # The relay reads each topic's message size limit, and may do nothing else with it.
    assert [
        "User:relay",
        "ALLOW",
        "DESCRIBE_CONFIGS",
        "TOPIC",
        deployment.events,
        "LITERAL",
    ] in rows


def test_topics_create_provisions_the_acls_for_the_configured_topic_names(
    secured_kafka: SecuredBroker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    suffix = uuid.uuid4().hex[:8]
    names = TopicNames(**{s: f"t-acl-{s}-{suffix}" for s in TopicNames.model_fields})
    for stream in TopicNames.model_fields:
        monkeypatch.setenv(f"RECOVERY_TOPIC_{stream.upper()}", getattr(names, stream))
    monkeypatch.setenv(ENV_KAFKA_CONFIG_FILE, str(secured_kafka.security.client_file("admin")))
    try:
        assert main(["topics", "create", "--bootstrap", secured_kafka.bootstrap]) == 0
        bindings = len(acl_bindings(names))
        assert f"ACLs: {bindings} bindings in place" in capsys.readouterr().out
        tool = _as(secured_kafka, "tool")
        assert _produce(secured_kafka, tool, names.events) is None
        assert _code(_produce(secured_kafka, tool, names.commands)) in _DENIED
    finally:
        admin = AdminClient(kafka_config(secured_kafka.bootstrap, _as(secured_kafka, "admin")))
        for future in admin.delete_topics(list(names.all()), operation_timeout=30).values():
            future.result(timeout=30)
