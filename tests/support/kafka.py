"""Per-test Kafka topics: unique names, created and deleted through the AdminClient."""

from __future__ import annotations

import re
import uuid

from confluent_kafka.admin import AdminClient, NewTopic

from schemas import KafkaSecurity, kafka_config

__all__ = ["TopicFactory", "unique_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def unique_name(hint: str) -> str:
    """A topic name no other test (or earlier run on a shared broker) uses: a readable
    part from `hint` (usually the test's name) and a random suffix."""
    readable = _UNSAFE.sub("-", hint).strip("-")[:60] or "topic"
    return f"t-{readable}-{uuid.uuid4().hex[:10]}"


class TopicFactory:
    """Creates topics for one test and deletes them all at its end."""

    def __init__(
        self,
        bootstrap: str,
        hint: str,
        security: KafkaSecurity | None = None,
        *,
        replication: int = 1,
    ) -> None:
        # As `security` (else the environment's principal: the session broker's admin).
        self._admin = AdminClient(kafka_config(bootstrap, security))
        self._hint = hint
        self._replication = replication
        self.created: list[str] = []

    def __call__(self, partitions: int = 1, *, config: dict[str, str] | None = None) -> str:
        """Create a new topic with `partitions` partitions (replication factor 1, or the
        factory's `replication` on a cluster) and wait until the broker confirms it;
        return its name."""
        name = unique_name(self._hint)
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=self._replication,
            config=config or {},
        )
        for future in self._admin.create_topics([topic], operation_timeout=30).values():
            future.result(timeout=30)
        self.created.append(name)
        return name

    def delete_all(self) -> None:
        """Delete every topic this factory created (so a shared broker does not fill up)."""
        if not self.created:
            return
        for future in self._admin.delete_topics(self.created, operation_timeout=30).values():
            future.result(timeout=30)
        self.created.clear()
