"""compose.yaml agrees with the project's settings: service names, published ports,
images and the environment variables the runtime reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from consumer import ENV_METRICS_ADDRESS
from ledger import LOGIN_ROLES
from ops.cli import build_parser
from ops.kafka_security import COMPOSE_KAFKA_CLIENTS, write_compose_material
from ops.paths import repo_root
from ops.settings import (
    COMPOSE_KAFKA_PORT,
    COMPOSE_POSTGRES_PORT,
    COMPOSE_SERVICES,
    DATABASE_NAME,
    DATABASE_USER,
    KAFKA_VERSION,
    POSTGRES_MAJOR,
    RUNTIME_ROLES,
    DatabasePasswordSettings,
)
from schemas import (
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SSL_CA_LOCATION,
    KAFKA_PRINCIPALS,
)


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    document = yaml.safe_load(Path(repo_root(), "compose.yaml").read_text())
    assert isinstance(document, dict)
    found = document["services"]
    assert isinstance(found, dict)
    return found


def _host_ports(service: dict[str, Any]) -> set[int]:
    # "127.0.0.1:9092:9092" -> the host port is the second to last field.
    return {int(str(mapping).split(":")[-2]) for mapping in service.get("ports", [])}


def test_compose_defines_exactly_the_project_services(services: dict[str, Any]) -> None:
    assert set(services) == set(COMPOSE_SERVICES)


def test_kafka_is_kraft_at_the_locally_assembled_version(services: dict[str, Any]) -> None:
    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert _host_ports(kafka) == {COMPOSE_KAFKA_PORT}
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "healthcheck" in kafka


def test_kafka_is_secured_like_the_local_broker(services: dict[str, Any]) -> None:
    env = services["kafka"]["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols == {"INTERNAL": "SASL_SSL", "HOST": "SASL_SSL", "CONTROLLER": "SSL"}
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_LISTENER_NAME_CONTROLLER_SSL_CLIENT_AUTH"] == "required"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith(".StandardAuthorizer")
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert env["KAFKA_SUPER_USERS"] == "User:admin;User:broker"
    # Every principal gets its SCRAM user when the storage is formatted, read from the
    # mounted scram-users file (test_compose_env_writes_...), as is the broker's login.
    command = services["kafka"]["command"][-1]
    assert "--add-scram" in command
    assert "/etc/kafka/secrets/scram-users" in command
    assert "KAFKA_LISTENER_NAME_INTERNAL_SCRAM___SHA___512_SASL_JAAS_CONFIG" in command
    assert "PLAINTEXT" not in str(services["kafka"])


def test_no_kafka_password_is_in_any_environment(services: dict[str, Any]) -> None:
    text = Path(repo_root(), "compose.yaml").read_text()
    assert "RECOVERY_KAFKA_PASSWORD_" not in text
    for name, service in services.items():
        environment = service.get("environment", {})
        assert ENV_KAFKA_SASL_PASSWORD not in environment, name
        assert not any("password=" in str(v).lower() for v in environment.values()), name
        if ENV_KAFKA_SASL_USERNAME in environment:
            component = environment[ENV_KAFKA_SASL_USERNAME]
            assert COMPOSE_KAFKA_CLIENTS[name] == component
            secret = f"kafka-{component}"
            assert environment[ENV_KAFKA_SASL_PASSWORD_FILE] == f"/run/secrets/{secret}"
            assert secret in service["secrets"], name


def test_compose_env_writes_each_client_its_own_password_file(tmp_path: Path) -> None:
    env_file = write_compose_material(tmp_path, {"RECOVERY_DB_PASSWORD_OWNER": "x"})
    assert "RECOVERY_KAFKA_PASSWORD" not in env_file.read_text()
    users = dict(
        line.split("=", 1) for line in (tmp_path / "kafka" / "scram-users").read_text().split()
    )
    assert set(users) == set(KAFKA_PRINCIPALS.values())
    document = yaml.safe_load(Path(repo_root(), "compose.yaml").read_text())
    for component in set(COMPOSE_KAFKA_CLIENTS.values()):
        secret = document["secrets"][f"kafka-{component}"]["file"]
        path = tmp_path / Path(secret).relative_to(".stack/compose")
        assert path.read_text().strip() == users[KAFKA_PRINCIPALS[component]]
        assert path.stat().st_mode & 0o777 == 0o600


def test_provision_creates_topics_and_acls_as_admin_before_the_runtime(
    services: dict[str, Any],
) -> None:
    provision = services["provision"]
    assert provision["command"] == ["recoveryctl", "topics", "create"]
    build_parser().parse_args(provision["command"][1:])
    assert provision["environment"][ENV_KAFKA_SASL_USERNAME] == "admin"
    for role in RUNTIME_ROLES:
        needs = services[role]["depends_on"]["provision"]
        assert needs == {"condition": "service_completed_successfully"}


def test_postgres_publishes_the_default_port_with_the_project_database(
    services: dict[str, Any],
) -> None:
    postgres = services["postgres"]
    assert postgres["image"] == f"postgres:{POSTGRES_MAJOR}"
    assert _host_ports(postgres) == {COMPOSE_POSTGRES_PORT}
    assert postgres["environment"]["POSTGRES_USER"] == DATABASE_USER
    assert postgres["environment"]["POSTGRES_DB"] == DATABASE_NAME
    assert "healthcheck" in postgres


_FAILOVER = ("RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS", "RECOVERY_CONTROLLER_HEARTBEAT_INTERVAL_MS")


def test_the_controller_session_is_one_the_broker_accepts(services: dict[str, Any]) -> None:
    # Fast failover (docs/controller.md, "Failover"): a short session the broker's minimum
    # allows, heartbeats well inside it.
    session, heartbeat = (int(services["controller"]["environment"][v]) for v in _FAILOVER)
    broker = services["kafka"]["environment"]
    assert int(broker["KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS"]) <= session <= 2000
    assert heartbeat * 3 <= session


@pytest.mark.parametrize("role", RUNTIME_ROLES)
def test_runtime_services_read_the_project_env_vars_and_reach_the_services(
    services: dict[str, Any], role: str
) -> None:
    service = services[role]
    command = service["command"]
    assert command[:4] == ["recoveryctl", "run", "--role", role]
    # Only flags `recoveryctl run` accepts; the schema is prepared (the topics and ACLs
    # by `provision`, as admin: the role itself may not create topics).
    # (the ledger migrated by `ledger-roles`: the runtime roles may not alter the schema).
    args = build_parser().parse_args(command[1:])
    assert not args.migrate
    assert not args.create_topics
    assert not args.demo, "compose must not run the controller in demo mode"
    environment = service["environment"]
    signing = {ENV_CONTROLLER_SIGNING_KEY_FILE, *_FAILOVER} if role == "controller" else set()
    assert set(environment) == signing | {
        ENV_KAFKA_BOOTSTRAP,
        ENV_DATABASE_URL,
        ENV_METRICS_ADDRESS,
        ENV_KAFKA_SECURITY_PROTOCOL,
        ENV_KAFKA_SASL_MECHANISM,
        ENV_KAFKA_SASL_USERNAME,
        ENV_KAFKA_SASL_PASSWORD_FILE,
        ENV_KAFKA_SSL_CA_LOCATION,
    }
    assert environment[ENV_KAFKA_SECURITY_PROTOCOL] == "SASL_SSL"
    assert environment[ENV_KAFKA_SASL_USERNAME] == KAFKA_PRINCIPALS[role]

    kafka_host, kafka_port = environment[ENV_KAFKA_BOOTSTRAP].split(":")
    assert kafka_host == "kafka"
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"//kafka:{kafka_port}" in advertised

    url = urlsplit(environment[ENV_DATABASE_URL])
    # Never the superuser: its own least-privileged login (docs/ledger.md, "Roles").
    assert (url.hostname, url.port, url.username) == ("postgres", 5432, f"recovery_{role}")
    assert url.path == f"/{DATABASE_NAME}"
    assert set(service["depends_on"]) == {"provision", "ledger-roles"}


def test_ledger_roles_runs_once_as_the_superuser_before_the_runtime(
    services: dict[str, Any],
) -> None:
    service = services["ledger-roles"]
    args = build_parser().parse_args(service["command"][1:])
    assert (args.subcommand, args.db_action, args.no_passwords) == ("db", "roles", False)
    url = urlsplit(service["environment"][ENV_DATABASE_URL])
    assert (url.hostname, url.username, url.path) == (
        "postgres",
        DATABASE_USER,
        f"/{DATABASE_NAME}",
    )
    assert url.password is None  # the password file holds it
    # Every login role gets its password: nothing on the compose server is trusted.
    prefix = str(DatabasePasswordSettings.model_config.get("env_prefix"))
    assert {f"{prefix}{c.upper()}" for c in LOGIN_ROLES} <= set(service["environment"])
    assert service["restart"] == "no"


def test_the_database_trusts_no_connection(services: dict[str, Any]) -> None:
    postgres = services["postgres"]["environment"]
    assert "POSTGRES_HOST_AUTH_METHOD" not in postgres
    assert "POSTGRES_PASSWORD" not in postgres  # a file, never the environment
    assert postgres["POSTGRES_PASSWORD_FILE"].startswith("/run/secrets/")
    assert postgres["POSTGRES_INITDB_ARGS"].split() == [
        "--auth-local=scram-sha-256",
        "--auth-host=scram-sha-256",
    ]
    for name in ("ledger-roles", *RUNTIME_ROLES):
        url = urlsplit(services[name]["environment"][ENV_DATABASE_URL])
        assert url.password is None
        assert url.query == "passfile=/run/secrets/ledger-pgpass", name
        assert "ledger-pgpass" in services[name]["secrets"]


@pytest.mark.parametrize("role", RUNTIME_ROLES)
def test_runtime_services_build_the_runtime_image_and_stop_gracefully(
    services: dict[str, Any], role: str
) -> None:
    service = services[role]
    assert service["build"] == {"context": ".", "dockerfile": "ops/Dockerfile"}
    assert service["image"] == services[RUNTIME_ROLES[0]]["image"]
    assert service["restart"] == "unless-stopped"
    assert int(str(service["stop_grace_period"]).rstrip("s")) >= 30


def test_the_runtime_image_ships_every_package_and_runs_recoveryctl() -> None:
    root = Path(repo_root())
    dockerfile = (root / "ops" / "Dockerfile").read_text()
    for package in ("consumer", "ledger", "machines", "ops", "producers", "schemas"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert "constraints.txt" in dockerfile
    assert "USER recovery" in dockerfile
    assert 'CMD ["recoveryctl", "run"' in dockerfile


def test_the_controller_runs_under_a_mounted_policy_file(services: dict[str, Any]) -> None:
    service = services["controller"]
    args = build_parser().parse_args(service["command"][1:])
    assert args.policy, "the controller refuses to start without --policy"
    # source:target:ro, where the source itself holds a ":-"
    mounts = {str(v).rsplit(":", 2)[1]: str(v).rsplit(":", 2)[0] for v in service["volumes"]}
    assert args.policy in mounts, f"--policy {args.policy} is not a mounted file"
    # ${RECOVERY_POLICY_FILE:-default}: the default is the shipped template.
    source = mounts[args.policy]
    assert source.startswith("${RECOVERY_POLICY_FILE:-")
    assert source.endswith("}")
    default = source.removeprefix("${RECOVERY_POLICY_FILE:-").removesuffix("}")
    assert Path(repo_root(), default).resolve() == Path(repo_root(), "ops/policy.production.yaml")


@pytest.mark.parametrize("role", RUNTIME_ROLES)
def test_runtime_services_are_health_checked_on_their_metrics_port(
    services: dict[str, Any], role: str
) -> None:
    service = services[role]
    port = int(service["environment"][ENV_METRICS_ADDRESS].rsplit(":", 1)[1])
    probe = " ".join(service["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/healthz" in probe
    assert _host_ports(service) == {port}
