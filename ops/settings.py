"""Names and defaults the local stack, `compose.yaml` and the runtime must agree on.

One place for the environment variable names and service names, so that a test can
compare `compose.yaml` with them and fail when the two drift apart.
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
    "ENV_DATABASE_URL",
    "ENV_KAFKA_BOOTSTRAP",
    "ENV_STACK_DIR",
    "KAFKA_VERSION",
    "LOG4J_VERSION",
    "POSTGRES_MAJOR",
    "RUNTIME_ROLES",
]

# Where the runtime finds its services. When set, `recoveryctl stack up` and the test
# fixtures use these instead of starting local ones.
ENV_KAFKA_BOOTSTRAP: Final = "RECOVERY_KAFKA_BOOTSTRAP"
ENV_DATABASE_URL: Final = "RECOVERY_DATABASE_URL"

# Where downloaded Kafka jars live (outside the repository, kept across clones), and
# where the running stack keeps its state and data (default: `<repo>/.stack`).
ENV_CACHE_DIR: Final = "RECOVERY_CACHE_DIR"
ENV_STACK_DIR: Final = "RECOVERY_STACK_DIR"

# The broker assembled from Maven Central. Kafka 4.x logs through slf4j 1.7, so the
# log4j2 binding is `log4j-slf4j-impl` at the log4j version kafka-server itself uses.
KAFKA_VERSION: Final = "4.4.0"
LOG4J_VERSION: Final = "2.25.5"

# The database role and database the application uses on the local server.
DATABASE_USER: Final = "postgres"
DATABASE_NAME: Final = "recovery"

# compose.yaml: the services it must define, the ports it publishes on the host, and
# the roles `recoveryctl run --role` accepts for the runtime containers.
COMPOSE_SERVICES: Final = ("kafka", "postgres", "controller", "relay")
COMPOSE_KAFKA_PORT: Final = 9092
COMPOSE_POSTGRES_PORT: Final = 5432
RUNTIME_ROLES: Final = ("controller", "relay")

# The PostgreSQL major the stack is built and tested on (Debian's postgresql-15).
POSTGRES_MAJOR: Final = 15
