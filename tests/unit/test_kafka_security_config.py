"""The one Kafka client security convention (`schemas.KafkaSecurity`) and the
least-privilege ACLs (`producers.acl_bindings`), checked without a broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer import ControllerSettings, SettingsError
from consumer.controller import consumer_config
from producers import DEFAULT_GROUP_PREFIXES, VERDICT_GROUP_PREFIX, AclEntry, acl_bindings
from schemas import (
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SSL_CA_LOCATION,
    KafkaConfigError,
    KafkaSecurity,
    TopicNames,
    kafka_config,
)


def test_no_security_settings_mean_plaintext_and_add_nothing() -> None:
    security = KafkaSecurity.from_env({})
    assert security.effective_protocol == "PLAINTEXT"
    assert not security.secured
    assert kafka_config("b:1", security) == {"bootstrap.servers": "b:1"}


def test_a_sasl_user_defaults_to_sasl_ssl_with_scram_sha_512(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("pw-from-file\n")
    env = {
        ENV_KAFKA_SASL_USERNAME: "relay",
        ENV_KAFKA_SASL_PASSWORD_FILE: str(secret),
        ENV_KAFKA_SSL_CA_LOCATION: "/ca.pem",
    }
    assert kafka_config("b:1", KafkaSecurity.from_env(env)) == {
        "bootstrap.servers": "b:1",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "relay",
        "sasl.password": "pw-from-file",
        "ssl.ca.location": "/ca.pem",
    }


def test_the_variables_override_the_properties_file_which_may_add_anything(
    tmp_path: Path,
) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "# comment\n\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.username=tool\nsasl.password=from-file\nssl.ca.location=/a.pem\n"
        "ssl.endpoint.identification.algorithm=none\n"
    )
    env = {ENV_KAFKA_CONFIG_FILE: str(props), ENV_KAFKA_SASL_PASSWORD: "from-env"}
    config = KafkaSecurity.from_env(env).client_config()
    assert config["sasl.password"] == "from-env"
    assert config["sasl.mechanism"] == "SCRAM-SHA-256"
    assert config["sasl.username"] == "tool"
    assert config["ssl.endpoint.identification.algorithm"] == "none"


def test_a_sasl_protocol_without_credentials_is_refused_naming_the_variables() -> None:
    security = KafkaSecurity.from_env({ENV_KAFKA_SECURITY_PROTOCOL: "sasl_ssl"})
    with pytest.raises(KafkaConfigError, match=ENV_KAFKA_SASL_USERNAME):
        security.client_config()


def test_an_unknown_protocol_or_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KafkaConfigError, match="not one of"):
        KafkaSecurity.from_env({ENV_KAFKA_SECURITY_PROTOCOL: "TLS"})
    with pytest.raises(KafkaConfigError, match=ENV_KAFKA_CONFIG_FILE):
        KafkaSecurity.from_env({ENV_KAFKA_CONFIG_FILE: str(tmp_path / "missing")})
    broken = tmp_path / "broken.properties"
    broken.write_text("security.protocol\n")
    with pytest.raises(KafkaConfigError, match="line 1 is not key=value"):
        KafkaSecurity.from_env({ENV_KAFKA_CONFIG_FILE: str(broken)})


def test_the_password_never_shows_in_repr_or_describe() -> None:
    security = KafkaSecurity(sasl_username="tool", sasl_password="hunter2")  # type: ignore[arg-type]
    assert "hunter2" not in repr(security)
    assert security.describe() == "SASL_SSL as tool (SCRAM-SHA-512)"
    assert security.as_principal("siem", "x").sasl_username == "siem"


def test_the_controller_reads_its_kafka_security_from_the_environment() -> None:
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": "b:1",
        "RECOVERY_DATABASE_URL": "postgresql://x/y",
        ENV_KAFKA_SASL_USERNAME: "controller",
        ENV_KAFKA_SASL_PASSWORD: "pw",
    }
    config = consumer_config(ControllerSettings.from_env(env))
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.username"] == "controller"
    with pytest.raises(SettingsError, match=ENV_KAFKA_SECURITY_PROTOCOL):
        ControllerSettings.from_env({**env, ENV_KAFKA_SECURITY_PROTOCOL: "nope"})


def _entries(names: TopicNames) -> set[tuple[str, str, str, str, str]]:
    return {
        (e.principal, e.operation, e.resource_type, e.resource, e.pattern)
        for e in map(AclEntry.of, acl_bindings(names))
    }


def test_acls_grant_each_principal_only_its_topics_and_groups() -> None:
    names = TopicNames(events="e", commands="c", evidence="v", audit="a", dlq="d")
    entries = _entries(names)

    def of(user: str) -> set[tuple[str, str, str, str]]:
        return {tuple(rest) for principal, *rest in entries if principal == f"User:{user}"}  # type: ignore[misc]

    # Tools and workers read the controller's verdicts on what they publish from the
    # audit topic, in verdict readers' groups (producers.verdicts).
    verdicts = {
        ("READ", "TOPIC", "a", "LITERAL"),
        ("READ", "GROUP", VERDICT_GROUP_PREFIX, "PREFIXED"),
    }
    assert of("tool") == {("WRITE", "TOPIC", "e", "LITERAL"), *verdicts}
    assert of("worker") == {
        ("READ", "TOPIC", "c", "LITERAL"),
        ("WRITE", "TOPIC", "e", "LITERAL"),
        ("READ", "GROUP", "recovery-worker", "PREFIXED"),
        *verdicts,
    }
    assert of("controller") == {
        ("READ", "TOPIC", "e", "LITERAL"),
        ("READ", "GROUP", "recovery-controller", "PREFIXED"),
    }
    # The relay writes every topic it publishes to and reads each one's message size
    # limit (`check_message_limits`); nothing else.
    assert of("relay") == {
        (operation, "TOPIC", t, "LITERAL")
        for operation in ("WRITE", "DESCRIBE_CONFIGS")
        for t in ("c", "a", "d", "v", "e")
    }
    assert of("siem") == {
        ("READ", "TOPIC", "a", "LITERAL"),
        ("READ", "GROUP", "recovery-siem", "PREFIXED"),
    }
    assert of("admin") == set()  # a super user: needs no ACL
    assert all(e.permission == "ALLOW" for e in map(AclEntry.of, acl_bindings(names)))


def test_group_prefixes_are_disjoint_so_no_component_can_use_anothers_group() -> None:
    prefixes = [*DEFAULT_GROUP_PREFIXES.values(), VERDICT_GROUP_PREFIX]
    for one in prefixes:
        for other in prefixes:
            if one != other:
                assert not other.startswith(one), (one, other)


def test_acls_follow_the_topic_names_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECOVERY_TOPIC_EVENTS", "prod.events")
    assert ("User:tool", "WRITE", "TOPIC", "prod.events", "LITERAL") in _entries(
        TopicNames.from_env()
    )
