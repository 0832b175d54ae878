"""The exception base of `producers`."""

from __future__ import annotations

__all__ = ["DeliveryFailed", "KafkaReadError", "ProducersError", "ProvisionError"]


class ProducersError(Exception):
    """Publishing to Kafka failed; check the broker address and the topic names."""


class DeliveryFailed(ProducersError):
    """The broker did not acknowledge some records; they were not published: retry them."""

    def __init__(self, failures: list[tuple[str, str]]) -> None:
        self.failures = failures
        shown = "; ".join(f"{rid}: {why}" for rid, why in failures[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(
            f"{len(failures)} record(s) were not delivered: {shown}{more}; "
            "they were not published, publish them again (their record ids make that safe)"
        )


class ProvisionError(ProducersError):
    """Creating the recovery topics failed; check the broker and the replication factor."""


class KafkaReadError(ProducersError):
    """What Kafka holds could not be read (the broker did not answer, or no such topic)."""
