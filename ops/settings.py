"""Names and defaults the local stack and `compose.yaml` must agree on.

One place for the stack's environment variable names, versions and service names, so
that a test can compare `compose.yaml` with them and fail when the two drift apart. The
names the runtime shares with every component (topics, `RECOVERY_KAFKA_BOOTSTRAP`,
`RECOVERY_DATABASE_URL`) are in `schemas.deployment`.
"""

from __future__ import annotations

from typing import Final

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
]

# Where downloaded Kafka jars live (outside the repository, kept across clones), and
# where the running stack keeps its state and data (default: `<repo>/.stack`).
ENV_CACHE_DIR: Final = "RECOVERY_CACHE_DIR"
ENV_STACK_DIR: Final = "RECOVERY_STACK_DIR"
# Set (to anything but "" or "0") to run the local broker's plaintext listener instead
# of TLS + SASL/SCRAM + ACLs, as `recoveryctl stack up --plaintext` does.
ENV_KAFKA_PLAINTEXT: Final = "RECOVERY_STACK_KAFKA_PLAINTEXT"

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
