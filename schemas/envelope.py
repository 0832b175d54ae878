"""Conversion between decoded envelope records and `machines.event.Event`.

`record_to_event` is the one door from the wire into the decision core: it hands the
decoded dict (from Avro or JSON) to `parse_event` and turns its refusal into a coded
`WireError`. `event_to_record` is the way back, shaped for the current Avro schema.

Times on the wire are UTC. The payload digest and the approver's signature cover times
in their ISO-8601 form, which includes the offset; Avro stores an instant without one,
so a time in another zone would come back as UTC with a different digest and a broken
signature. Encoding such an event is refused (`non-utc-time`) rather than silently
changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from machines import Event, EventError, canonical_json, parse_event
from schemas.errors import WireCode, WireError

__all__ = ["event_to_json", "event_to_record", "record_to_event"]

_ZERO = timedelta(0)


def record_to_event(record: Mapping[str, Any]) -> Event:
    """Validate a decoded envelope into an `Event`; raises `WireError` with the code
    `machines.parse_event` gives (`envelope-invalid`, `envelope-field-invalid`,
    `event-time-out-of-range`) naming the event id and the invalid fields. Any `payload_digest`
    in the record is ignored: the digest is recomputed from the content. A `payload` that
    is text (Avro v5 carries it as JSON text) must hold a JSON object."""
    if isinstance(record, Mapping):
        record = _payload_from_text(record)
    try:
        return parse_event(record)
    except EventError as exc:
        raise WireError(WireCode(exc.code), str(exc)) from exc
    except (TypeError, ValueError) as exc:  # a record that is not a mapping of fields
        raise WireError(WireCode.ENVELOPE_INVALID, f"not an event envelope: {exc}") from exc


def event_to_record(event: Event) -> dict[str, Any]:
    """The event as a record of the current `recovery.EventEnvelope` schema: datetimes
    stay datetimes (Avro timestamp-micros), tuples become lists, `payload_digest` is
    included (schema v2), and so are `facts` and `scope` (schema v3, null when absent) and
    `payload` (schema v5, as canonical JSON text, null when absent).
    Raises `WireError` (`non-utc-time`) for a time not in UTC."""
    record: dict[str, Any] = {
        f.name: _value(event.event_id, getattr(event, f.name)) for f in fields(event)
    }
    if event.payload is not None:
        record["payload"] = canonical_json(event.payload).decode("utf-8")
    return record


def _payload_from_text(record: Mapping[str, Any]) -> Mapping[str, Any]:
    text = record.get("payload")
    if not isinstance(text, str):
        return record
    try:
        payload = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise WireError(
            WireCode.ENVELOPE_INVALID,
            f"event {record.get('event_id', '<no event_id>')!r}: payload is not JSON: {exc}",
        ) from exc
    if not isinstance(payload, dict):
        raise WireError(
            WireCode.ENVELOPE_INVALID,
            f"event {record.get('event_id', '<no event_id>')!r}: payload must be a JSON object",
        )
    return {**record, "payload": payload}


def event_to_json(event: Event) -> dict[str, Any]:
    """The event as JSON-ready data for `JsonCodec` (times as ISO-8601 strings)."""
    event_to_record(event)  # same UTC rule for both encodings
    return event.to_dict()


def _value(event_id: str, value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _value(event_id, getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _value(event_id, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_value(event_id, v) for v in value]
    if isinstance(value, datetime):
        if value.utcoffset() != _ZERO:
            raise WireError(
                WireCode.NON_UTC_TIME,
                f"event {event_id}: time {value.isoformat()} is not UTC; build events with "
                "datetime.now(UTC) so the digest and any signature survive the wire",
            )
        return value
    return value
