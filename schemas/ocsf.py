"""Audit records as OCSF events, so that a SIEM ingests `recovery.audit` without our code.

Each audit record (one link of an operation's hash chain, SPEC §10) becomes one OCSF
1.3 **API Activity** event (category 6 Application Activity, class 6003): the controller
is the API, the decided event is the request, the operation is the resource. The chain
hash, the previous hash and the sequence travel under `unmapped.recovery.chain` and the
hash is also the event's `metadata.uid`, so a SIEM can verify the chain and dedupe on
it. docs/audit-ocsf.md documents every attribute.

The input is a plain mapping in either shape the ledger produces: flat
(`occurred_at`, `actor`, `machine_name`...) or the published form, whose chain fields
sit beside a `record` body holding a decision (`decided_at`, `machine.{name,...}`,
`event.{id,type,producer,...}`). Lookups try the flat name first, then the nested paths.

`audit_to_ocsf` returns the event as a dict; `audit_to_ocsf_json` returns the bytes the
relay publishes: that dict as `json.dumps(event, sort_keys=True, separators=(",", ":"))`
writes it, that is canonical JSON with every non-ASCII character escaped
(`machines.canonical_ascii_json`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from machines import canonical_ascii_json
from schemas.errors import WireCode, WireError
from schemas.settings import DEFAULT_TOPICS

__all__ = [
    "HEADS_KIND",
    "OCSF_VERSION",
    "PRODUCT_NAME",
    "TOMBSTONE_KIND",
    "audit_to_ocsf",
    "audit_to_ocsf_json",
    "heads_to_ocsf",
    "ocsf_kind",
]

OCSF_VERSION: Final = "1.3.0"
PRODUCT_NAME: Final = "agent-recovery-controller"
VENDOR_NAME: Final = "agent-recovery"

CATEGORY_UID: Final = 6  # Application Activity
CLASS_UID: Final = 6003  # API Activity

# The two records on the audit topic that are not one decision's link: a batch's signed
# chain heads, and a purged chain's tombstone (docs/audit-ocsf.md).
HEADS_KIND: Final = "chain-heads"
TOMBSTONE_KIND: Final = "tombstone"

# activity_id of API Activity: 1 Create, 2 Read, 3 Update, 4 Delete, 99 Other.
_ACTIVITY_CREATE: Final = 1
_ACTIVITY_UPDATE: Final = 3
_ACTIVITY_DELETE: Final = 4
_ACTIVITY_OTHER: Final = 99
_ACTIVITY_NAMES: Final = {
    _ACTIVITY_CREATE: "Create",
    _ACTIVITY_UPDATE: "Update",
    _ACTIVITY_DELETE: "Delete",
    _ACTIVITY_OTHER: "Other",
}

# Decision outcomes (machines.decision.Outcome) and other audit kinds, mapped to
# (activity_id, status_id, severity_id). status: 1 Success, 2 Failure. severity:
# 1 Informational, 3 Medium, 4 High. A state change is an Update of the operation; a
# refusal or conflict is a failed attempt and louder, because someone sent it.
_OUTCOMES: Final[Mapping[str, tuple[int, int, int]]] = {
    "transitioned": (_ACTIVITY_UPDATE, 1, 1),
    "awaiting": (_ACTIVITY_UPDATE, 1, 1),
    # A timer's event (machines.timers): it fired (escalated, released a paced retry),
    # or came after its timer was disarmed and was recorded, changing nothing.
    "fired": (_ACTIVITY_UPDATE, 1, 1),
    "stale": (_ACTIVITY_UPDATE, 1, 1),
    "duplicate": (_ACTIVITY_UPDATE, 1, 1),
    "rejected": (_ACTIVITY_UPDATE, 2, 3),
    "final": (_ACTIVITY_UPDATE, 2, 1),
    "refused": (_ACTIVITY_UPDATE, 2, 4),
    "conflict": (_ACTIVITY_UPDATE, 2, 4),
}
_KINDS: Final[Mapping[str, tuple[int, int, int]]] = {
    "operation-opened": (_ACTIVITY_CREATE, 1, 1),
    "lineage": (_ACTIVITY_UPDATE, 1, 3),
    "event-conflict": (_ACTIVITY_UPDATE, 2, 4),
    "dead_letter": (_ACTIVITY_OTHER, 2, 4),
    "dead-letter": (_ACTIVITY_OTHER, 2, 4),
    "controller_error": (_ACTIVITY_OTHER, 2, 4),
    "controller-error": (_ACTIVITY_OTHER, 2, 4),
    # Retention removed the chain's history and left this signed record in its place.
    TOMBSTONE_KIND: (_ACTIVITY_DELETE, 1, 3),
    HEADS_KIND: (_ACTIVITY_OTHER, 1, 1),
}
_DEFAULT_CLASSIFICATION: Final = (_ACTIVITY_OTHER, 0, 1)  # status 0: Unknown
_STATUS_NAMES: Final = {0: "Unknown", 1: "Success", 2: "Failure"}
_SEVERITY_NAMES: Final = {1: "Informational", 3: "Medium", 4: "High"}

_PATHS: Final[Mapping[str, tuple[tuple[str, ...], ...]]] = {
    "occurred": (
        ("occurred_at",),
        ("occurred_time",),
        ("record", "decided_at"),
        ("decided_at",),
        ("record", "purged_at"),
    ),
    "actor": (("actor",), ("producer",), ("record", "event", "producer"), ("event", "producer")),
    "machine_name": (("machine_name",), ("record", "machine", "name"), ("machine", "name")),
    "machine_version": (
        ("machine_version",),
        ("record", "machine", "version"),
        ("machine", "version"),
    ),
    "machine_digest": (("machine_digest",), ("record", "machine", "digest"), ("machine", "digest")),
    "event_id": (
        ("event_id",),
        ("record", "event", "id"),
        ("event", "id"),
        ("record", "event_id"),
        ("record", "opened_by_event"),
    ),
    "event_type": (("event_type",), ("record", "event", "type"), ("event", "type")),
    "correlation_id": (
        ("correlation_id",),
        ("record", "event", "correlation_id"),
        ("event", "correlation_id"),
    ),
    "outcome": (("outcome",), ("record", "outcome"), ("decision", "outcome")),
    # What `status_code` falls back to when there is no decision outcome: a dead
    # letter's reason code, a lineage record's own kind (containment...).
    "code": (("record", "code"), ("record", "kind")),
    "state_before": (("state_before",), ("record", "state_before"), ("decision", "state_before")),
    "state_after": (("state_after",), ("record", "state_after"), ("decision", "state_after")),
}
_REQUIRED: Final = ("operation_id", "sequence", "hash", "kind")


# The same paths split into (where, name): `where` is the mapping the name is read
# from, resolved once per record (parents before children) rather than once per path.
_SPLIT: Final = {name: tuple((p[:-1], p[-1]) for p in paths) for name, paths in _PATHS.items()}
_PARENTS: Final = tuple(
    sorted({p[:i] for paths in _PATHS.values() for p in paths for i in range(1, len(p))}, key=len)
)


def _fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """Every `_PATHS` field of `record`: per name, the value at its first path that
    holds one (not None); a path through something that is not a mapping holds none."""
    at: dict[tuple[str, ...], Mapping[str, Any] | None] = {(): record}
    for parent in _PARENTS:
        holder = at[parent[:-1]]
        value = None if holder is None else holder.get(parent[-1])
        at[parent] = value if isinstance(value, Mapping) else None
    found: dict[str, Any] = {}
    for name, paths in _SPLIT.items():
        value = None
        for where, key in paths:
            holder = at[where]
            if holder is not None and (value := holder.get(key)) is not None:
                break
        found[name] = value
    return found


def _epoch_millis(value: Any, operation_id: str, sequence: Any) -> tuple[int, str]:
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        raise WireError(
            WireCode.RECORD_INVALID,
            f"audit record {operation_id}#{sequence}: occurred time {value!r} is missing or "
            "not an ISO-8601 time with an offset",
        )
    moment = moment.astimezone(UTC)
    return int(moment.timestamp() * 1000), moment.isoformat().replace("+00:00", "Z")


def _classify(kind: str, outcome: Any) -> tuple[int, int, int]:
    if isinstance(outcome, str) and outcome in _OUTCOMES:
        return _OUTCOMES[outcome]
    return _KINDS.get(kind, _DEFAULT_CLASSIFICATION)


def audit_to_ocsf(record: Mapping[str, Any]) -> dict[str, Any]:
    """One audit record as an OCSF API Activity event (plain JSON-ready dict). Raises
    `WireError` (`record-invalid`) naming the operation and sequence when a chain field
    or the occurred time is missing: an audit event without its chain link is useless
    to an auditor, so it is refused rather than published incomplete."""
    return _event(_leaves(record))


def audit_to_ocsf_json(record: Mapping[str, Any]) -> bytes:
    """The same event as compact JSON with sorted keys, the bytes the relay publishes:
    exactly `json.dumps(audit_to_ocsf(record), sort_keys=True, separators=(",", ":"))`
    in UTF-8. Raises like `audit_to_ocsf`."""
    return canonical_ascii_json(_event(_leaves(record, _json_ready)))


def heads_to_ocsf(payload: Mapping[str, Any], occurred_at: str) -> dict[str, Any]:
    """A batch's `chain-heads` record (every audit chain it extended, with its newest
    sequence and hash) as an OCSF API Activity event of its own, `Other`, so that every
    record on the audit topic is OCSF: each chain is a resource, the heads themselves
    are under `unmapped.recovery.heads`. `occurred_at` is when the controller signed it
    (the record has no time of its own). Its `metadata.uid` is the SHA-256 of the heads'
    canonical JSON: the same heads give the same uid, as their record id repeats."""
    heads = [
        {
            "operation_id": str(h["operation_id"]),
            "sequence": int(h["sequence"]),
            "hash": str(h["hash"]),
        }
        for h in payload.get("heads") or ()
    ]
    uid = f"{HEADS_KIND}:sha256:{hashlib.sha256(canonical_ascii_json(heads)).hexdigest()}"
    time_ms, time_dt = _epoch_millis(occurred_at, HEADS_KIND, uid)
    event = _event(
        {
            **_classified(_KINDS[HEADS_KIND], time_ms, time_dt),
            "status_code": HEADS_KIND,
            "message": f"chain heads: {len(heads)} audit chain(s) extended by one batch",
            "uid": uid,
            "correlation_uid": uid,
            "kind": HEADS_KIND,
            "actor": PRODUCT_NAME,
            "operation": HEADS_KIND,
            "request_uid": uid,
            # Replaced below: one batch's heads span many operations.
            **dict.fromkeys(_PER_OPERATION),
        }
    )
    event["resources"] = [
        {
            "uid": h["operation_id"],
            "type": "audit-chain",
            "data": {"sequence": h["sequence"], "hash": h["hash"]},
        }
        for h in heads
    ]
    event["unmapped"] = {
        "recovery": {"kind": HEADS_KIND, "format": payload.get("format"), "heads": heads}
    }
    return event


def _classified(classes: tuple[int, int, int], time_ms: int, time_dt: str) -> dict[str, Any]:
    """The class and time leaves of `_event`, from (activity, status, severity) ids."""
    activity_id, status_id, severity_id = classes
    return {
        "activity_id": activity_id,
        "activity_name": _ACTIVITY_NAMES[activity_id],
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": f"API Activity: {_ACTIVITY_NAMES[activity_id]}",
        "time": time_ms,
        "time_dt": time_dt,
        "severity_id": severity_id,
        "severity": _SEVERITY_NAMES[severity_id],
        "status_id": status_id,
        "status": _STATUS_NAMES[status_id],
    }


# The leaves of `_event` that belong to one operation's chain link.
_PER_OPERATION: Final = (
    "operation_id",
    "resource_name",
    "state_before",
    "state_after",
    "sequence",
    "hash",
    "prev_hash",
    "machine_name",
    "machine_version",
    "machine_digest",
    "record",
)


def ocsf_kind(event: Mapping[str, Any]) -> str | None:
    """The audit kind of a record read from the audit topic: `metadata.event_code` of an
    OCSF event, else the `kind` of the plain JSON an older controller published for
    chain heads and tombstones."""
    metadata = event.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("event_code"), str):
        return str(metadata["event_code"])
    kind = event.get("kind")
    return kind if isinstance(kind, str) else None


def _leaves(
    record: Mapping[str, Any], body: Callable[[Any], Any] = lambda value: _plain(value)
) -> dict[str, Any]:
    """Every value of the event that depends on the record, by name (see `_event`);
    `body` makes the audit body JSON-ready."""
    missing = [name for name in _REQUIRED if record.get(name) in (None, "")]
    operation_id = str(record.get("operation_id") or "<no operation_id>")
    sequence = record.get("sequence")
    if missing:
        raise WireError(
            WireCode.RECORD_INVALID,
            f"audit record {operation_id}#{sequence}: missing {', '.join(missing)}",
        )
    kind = str(record["kind"])
    fields = _fields(record)
    time_ms, time_dt = _epoch_millis(fields["occurred"], operation_id, sequence)
    outcome = fields["outcome"]
    name, version = fields["machine_name"], fields["machine_version"]
    return {
        **_classified(_classify(kind, outcome), time_ms, time_dt),
        "status_code": _status_code(kind, outcome, fields["code"]),
        "message": _message(operation_id, kind, fields),
        "uid": str(record["hash"]),
        # An operation is the unit every record of one chain correlates on; an event's
        # own correlation id is more precise when the record has one.
        "correlation_uid": str(_first(fields["correlation_id"], operation_id)),
        "kind": kind,
        "actor": str(fields["actor"] or PRODUCT_NAME),
        "operation": str(fields["event_type"] or kind),
        # The event the record is about; a record no event caused (a lineage change, a
        # dead letter without an event id) names itself by its deterministic record id.
        "request_uid": str(_first(fields["event_id"], f"audit:{operation_id}:{sequence}")),
        "operation_id": operation_id,
        "resource_name": None if name is None else f"{name}@{version}",
        "state_before": fields["state_before"],
        "state_after": fields["state_after"],
        "sequence": sequence,
        "hash": record["hash"],
        "prev_hash": record.get("prev_hash"),
        "machine_name": name,
        "machine_version": version,
        "machine_digest": fields["machine_digest"],
        "record": body(record.get("record")),
    }


def _event(v: Mapping[str, Any]) -> dict[str, Any]:
    """The OCSF event around the leaves `_leaves` computed: the one place its shape is
    written down (`heads_to_ocsf` replaces only its resources and `unmapped`)."""
    actor = v["actor"]
    return {
        "category_uid": CATEGORY_UID,
        "category_name": "Application Activity",
        "class_uid": CLASS_UID,
        "class_name": "API Activity",
        "activity_id": v["activity_id"],
        "activity_name": v["activity_name"],
        "type_uid": v["type_uid"],
        "type_name": v["type_name"],
        "time": v["time"],
        "time_dt": v["time_dt"],
        "severity_id": v["severity_id"],
        "severity": v["severity"],
        "status_id": v["status_id"],
        "status": v["status"],
        "status_code": v["status_code"],
        "message": v["message"],
        "metadata": {
            "version": OCSF_VERSION,
            "uid": v["uid"],
            "correlation_uid": v["correlation_uid"],
            # The standard stream name, also where topics are renamed: SIEM rules key on it.
            "log_name": DEFAULT_TOPICS.audit,
            "event_code": v["kind"],
            "product": {"name": PRODUCT_NAME, "vendor_name": VENDOR_NAME},
        },
        "actor": {"user": {"uid": actor, "name": actor}, "app_name": PRODUCT_NAME},
        "api": {
            "operation": v["operation"],
            "service": {"name": PRODUCT_NAME},
            "request": {"uid": v["request_uid"]},
        },
        "src_endpoint": {"name": actor},
        "cloud": {"provider": "self-managed"},
        "resources": [
            {
                "uid": v["operation_id"],
                "type": "agent-operation",
                "name": v["resource_name"],
                "data": {"state_before": v["state_before"], "state_after": v["state_after"]},
            }
        ],
        "unmapped": {
            "recovery": {
                "chain": {
                    "operation_id": v["operation_id"],
                    "sequence": v["sequence"],
                    "hash": v["hash"],
                    "prev_hash": v["prev_hash"],
                },
                "machine": {
                    "name": v["machine_name"],
                    "version": v["machine_version"],
                    "digest": v["machine_digest"],
                },
                "record": v["record"],
            }
        },
    }


def _first(value: Any, fallback: str) -> Any:
    return fallback if value is None else value


def _status_code(kind: str, outcome: Any, code: Any) -> str:
    """The decision outcome, else the record's own code (a dead letter's reason, a
    lineage record's kind), else the audit kind: never empty."""
    for value in (outcome, code):
        if isinstance(value, str) and value:
            return value
    return {"operation-opened": "opened", "event-conflict": "event-id-conflict"}.get(kind, kind)


