"""Configuration helpers of the local stack: ports, folders, the broker's config, the
jar cache marker and the state file, checked without starting any service."""

from __future__ import annotations

import base64
import os
import socket
import string
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from ops.kafka import ClusterSeat, jars_cached, new_cluster_id, render_server_properties
from ops.kafka_security import ensure_broker_security
from ops.paths import cache_dir, ensure_dir, others_can_traverse, stack_dir
from ops.ports import LOOPBACK, free_ports, is_port_free
from ops.settings import ENV_CACHE_DIR, ENV_STACK_DIR, KAFKA_VERSION
from ops.stack import KafkaState, PostgresState, StackState
from tests.support.db import with_database


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {key.strip(): value.strip() for key, value in pairs}


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(is_port_free(port) for port in ports)


def test_a_port_someone_listens_on_is_not_free() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen()
        assert not is_port_free(listener.getsockname()[1])


def test_free_ports_rejects_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="count >= 1"):
        free_ports(0)


def test_ensure_dir_makes_parents_traversable_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        made = ensure_dir(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(previous)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert folder.stat().st_mode & 0o777 == 0o755


def test_a_folder_under_a_private_parent_is_not_traversable_by_others(tmp_path: Path) -> None:
    private = ensure_dir(tmp_path / "private", mode=0o700)
    assert not others_can_traverse(private / "inner")
    assert others_can_traverse(Path("/usr/lib"))


def test_stack_dir_and_cache_dir_follow_their_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_STACK_DIR, str(tmp_path / "stack"))
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "cache"))
    assert stack_dir() == tmp_path / "stack"
    assert cache_dir() == tmp_path / "cache"


def test_root_running_from_a_private_checkout_keeps_state_where_postgres_can_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_STACK_DIR, raising=False)
    checkout = ensure_dir(tmp_path / "private", mode=0o700) / "repo"
    chosen = stack_dir(checkout)
    if os.geteuid() == 0:
        assert chosen.parent == Path("/var/tmp")
        assert chosen != stack_dir(tmp_path / "private" / "other-repo")
    else:
        assert chosen == checkout / ".stack"


def test_secured_server_properties_take_sasl_ssl_clients_and_allow_only_acls(
    tmp_path: Path,
) -> None:
    security = ensure_broker_security(tmp_path, environ={})
    props = _properties(render_server_properties(40001, 40002, tmp_path / "logs", security))
    assert props["listeners"] == f"CLIENT://{LOOPBACK}:40001,CONTROLLER://{LOOPBACK}:40002"
    assert props["advertised.listeners"] == f"CLIENT://{LOOPBACK}:40001"
    assert props["listener.security.protocol.map"] == "CLIENT:SASL_SSL,CONTROLLER:SSL"
    assert props["inter.broker.listener.name"] == "CLIENT"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["ssl.keystore.type"] == props["ssl.truststore.type"] == "PEM"
    assert props["ssl.keystore.location"] == str(security.keystore_path)
    assert props["ssl.principal.mapping.rules"] == "RULE:^CN=([^,]+)$/$1/,DEFAULT"
    assert props["authorizer.class.name"].endswith(".StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin;User:broker"
    jaas = props["listener.name.client.scram-sha-512.sasl.jaas.config"]
    assert f'username="broker" password="{security.passwords["broker"]}";' in jaas
    assert "PLAINTEXT" not in props["listener.security.protocol.map"]


def test_broker_security_material_is_private_kept_and_per_principal(tmp_path: Path) -> None:
    first = ensure_broker_security(tmp_path, environ={"RECOVERY_KAFKA_PASSWORD_SIEM": "s3cret"})
    assert set(first.passwords) == {
        "admin",
        "broker",
        "controller",
        "relay",
        "tool",
        "worker",
        "siem",
        "bench",
    }
    assert first.passwords["siem"] == "s3cret"
    assert len(set(first.passwords.values())) == len(first.passwords)
    for private in (
        tmp_path / "sasl-users.json",
        tmp_path / "tls" / "broker.pem",
        tmp_path / "tls" / "ca-key.pem",
        first.client_file("worker"),
    ):
        assert private.stat().st_mode & 0o777 == 0o600, private
    assert "broker" not in first.client_files()
    worker = first.client("worker").client_config()
    assert worker == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "worker",
        "sasl.password": first.passwords["worker"],
        "ssl.ca.location": str(first.ca_path),
    }
    assert _properties(first.client_file("worker").read_text()) == worker
    assert "s3cret" not in repr(first)
    ca = first.ca_path.read_bytes()
    again = ensure_broker_security(tmp_path, environ={})
    assert again.passwords == first.passwords  # kept, not regenerated
    assert again.ca_path.read_bytes() == ca


