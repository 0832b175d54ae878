"""Dead letters: the record the controller writes for a refused input record.

The payload uses the field names of `schemas/avro/dead_letter.v1.avsc` (`recovery.
DeadLetter`) so the relay can encode it with that schema; because the outbox stores
JSON, the `bytes` fields (`original_key`, `original_value`, header values) are base64
strings and `dead_lettered_at` is an ISO-8601 string. The record id is deterministic
(group and coordinates), so a replayed batch can never produce a second one, and the
audit record carries a digest of the original bytes, never the bytes themselves.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from typing import Any

from consumer.intake import RawRecord, Refusal
from ledger import DeadLetter, intake_chain_id
from schemas import record_id

__all__ = ["dead_letter", "dead_letter_id", "dead_letter_record"]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def dead_letter_id(group: str, record: RawRecord) -> str:
    """The deterministic id of the dead letter for `record` consumed by `group`."""
    return record_id("dlq", group, record.topic, str(record.partition), str(record.offset))


def _key_text(record: RawRecord) -> str | None:
    if record.key is None:
        return None
    try:
        return record.key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def dead_letter_record(
    controller: str, record: RawRecord, refusal: Refusal, now: datetime
) -> dict[str, Any]:
    """The `recovery.DeadLetter` record of `record` (bytes base64, time ISO-8601): the
    original key, value and headers exactly as consumed, whichever path refuses it."""
    return {
        "reason_code": refusal.code,
        "reason": refusal.reason,
        "source_topic": record.topic,
        "source_partition": record.partition,
        "source_offset": record.offset,
        "source_timestamp": record.timestamp_ms,
        "original_key": _b64(record.key),
        "original_value": _b64(record.value),
        "original_headers": [{"key": k, "value": _b64(v)} for k, v in record.headers],
        "event_id": refusal.event_id,
        "operation_id": refusal.operation_id,
        "dead_lettered_at": now.isoformat(),
        "controller": controller,
    }


def dead_letter(
    group: str, controller: str, record: RawRecord, refusal: Refusal, now: datetime
) -> DeadLetter:
    """The ledger's `DeadLetter` for `record`, refused for `refusal` by `controller`."""
    rid = dead_letter_id(group, record)
    chain = intake_chain_id(group, record.topic, record.partition)
    payload = dead_letter_record(controller, record, refusal, now)
    value = record.value or b""
    audit = {
        "reason_code": refusal.code,
        "reason": refusal.reason,
        "coordinates": record.coordinates,
        "source": {"topic": record.topic, "partition": record.partition, "offset": record.offset},
        "event_id": refusal.event_id,
        "operation_id": refusal.operation_id,
        "value_digest": "sha256:" + hashlib.sha256(value).hexdigest(),
        "value_bytes": len(value),
        "dead_letter_id": rid,
        "controller": controller,
    }
    headers = {"coordinates": record.coordinates}
    if refusal.operation_id is not None:
        headers["operation_id"] = refusal.operation_id
    # Keep the original key when it is text, so the dead letter sits next to its
    # operation's records; otherwise order it within the partition's intake chain.
    key = _key_text(record) or chain
    return DeadLetter(
        record_id=rid,
        chain_id=chain,
        key=key,
        reason_code=refusal.code,
        payload=payload,
        headers=headers,
        audit=audit,
    )
