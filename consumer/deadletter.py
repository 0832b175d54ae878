"""Dead letters: the record the controller writes for a refused input record.

The payload uses the field names of `schemas/avro/dead_letter.v2.avsc` (`recovery.
DeadLetter`) so the relay can encode it with that schema; because the outbox stores
JSON, the `bytes` fields (`original_key`, `original_value`, header values) are base64
strings and `dead_lettered_at` is an ISO-8601 string. The record id is deterministic
(group and coordinates), so a replayed batch can never produce a second one, and the
audit record carries a digest of the original bytes, never the bytes themselves.

Every dead letter is bounded, whatever it refuses: a record larger than
`DEAD_LETTER_WHOLE_BYTES` (one that intake refused as oversized, say) is kept as an
excerpt (the first `DEAD_LETTER_EXCERPT_BYTES` of its value, the first bytes of its key
and of at most `DEAD_LETTER_HEADERS` header values) with its size and the SHA-256 of its
value, marked `excerpt`; so no hostile record can grow a dead letter past what the
dead-letter topic carries, and the relay publishes it like any other row.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from typing import Any, Final

from consumer.intake import RawRecord, Refusal
from ledger import DeadLetter, intake_chain_id
from schemas import record_id

__all__ = [
    "DEAD_LETTER_EXCERPT_BYTES",
    "DEAD_LETTER_WHOLE_BYTES",
    "dead_letter",
    "dead_letter_id",
    "dead_letter_record",
]

# A refused record up to this size (key, value and headers) is kept whole, so that it
# can be redriven; a larger one as an excerpt (module docstring).
DEAD_LETTER_WHOLE_BYTES: Final = 256 * 1024
DEAD_LETTER_EXCERPT_BYTES: Final = 4 * 1024
_EXCERPT_KEY_BYTES: Final = 1024
_EXCERPT_HEADER_BYTES: Final = 512
DEAD_LETTER_HEADERS: Final = 32
# A reason quotes the record (ids, an exception's text): bounded like everything else.
_REASON_CHARS: Final = 2048


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def dead_letter_id(group: str, record: RawRecord) -> str:
    """The deterministic id of the dead letter for `record` consumed by `group`."""
    return record_id("dlq", group, record.topic, str(record.partition), str(record.offset))


def _key_text(record: RawRecord) -> str | None:
    if record.key is None or len(record.key) > _EXCERPT_KEY_BYTES:
        return None
    try:
        return record.key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def dead_letter_record(
    controller: str, record: RawRecord, refusal: Refusal, now: datetime
) -> dict[str, Any]:
    """The `recovery.DeadLetter` record of `record` (bytes base64, time ISO-8601): the
    original key, value and headers exactly as consumed, whichever path refuses it, or a
    bounded excerpt of them when the record is larger than `DEAD_LETTER_WHOLE_BYTES`."""
    excerpt = record.size > DEAD_LETTER_WHOLE_BYTES
    key, value, headers = record.key, record.value, record.headers
    if excerpt:
        key = None if key is None else key[:_EXCERPT_KEY_BYTES]
        value = None if value is None else value[:DEAD_LETTER_EXCERPT_BYTES]
        headers = tuple(
            (k[:_EXCERPT_HEADER_BYTES], None if v is None else v[:_EXCERPT_HEADER_BYTES])
            for k, v in record.headers[:DEAD_LETTER_HEADERS]
        )
    return {
        "reason_code": refusal.code,
        "reason": refusal.reason[:_REASON_CHARS],
        "source_topic": record.topic,
        "source_partition": record.partition,
        "source_offset": record.offset,
        "source_timestamp": record.timestamp_ms,
        "original_key": _b64(key),
        "original_value": _b64(value),
        "original_headers": [{"key": k, "value": _b64(v)} for k, v in headers],
        "excerpt": excerpt,
        "original_size": record.size,
        "original_value_sha256": hashlib.sha256(record.value or b"").hexdigest(),
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
        "reason": refusal.reason[:_REASON_CHARS],
        "coordinates": record.coordinates,
        "source": {"topic": record.topic, "partition": record.partition, "offset": record.offset},
        "event_id": refusal.event_id,
        "operation_id": refusal.operation_id,
        "value_digest": "sha256:" + hashlib.sha256(value).hexdigest(),
        "value_bytes": len(value),
        "dead_letter_id": rid,
        "controller": controller,
    }
    if refusal.incident is not None:
        audit["incident"] = {**refusal.incident, "at": now.isoformat()}
    headers = {"coordinates": record.coordinates}
    if refusal.operation_id is not None:
        headers["operation_id"] = refusal.operation_id
    # Keep the original key when it is text of an id's length, so the dead letter sits
    # next to its operation's records; otherwise order it within the intake chain.
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
