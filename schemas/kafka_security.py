"""How every Kafka client of a deployment authenticates: one convention, one parser.

Each client (the controller, the relay, the client library and its worker,
`recoveryctl`, the benchmark, the tests) builds its librdkafka configuration with
`kafka_config(bootstrap, security)`, where `security` is a `KafkaSecurity` resolved from
the settings (`schemas.KafkaClientSettings`) by `KafkaSecurity.from_env` unless the caller
passes one (a process that runs several components as threads gives each its own
principal):

- `RECOVERY_KAFKA_CONFIG_FILE`: a librdkafka properties file (`key=value` lines, `#`
  comments), applied first; any librdkafka setting may be given here;
- `RECOVERY_KAFKA_SECURITY_PROTOCOL`: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or
  `SASL_SSL` (default: `SASL_SSL` when a SASL user is named, else librdkafka's
  `PLAINTEXT`);
- `RECOVERY_KAFKA_SASL_MECHANISM` (default `SCRAM-SHA-512` for a SASL protocol),
  `RECOVERY_KAFKA_SASL_USERNAME`, and `RECOVERY_KAFKA_SASL_PASSWORD` or
  `RECOVERY_KAFKA_SASL_PASSWORD_FILE` (a file holding the password);
- `RECOVERY_KAFKA_SSL_CA_LOCATION`: the PEM file of the CA that signed the broker's
  certificate.

The variables override the file. The broker's principals and what each may do are in
`KAFKA_PRINCIPALS` and `producers.acl_bindings`; docs/operations.md ("Kafka security")
describes both.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from schemas.settings import ConfigurationError, KafkaClientSettings

__all__ = [
    "ENV_KAFKA_CONFIG_FILE",
    "ENV_KAFKA_SASL_MECHANISM",
    "ENV_KAFKA_SASL_PASSWORD",
    "ENV_KAFKA_SASL_PASSWORD_FILE",
    "ENV_KAFKA_SASL_USERNAME",
    "ENV_KAFKA_SECURITY_PROTOCOL",
    "ENV_KAFKA_SSL_CA_LOCATION",
    "KAFKA_PRINCIPALS",
    "KafkaConfigError",
    "KafkaSecurity",
    "kafka_config",
    "read_client_properties",
]

# The variables of `KafkaClientSettings`, for messages that say what to set.
ENV_KAFKA_CONFIG_FILE: Final = KafkaClientSettings.variable("config_file")
ENV_KAFKA_SECURITY_PROTOCOL: Final = KafkaClientSettings.variable("security_protocol")
ENV_KAFKA_SASL_MECHANISM: Final = KafkaClientSettings.variable("sasl_mechanism")
ENV_KAFKA_SASL_USERNAME: Final = KafkaClientSettings.variable("sasl_username")
ENV_KAFKA_SASL_PASSWORD: Final = KafkaClientSettings.variable("sasl_password")
ENV_KAFKA_SASL_PASSWORD_FILE: Final = KafkaClientSettings.variable("sasl_password_file")
ENV_KAFKA_SSL_CA_LOCATION: Final = KafkaClientSettings.variable("ssl_ca_location")

# Component -> the SASL user it authenticates as on a secured broker. `broker` is the
# broker's own inter-broker principal; `admin` provisions topics and ACLs.
KAFKA_PRINCIPALS: Final[Mapping[str, str]] = {
    "admin": "admin",
    "broker": "broker",
    "controller": "controller",
    "relay": "relay",
    "tool": "tool",
    "worker": "worker",
    "siem": "siem",
    "bench": "bench",
}

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
_SASL: Final = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
_DEFAULT_MECHANISM: Final = "SCRAM-SHA-512"


class KafkaConfigError(ConfigurationError):
    """The Kafka client's security settings are incomplete or unreadable."""