def test_server_properties_are_a_single_node_kraft_quorum_on_loopback(tmp_path: Path) -> None:
    props = _properties(render_server_properties(40001, 40002, tmp_path / "logs"))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == f"1@{LOOPBACK}:40002"
    assert props["listeners"] == f"PLAINTEXT://{LOOPBACK}:40001,CONTROLLER://{LOOPBACK}:40002"
    assert props["advertised.listeners"] == f"PLAINTEXT://{LOOPBACK}:40001"
    assert props["log.dirs"] == str(tmp_path / "logs")
    for key in (
        "offsets.topic.replication.factor",
        "offsets.topic.num.partitions",
        "transaction.state.log.replication.factor",
        "transaction.state.log.num.partitions",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert int(props["log.cleaner.dedupe.buffer.size"]) <= 32 * 1024 * 1024


def test_cluster_ids_look_like_kafka_uuids() -> None:
    ids = {new_cluster_id() for _ in range(300)}
    assert len(ids) == 300
    alphabet = set(string.ascii_letters + string.digits + "-_")
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert set(cluster_id) <= alphabet
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_jar_cache_counts_only_a_completed_download(tmp_path: Path) -> None:
    home = ensure_dir(tmp_path / f"kafka-{KAFKA_VERSION}" / "libs").parent
    (home / "libs" / "kafka_2.13.jar").write_bytes(b"jar")
    assert not jars_cached(KAFKA_VERSION, tmp_path)  # no marker: a half download
    (home / "COMPLETE").write_text("kafka_2.13.jar\nkafka-clients.jar\n")
    assert not jars_cached(KAFKA_VERSION, tmp_path)  # a listed jar is missing
    (home / "libs" / "kafka-clients.jar").write_bytes(b"jar")
    assert jars_cached(KAFKA_VERSION, tmp_path)


def test_state_file_round_trips_and_rejects_unknown_fields() -> None:
    state = StackState(
        kafka=KafkaState(bootstrap="127.0.0.1:1", external=False, pid=10, data_dir="/d"),
        postgres=PostgresState(url="postgresql://postgres@127.0.0.1:2/recovery", external=True),
        stack_dir="/s",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        startup_seconds=4.2,
    )
    assert StackState.model_validate_json(state.model_dump_json()) == state
    with pytest.raises(ValidationError, match="extra"):
        KafkaState.model_validate({"bootstrap": "x:1", "external": True, "port": 3})


def test_per_test_database_urls_keep_the_form_they_were_given() -> None:
    url = "postgresql://postgres@127.0.0.1:5432/postgres?sslmode=disable"
    assert with_database(url, "t_one") == (
        "postgresql://postgres@127.0.0.1:5432/t_one?sslmode=disable"
    )
    keywords = with_database("host=127.0.0.1 port=5432 user=postgres dbname=postgres", "t_two")
    assert "dbname=t_two" in keywords
    assert "host=127.0.0.1" in keywords


def test_a_cluster_node_replicates_everything_three_times_and_needs_two_in_sync(
    tmp_path: Path,
) -> None:
    security = ensure_broker_security(tmp_path, environ={})
    voters = f"1@{LOOPBACK}:40002,2@{LOOPBACK}:40012,3@{LOOPBACK}:40022"
    text = render_server_properties(
        40011, 40012, tmp_path / "logs", security, ClusterSeat(2, voters, 3)
    )
    props = _properties(text)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == voters
    assert props["listeners"] == f"CLIENT://{LOOPBACK}:40011,CONTROLLER://{LOOPBACK}:40012"
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert props[key] == "3", key
    for key in (
        "min.insync.replicas",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "2", key
    assert props["unclean.leader.election.enable"] == "false"
    assert int(props["broker.session.timeout.ms"]) < 9000  # fenced sooner than the default
    keys = [line.split("=", 1)[0] for line in text.splitlines() if line and line[0] != "#"]
    assert len(keys) == len(set(keys))  # no file of the three sets a key another sets


def test_a_single_broker_needs_only_itself_in_sync(tmp_path: Path) -> None:
    props = _properties(render_server_properties(40001, 40002, tmp_path / "logs"))
    assert props["node.id"] == "1"
    assert props["default.replication.factor"] == props["min.insync.replicas"] == "1"
    assert "broker.session.timeout.ms" not in props
