"""The settings of `recoveryctl`, the reviewer console and the local stack, and the
names and defaults the local stack and `compose.yaml` must agree on.

The settings are declared on the project's settings base (`schemas.Settings`), like
every role's, and docs/configuration.md is generated from them. The names and versions
below are one place for what `compose.yaml` repeats, so that a test can compare the two
and fail when they drift apart. What every component shares (where the services are,
topics, Kafka authentication, keys) is declared in `schemas`.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Final

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from schemas import Settings

__all__ = [
    "COMPOSE_KAFKA_PORT",
    "COMPOSE_POSTGRES_PORT",
    "COMPOSE_SERVICES",
    "DATABASE_NAME",
    "DATABASE_USER",
    "ENV_CACHE_DIR",
    "ENV_KAFKA_PLAINTEXT",
    "ENV_STACK_DIR",
    "KAFKA_VERSION",
    "LOG4J_VERSION",
    "POSTGRES_MAJOR",
    "RUNTIME_ROLES",
    "ConsoleSettings",
    "DatabasePasswordSettings",
    "KafkaPasswordSettings",
    "StackSettings",
]


# The broker assembled from Maven Central. Kafka 4.x logs through slf4j 1.7, so the
# log4j2 binding is `log4j-slf4j-impl` at the log4j version kafka-server itself uses.
KAFKA_VERSION: Final = "4.4.0"
LOG4J_VERSION: Final = "2.25.5"

# The database role and database the application uses on the local server.
DATABASE_USER: Final = "postgres"
DATABASE_NAME: Final = "recovery"

# compose.yaml: the services it must define, the ports it publishes on the host, and
# the roles `recoveryctl run --role` accepts for the runtime containers.
COMPOSE_SERVICES: Final = (
    "kafka",
    "postgres",
    "provision",
    "ledger-roles",
    "controller",
    "relay",
)
COMPOSE_KAFKA_PORT: Final = 9092
COMPOSE_POSTGRES_PORT: Final = 5432
RUNTIME_ROLES: Final = ("controller", "relay")

# The PostgreSQL major the stack is built and tested on (Debian's postgresql-15).
POSTGRES_MAJOR: Final = 15


class StackSettings(Settings):
    """Where the local stack (`recoveryctl stack up`, `ops/dev up`) keeps what it
    downloads and runs, and how it runs the broker."""

    section: ClassVar[str] = "Local stack"

    cache_dir: Path | None = Field(
        default=None,
        validation_alias="RECOVERY_CACHE_DIR",
        description="Where the Kafka jars are cached, outside the repository so every "
        "clone reuses them (default `$XDG_CACHE_HOME/agent-recovery`, else "
        "`~/.cache/agent-recovery`).",
    )
    xdg_cache_home: Path | None = Field(
        default=None,
        validation_alias="XDG_CACHE_HOME",
        description="The XDG base folder for caches (the jar cache's default parent).",
    )
    stack_dir: Path | None = Field(
        default=None,
        validation_alias="RECOVERY_STACK_DIR",
        description="Where the running stack keeps its state, keys and data (default "
        "`<checkout>/.stack`; under /var/tmp when root runs from a checkout others cannot "
        "reach).",
    )
    kafka_plaintext: bool = Field(
        default=False,
        validation_alias="RECOVERY_STACK_KAFKA_PLAINTEXT",
        description="Run the local broker's plaintext listener instead of TLS, SASL/SCRAM "
        "and ACLs (`stack up --plaintext`). Never for anything but a quick local try.",
    )
    java_home: Path | None = Field(
        default=None,
        validation_alias="JAVA_HOME",
        description="The Java the local broker runs on (else `java` on PATH; 17+).",
    )

    @field_validator("kafka_plaintext", mode="before")
    @classmethod
    def _anything_but_zero(cls, value: object) -> object:
        # Historically "set to anything but '' or '0'": keep that meaning for any text.
        if isinstance(value, str):
            return value.strip() not in {"", "0", "false", "no", "off"}
        return value


class ConsoleSettings(Settings):
    """The reviewer console (`recoveryctl console`)."""

    section: ClassVar[str] = "Reviewer console"

    tokens_file: Path | None = Field(
        default=None,
        validation_alias="RECOVERY_CONSOLE_TOKENS",
        description="The reviewers' login tokens, stored as hashes (default "
        "`<stack dir>/console-tokens.json`).",
    )


class DatabasePasswordSettings(Settings):
    """Passwords `recoveryctl db roles` and the local stack give the ledger's login roles;
    unset ones come from the password file or are generated (docs/ledger.md, Roles)."""

    model_config = SettingsConfigDict(env_prefix="RECOVERY_DB_PASSWORD_")
    section: ClassVar[str] = "Database role passwords"

    owner: SecretStr | None = Field(default=None, description="`recovery_owner`.")
    controller: SecretStr | None = Field(default=None, description="`recovery_controller`.")
    relay: SecretStr | None = Field(default=None, description="`recovery_relay`.")
    reader: SecretStr | None = Field(default=None, description="`recovery_reader`.")
    auditor: SecretStr | None = Field(default=None, description="`recovery_auditor`.")

    def chosen(self) -> dict[str, str]:
        """Component -> password, for the ones set."""
        return _chosen(self)


class KafkaPasswordSettings(Settings):
    """Passwords the local broker gives its SASL principals; unset ones come from the
    broker's password file or are generated (docs/operations.md, Kafka security)."""

    model_config = SettingsConfigDict(env_prefix="RECOVERY_KAFKA_PASSWORD_")
    section: ClassVar[str] = "Kafka principal passwords (local stack)"

    admin: SecretStr | None = Field(default=None, description="`admin` (provisioning).")
    broker: SecretStr | None = Field(default=None, description="`broker` (inter-broker).")
    controller: SecretStr | None = Field(default=None, description="`controller`.")
    relay: SecretStr | None = Field(default=None, description="`relay`.")
    tool: SecretStr | None = Field(default=None, description="`tool` (tools, approvers).")
    worker: SecretStr | None = Field(default=None, description="`worker`.")
    siem: SecretStr | None = Field(default=None, description="`siem` (audit readers).")
    bench: SecretStr | None = Field(default=None, description="`bench` (benchmarks).")

    def chosen(self) -> dict[str, str]:
        """Component -> password, for the ones set."""
        return _chosen(self)


def _chosen(settings: Settings) -> dict[str, str]:
    values = {name: getattr(settings, name) for name in type(settings).model_fields}
    return {name: v.get_secret_value() for name, v in values.items() if v is not None}


# The variables tests and messages name.
ENV_CACHE_DIR: Final = StackSettings.variable("cache_dir")
ENV_STACK_DIR: Final = StackSettings.variable("stack_dir")
ENV_KAFKA_PLAINTEXT: Final = StackSettings.variable("kafka_plaintext")