def _message(operation_id: str, kind: str, fields: Mapping[str, Any]) -> str:
    event_type, outcome = fields["event_type"], fields["outcome"]
    before, after = fields["state_before"], fields["state_after"]
    text = f"operation {operation_id}: {kind}"
    if event_type:
        text += f" {event_type}"
    if outcome:
        text += f" {outcome}"
    if before or after:
        text += f" ({before} -> {after})"
    return text


def _json_ready(value: Any) -> Any:
    """`value` itself when it is JSON already (what the ledger stores: dicts with
    string keys, lists, strings, numbers, booleans, None), else its `_plain` copy: the
    JSON text is the same, without copying every audit body."""
    return value if _is_json(value) else _plain(value)


def _is_json(value: Any) -> bool:
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _is_json(item):
                return False
        return True
    if kind is list:
        for item in value:
            if not _is_json(item):
                return False
        return True
    return kind is str or kind is int or kind is float or kind is bool or value is None


def _plain(value: Any) -> Any:
    # Exact types first: audit records come from the ledger as JSON (dicts, lists, str,
    # numbers), and the ABC checks below cost more than the copy itself. Anything else
    # (other mappings, tuples, datetimes, subclasses) takes the general path.
    kind = type(value)
    if kind is str or kind is int or kind is bool or kind is float or value is None:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value
