"""The local broker's TLS material, SASL/SCRAM principals and per-component client files.

A secured local broker (the default; `recoveryctl stack up --plaintext` is the
exception) keeps under its data folder:

- `tls/ca.pem` (the stack's own CA certificate, which clients trust through
  `ssl.ca.location`) and `tls/ca-key.pem`; `tls/broker.pem` (the broker's private key,
  PKCS#8, followed by its certificate for 127.0.0.1 and localhost, signed by that CA;
  Kafka reads it as a PEM keystore). Keys are 0600. The broker's certificate, subject
  `CN=broker`, also authenticates the broker to its own KRaft controller listener (mTLS).
- `sasl-users.json` (0600): principal -> password for every entry of
  `schemas.KAFKA_PRINCIPALS`, each from `RECOVERY_KAFKA_PASSWORD_<COMPONENT>` when set,
  else kept from the file, else generated (as `ops.db_passwords` does for PostgreSQL).
  They become SCRAM-SHA-512 credentials when the storage is formatted.
- `clients/<component>.properties` (0600): a librdkafka properties file per principal
  (protocol, mechanism, user, password, CA), what `RECOVERY_KAFKA_CONFIG_FILE` names;
  beside it `clients/<component>.java.properties` (0600), the same principal for Java
  clients (the JAAS login and a PEM truststore), what Kafka's own tools take as
  `--command-config` (`recoveryctl kafka-tool`, `java_client_file`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ops.db_passwords import resolve_passwords, store_passwords
from ops.paths import ensure_dir
from ops.settings import KafkaPasswordSettings
from schemas import KAFKA_PRINCIPALS, KafkaSecurity

__all__ = [
    "BROKER_PRINCIPAL",
    "COMPOSE_KAFKA_CLIENTS",
    "ENV_KAFKA_PASSWORD_PREFIX",
    "SCRAM_MECHANISM",
    "BrokerSecurity",
    "ensure_broker_security",
    "java_client_file",
    "java_properties",
    "write_compose_material",
    "write_java_client_files",
]

ENV_KAFKA_PASSWORD_PREFIX: Final = str(KafkaPasswordSettings.model_config.get("env_prefix"))
SCRAM_MECHANISM: Final = "SCRAM-SHA-512"
BROKER_PRINCIPAL: Final = KAFKA_PRINCIPALS["broker"]
_VALID_DAYS: Final = 825


@dataclass(frozen=True, slots=True)
class BrokerSecurity:
    """Where a secured broker's material is, and each principal's password."""

    ca_path: Path
    keystore_path: Path
    passwords: Mapping[str, str] = field(repr=False)
    clients_dir: Path

    def client(self, component: str) -> KafkaSecurity:
        """The client settings of `component`'s principal (`schemas.KAFKA_PRINCIPALS`)."""
        user = KAFKA_PRINCIPALS[component]
        return KafkaSecurity(
            protocol="SASL_SSL",
            sasl_mechanism=SCRAM_MECHANISM,
            sasl_username=user,
            sasl_password=self.passwords[user],  # type: ignore[arg-type]
            ssl_ca_location=str(self.ca_path),
        )

    def client_file(self, component: str) -> Path:
        """`clients/<component>.properties`, for `RECOVERY_KAFKA_CONFIG_FILE`."""
        return self.clients_dir / f"{component}.properties"

    def client_files(self) -> dict[str, str]:
        """Component -> its client properties file, for every component but the broker."""
        return {
            component: str(self.client_file(component))
            for component in KAFKA_PRINCIPALS
            if component != "broker"
        }


def ensure_broker_security(
    data_dir: Path, environ: Mapping[str, str] | None = None
) -> BrokerSecurity:
    """The TLS material, passwords and client files of the broker in `data_dir`,
    created on first use and kept afterwards (see the module docstring)."""
    tls = ensure_dir(data_dir / "tls", 0o700)
    ca_path, keystore = tls / "ca.pem", tls / "broker.pem"
    if not (ca_path.is_file() and keystore.is_file() and (tls / "ca-key.pem").is_file()):
        _write_tls(tls)
    password_file = data_dir / "sasl-users.json"
    users = {component: user for component, user in KAFKA_PRINCIPALS.items()}
    passwords = resolve_passwords(
        users, password_file, KafkaPasswordSettings.load(environ).chosen()
    )
    store_passwords(password_file, passwords)
    security = BrokerSecurity(ca_path, keystore, passwords, ensure_dir(data_dir / "clients", 0o700))
    for component in security.client_files():
        client = security.client(component)
        _write_private(security.client_file(component), _properties(client))
        _write_private(java_client_file(security.client_file(component)), java_properties(client))
    return security


def write_java_client_files(client_files: Mapping[str, str]) -> None:
    """The Java client file beside each librdkafka client file of a recorded stack,
    written again from it (for a stack started before they existed)."""
    for path in client_files.values():
        client = KafkaSecurity.from_file(Path(path))
        _write_private(java_client_file(path), java_properties(client))