class KafkaSecurity(BaseModel):
    """One client's security settings (the module docstring has the variables). The
    password never shows in `repr` or logs; `describe` is the loggable summary."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    protocol: Protocol | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    # Further librdkafka settings, from RECOVERY_KAFKA_CONFIG_FILE.
    extra: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KafkaSecurity:
        """The settings the environment names (`KafkaClientSettings`; `environ`, else
        the process's). Raises `KafkaConfigError` naming the variable when a file it
        names is unreadable or a value is not allowed."""
        try:
            settings = KafkaClientSettings.load(environ)
        except ConfigurationError as exc:
            raise KafkaConfigError(str(exc)) from exc
        return cls.from_settings(settings)

    @classmethod
    def from_file(cls, path: Path) -> KafkaSecurity:
        """The settings of one client properties file alone (a component's file of the
        local stack), whatever the environment says."""
        return cls.from_settings(KafkaClientSettings.load({}, config_file=path))

    @classmethod
    def from_settings(cls, settings: KafkaClientSettings) -> KafkaSecurity:
        """What `settings` resolve to: the properties file's values, with each variable
        set on top of them."""
        extra: dict[str, str] = {}
        if settings.config_file is not None:
            extra = read_client_properties(settings.config_file, ENV_KAFKA_CONFIG_FILE)
        password = settings.sasl_password.get_secret_value() if settings.sasl_password else None
        if password is None and settings.sasl_password_file is not None:
            password = _read_secret(settings.sasl_password_file)
        protocol = settings.security_protocol or extra.pop("security.protocol", None)
        if protocol is not None and protocol.upper() not in {
            "PLAINTEXT",
            "SSL",
            "SASL_PLAINTEXT",
            "SASL_SSL",
        }:
            raise KafkaConfigError(
                f"{ENV_KAFKA_SECURITY_PROTOCOL}={protocol} is not one of PLAINTEXT, SSL, "
                "SASL_PLAINTEXT, SASL_SSL"
            )
        return cls(
            protocol=protocol.upper() if protocol else None,  # type: ignore[arg-type]
            sasl_mechanism=settings.sasl_mechanism
            or extra.pop("sasl.mechanism", None)
            or extra.pop("sasl.mechanisms", None),
            sasl_username=settings.sasl_username or extra.pop("sasl.username", None),
            sasl_password=SecretStr(password or extra.pop("sasl.password", ""))
            if password or "sasl.password" in extra
            else None,
            ssl_ca_location=settings.ssl_ca_location or extra.pop("ssl.ca.location", None),
            extra=extra,
        )

    @property
    def effective_protocol(self) -> Protocol:
        """The protocol clients use: the one set, else SASL_SSL for a named user."""
        if self.protocol is not None:
            return self.protocol
        return "SASL_SSL" if self.sasl_username else "PLAINTEXT"

    @property
    def secured(self) -> bool:
        """Whether connections are authenticated or encrypted (anything but PLAINTEXT)."""
        return self.effective_protocol != "PLAINTEXT"

    def client_config(self) -> dict[str, str]:
        """The librdkafka settings these stand for. Raises `KafkaConfigError` when a SASL
        protocol has no user or password."""
        config = dict(self.extra)
        protocol = self.effective_protocol
        if protocol != "PLAINTEXT" or self.protocol is not None:
            config["security.protocol"] = protocol
        if protocol in _SASL:
            if not self.sasl_username or self.sasl_password is None:
                raise KafkaConfigError(
                    f"Kafka security protocol {protocol} needs a SASL user and password: set "
                    f"{ENV_KAFKA_SASL_USERNAME} and {ENV_KAFKA_SASL_PASSWORD} (or "
                    f"{ENV_KAFKA_SASL_PASSWORD_FILE}), or name a client properties file in "
                    f"{ENV_KAFKA_CONFIG_FILE} (`recoveryctl stack up` prints one per component)"
                )
            config["sasl.mechanism"] = self.sasl_mechanism or _DEFAULT_MECHANISM
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            config["ssl.ca.location"] = self.ssl_ca_location
        return config

    def as_principal(self, username: str, password: str) -> KafkaSecurity:
        """The same connection settings, authenticating as `username`."""
        return self.model_copy(
            update={"sasl_username": username, "sasl_password": SecretStr(password)}
        )

    def describe(self) -> str:
        """A loggable summary without the password: `SASL_SSL as relay (SCRAM-SHA-512)`."""
        protocol = self.effective_protocol
        if protocol in _SASL:
            mechanism = self.sasl_mechanism or _DEFAULT_MECHANISM
            return f"{protocol} as {self.sasl_username} ({mechanism})"
        return protocol


def kafka_config(bootstrap: str, security: KafkaSecurity | None = None) -> dict[str, Any]:
    """The start of every client's librdkafka configuration: `bootstrap.servers` and the
    security settings (`security`, else the environment's, read now). Callers add their
    own settings on top: `{**kafka_config(bootstrap), "group.id": ...}`."""
    chosen = security if security is not None else KafkaSecurity.from_env()
    return {"bootstrap.servers": bootstrap, **chosen.client_config()}


def read_client_properties(
    path: Path, source: str = "the client properties file"
) -> dict[str, str]:
    """The `key=value` lines of a librdkafka properties file (blank lines and `#`
    comments skipped). Raises `KafkaConfigError` naming `source` when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KafkaConfigError(f"{source}: cannot read {path}: {exc}") from exc
    config: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise KafkaConfigError(f"{source}: {path} line {number} is not key=value: {raw!r}")
        config[key.strip()] = value.strip()
    return config


def _read_secret(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KafkaConfigError(
            f"{ENV_KAFKA_SASL_PASSWORD_FILE}: cannot read {path}: {exc}"
        ) from exc
