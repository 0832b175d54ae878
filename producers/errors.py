"""The exception base of `producers`."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "DeliveryFailed",
    "KafkaReadError",
    "ProducersError",
    "ProvisionError",
    "RecordRefused",
]


class ProducersError(Exception):
    """Publishing to Kafka failed; check the broker address and the topic names."""


class RecordRefused(ProducersError):
    """The producer or the broker refused this one record for what it is (too large,
    invalid); sending it again as it is will not help. Others are unaffected."""

    def __init__(self, record_id: str, reason: str) -> None:
        self.record_id = record_id
        self.reason = reason
        super().__init__(f"record {record_id} refused: {reason}")


class DeliveryFailed(ProducersError):
    """The broker did not acknowledge some records; they were not published: retry them.
    `refused` maps the records the broker refused for what they are (`RecordRefused`'s
    reasons) to why: retrying those as they are will not help."""

    def __init__(
        self, failures: list[tuple[str, str]], refused: Mapping[str, str] | None = None
    ) -> None:
        self.failures = failures
        self.refused = dict(refused or {})
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