def java_client_file(librdkafka_file: Path | str) -> Path:
    """The Java client file beside a principal's librdkafka file: `admin.properties` ->
    `admin.java.properties`."""
    path = Path(librdkafka_file)
    return path.with_name(f"{path.stem}.java.properties")


def java_properties(client: KafkaSecurity) -> str:
    """`client` (SASL/SCRAM over TLS) as a Java client's properties: what `kafka-*` tools
    take with `--command-config`."""
    password = client.sasl_password.get_secret_value() if client.sasl_password else ""
    lines = [
        "# Java client settings of one principal (Kafka's tools: --command-config); "
        "written by the stack",
        f"security.protocol={client.effective_protocol}",
        f"sasl.mechanism={client.sasl_mechanism or SCRAM_MECHANISM}",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{client.sasl_username}" password="{password}";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={client.ssl_ca_location}",
    ]
    return "\n".join(lines) + "\n"


# Inside the compose containers (compose.yaml mounts `<dir>/kafka` there).
_COMPOSE_SECRETS: Final = Path("/etc/kafka/secrets")
_COMPOSE_IMAGE_UID: Final = 1000  # the apache/kafka image's `appuser`


# The runtime image's user (ops/Dockerfile), which reads its own password file.
_COMPOSE_RUNTIME_UID: Final = 10001
# The compose services that connect to Kafka as a principal of their own, and which
# principal: each gets `RECOVERY_KAFKA_SASL_PASSWORD_FILE` naming its secret.
COMPOSE_KAFKA_CLIENTS: Final = {"provision": "admin", "controller": "controller", "relay": "relay"}


def write_compose_material(directory: Path, extra_env: Mapping[str, str] | None = None) -> Path:
    """TLS material and passwords for `compose.yaml`, kept in `directory` (default
    `.stack/compose`): `kafka/` (mounted into the broker: `ca.pem`, `broker.pem`, the
    admin's `admin.properties` for its health check, paths as the container sees them,
    and `scram-users`, every principal's `name=password`, from which the broker's start
    formats its SCRAM users and takes its own), and `secrets/kafka-<component>.password`
    for each client service (0600, its own password only, read through
    `RECOVERY_KAFKA_SASL_PASSWORD_FILE`: no Kafka password is in any environment).
    `compose.env` (0600) holds `extra_env`, for `docker compose --env-file`. Returns the
    env file."""
    security = ensure_broker_security(ensure_dir(directory / "material", 0o700))
    mounted = ensure_dir(directory / "kafka", 0o755)
    (mounted / "ca.pem").write_text(security.ca_path.read_text())
    _write_private(mounted / "broker.pem", security.keystore_path.read_text())
    users = "".join(f"{user}={security.passwords[user]}\n" for user in KAFKA_PRINCIPALS.values())
    _write_private(mounted / "scram-users", users)
    secrets = ensure_dir(directory / "secrets", 0o700)
    for component in sorted(set(COMPOSE_KAFKA_CLIENTS.values())):
        path = secrets / f"kafka-{component}.password"
        _write_private(path, security.passwords[KAFKA_PRINCIPALS[component]] + "\n")
        if os.geteuid() == 0:
            os.chown(path, _COMPOSE_RUNTIME_UID, _COMPOSE_RUNTIME_UID)
    # Java client settings (the image's kafka-broker-api-versions.sh reads them).
    admin = security.client("admin").model_copy(
        update={"ssl_ca_location": str(_COMPOSE_SECRETS / "ca.pem")}
    )
    _write_private(mounted / "admin.properties", java_properties(admin))
    if os.geteuid() == 0:  # the broker container reads them as its own user
        for name in ("broker.pem", "admin.properties", "scram-users"):
            os.chown(mounted / name, _COMPOSE_IMAGE_UID, _COMPOSE_IMAGE_UID)
    env_file = directory / "compose.env"
    lines = [f"{name}={value}" for name, value in sorted((extra_env or {}).items())]
    _write_private(env_file, "\n".join(lines) + "\n")
    return env_file


def _properties(client: KafkaSecurity) -> str:
    lines = [
        "# librdkafka client settings (RECOVERY_KAFKA_CONFIG_FILE); written by the stack",
        *(f"{key}={value}" for key, value in client.client_config().items()),
    ]
    return "\n".join(lines) + "\n"


def _write_tls(tls: Path) -> None:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=_VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agent-recovery local CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BROKER_PRINCIPAL)]))
        .issuer_name(ca_name)
        .public_key(broker_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kafka"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()
    _write_private(tls / "ca-key.pem", ca_key.private_bytes(pem, pkcs8, plain).decode())
    _write_private(
        tls / "broker.pem",
        broker_key.private_bytes(pem, pkcs8, plain).decode()
        + broker.public_bytes(pem).decode()
        + ca.public_bytes(pem).decode(),
    )
    # Written last: its presence, with the two keys, marks the material complete.
    (tls / "ca.pem").write_text(ca.public_bytes(pem).decode())


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    path.chmod(0o600)
