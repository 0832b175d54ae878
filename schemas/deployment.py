"""Names every component of a deployment agrees on: the topics and the variables that
name the services.

One place, below every package that reads or writes Kafka or the ledger, so that the
controller, the relay, the client library and `recoveryctl` cannot disagree. Topic names
default to `recovery.events`, `recovery.commands`, `recovery.evidence`, `recovery.audit`
and `recovery.dlq`; each can be overridden by an environment variable
(`RECOVERY_TOPIC_EVENTS`, ...) so that several deployments, or tests, share a broker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_CONTROLLER_ID",
    "DEFAULT_TOPICS",
    "ENV_CONTROLLER_ID",
    "ENV_CONTROLLER_SIGNING_KEY_FILE",
    "ENV_DATABASE_URL",
    "ENV_KAFKA_BOOTSTRAP",
    "ENV_PRODUCER_ID",
    "ENV_PRODUCER_KEY_FILE",
    "ENV_ROSTER_FILE",
    "ENV_TOPIC_PREFIX",
    "TopicNames",
]

# Where the runtime finds its services. When set, `recoveryctl stack up` and the test
# fixtures use these instead of starting local ones.
ENV_KAFKA_BOOTSTRAP: Final = "RECOVERY_KAFKA_BOOTSTRAP"
ENV_DATABASE_URL: Final = "RECOVERY_DATABASE_URL"

ENV_TOPIC_PREFIX: Final = "RECOVERY_TOPIC_"

# Who signs what (docs/operations.md, "Keys"): the controller's producer id in the
# roster and its Ed25519 key file (never in the database); any other producer's id and
# key file (the client library, a worker); and the roster a verifier checks against (a
# policy file or a `producers:`-only file).
ENV_CONTROLLER_ID: Final = "RECOVERY_CONTROLLER_ID"
ENV_CONTROLLER_SIGNING_KEY_FILE: Final = "RECOVERY_CONTROLLER_SIGNING_KEY_FILE"
ENV_PRODUCER_ID: Final = "RECOVERY_PRODUCER_ID"
ENV_PRODUCER_KEY_FILE: Final = "RECOVERY_PRODUCER_KEY_FILE"
ENV_ROSTER_FILE: Final = "RECOVERY_ROSTER_FILE"
DEFAULT_CONTROLLER_ID: Final = "recovery-controller"

_NAME = r"^[A-Za-z0-9._-]{1,249}$"


class TopicNames(BaseModel):
    """Where each stream lives. Keys of every topic are operation ids."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    events: str = Field(default="recovery.events", pattern=_NAME)
    commands: str = Field(default="recovery.commands", pattern=_NAME)
    evidence: str = Field(default="recovery.evidence", pattern=_NAME)
    audit: str = Field(default="recovery.audit", pattern=_NAME)
    dlq: str = Field(default="recovery.dlq", pattern=_NAME)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TopicNames:
        """Defaults overridden by `RECOVERY_TOPIC_EVENTS`, `..._COMMANDS`, `..._EVIDENCE`,
        `..._AUDIT` and `..._DLQ` when set and not empty."""
        env = os.environ if environ is None else environ
        overrides = {
            name: env[ENV_TOPIC_PREFIX + name.upper()]
            for name in cls.model_fields
            if env.get(ENV_TOPIC_PREFIX + name.upper())
        }
        return cls(**overrides)

    def all(self) -> tuple[str, ...]:
        """Every topic name, in a fixed order."""
        return (self.events, self.commands, self.evidence, self.audit, self.dlq)


DEFAULT_TOPICS: Final = TopicNames()
"""The standard names, for defaults that must not build a model at each call."""
