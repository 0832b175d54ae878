"""JSON forms of the values the ledger stores: the `OperationView` in `operations.view`,
the tool facts in `operations.facts`, the event envelope in `events.envelope`, and the
canonical text of the decision record (`decisions.decision`, the body its audit record
hashes) and of a command's outbox payload.

`load_views` must give the decision core the very view `apply` produced, or a replayed
batch would be decided differently from the first time. The view's JSON form is the
decision core's own (`machines.view_to_json` / `view_from_json`, derived from the
dataclass, so a field added to the view is stored without a change here); the ledger's
tests hold `view_from_json(view_to_json(v)) == v` for views with every field set, and
the parity test compares views stored by PostgreSQL with the in-memory ledger's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any, cast

from pydantic import TypeAdapter
from pydantic_core import SchemaSerializer, core_schema

from ledger.jsonutil import column_json, dumps, dumps_leaf, dumps_str
from machines import view_from_json as _core_view_from_json
from machines import view_to_json as _core_view_to_json
from machines.event import Event
from machines.view import OperationView, ToolFacts

__all__ = [
    "command_json",
    "decision_json",
    "envelope_json",
    "facts_to_json",
    "opened_json",
    "view_from_json",
    "view_json",
    "view_to_json",
]


def view_to_json(view: OperationView) -> dict[str, Any]:
    """The view as plain JSON-ready data (the decision core's form)."""
    return _core_view_to_json(view)


@cache
def _view_adapter() -> TypeAdapter[OperationView]:
    # Built on first use, like the core's: the schema walk costs milliseconds.
    return TypeAdapter(OperationView)


@cache
def _view_serializer() -> SchemaSerializer | None:
    """pydantic's serializer of `OperationView`, with `seen_events` (a read-only mapping
    proxy, which the dict serializer refuses) copied into a dict by the serializer
    itself: copying the whole view with `replace` first cost twice the encoding. The
    text is the adapter's (a unit test compares them). None when pydantic's schema of
    the view does not have the shape this expects; `view_json` then copies the view."""
    schema = cast(dict[str, Any], copy.deepcopy(_view_adapter().core_schema))
    try:
        (field,) = (f for f in schema["schema"]["fields"] if f["name"] == "seen_events")
        mapping = field["schema"]["schema"]
        if mapping["type"] != "dict":
            return None
        as_dict = core_schema.dict_schema(mapping["keys_schema"], mapping["values_schema"])
    except (KeyError, TypeError, ValueError):
        return None
    mapping["serialization"] = core_schema.plain_serializer_function_ser_schema(
        dict, return_schema=as_dict
    )
    return SchemaSerializer(cast(core_schema.CoreSchema, schema))


def view_json(view: OperationView) -> str:
    """The JSON text of `view_to_json(view)` for the `operations.view` column, written by
    pydantic's serializer in one pass (a third of the time of building the dict and
    encoding it; the view is the largest value a batch writes per operation). Key order
    is the dataclass's, which no reader depends on (`view_from_json` takes a mapping); a
    unit test holds the value equal to `view_to_json`'s."""
    serializer = _view_serializer()
    if serializer is not None:
        return serializer.to_json(view).decode("utf-8")
    # The adapter's serializer knows dicts, not the read-only mapping proxy the view holds.
    plain = replace(view, seen_events=dict(view.seen_events))
    return _view_adapter().dump_json(plain).decode("utf-8")


def view_from_json(data: dict[str, Any]) -> OperationView:
    """Rebuild the exact `OperationView` that `view_to_json` wrote."""
    return _core_view_from_json(data)


def facts_to_json(facts: ToolFacts) -> dict[str, Any]:
    """The tool integration's declared facts as JSON (also the `operations.facts` column)."""
    return {
        "idempotency_key": facts.idempotency_key,
        "side_effect_possible": facts.side_effect_possible,
        "side_effect_confirmed": facts.side_effect_confirmed,
        "compensation_supported": facts.compensation_supported,
        "status_api": facts.status_api,
    }


def envelope_json(event: Event) -> str:
    """The JSON of `event.to_dict()` (the full envelope, SPEC §6.2) for the
    `events.envelope` column. The common shapes are encoded by `column_json` (nothing
    hashes this text, and readers load it whole); rarer shapes (human decisions,
    classifier output, checkpoints, the optional facts and scope blocks) by `dumps`, as
    they always were. A unit test holds both paths to the same value."""
    evidence = event.evidence
    if (
        event.human_decision is not None
        or event.classifier is not None
        or event.facts is not None
        or event.scope is not None
        or (evidence is not None and evidence.checkpoint is not None)
    ):
        return dumps(event.to_dict())
    return column_json(event.to_dict())


# The canonical texts below are `dumps` of a dict whose shape the decision core fixes
# (`Decision.to_dict`), written from a template with the keys already in sorted order:
# `dumps` spent most of its time on the dozens of constant keys and on sorting them, and
# the decision record is the largest text a batch hashes (about 10 us of 40 per event).
# Each template checks the shape it was written for (key counts; a missing key raises
# `KeyError`) and takes only strings where it writes strings (anything else raises
# `TypeError`); on either it falls back to `dumps`, so a shape it does not know costs
# time, never different bytes. tests/unit/ledger/test_canonical_templates.py holds every
# template to `dumps` over random records and the benchmark's batches.
_SHAPE_CHANGED = (KeyError, TypeError)


def decision_json(record: Mapping[str, Any]) -> str:
    """`dumps(record)` for a decision record (`Decision.to_dict()`): the text stored in
    `decisions.decision` and hashed in the decision's audit record."""
    try:
        return _decision_json(record)
    except _SHAPE_CHANGED:
        return dumps(record)


def command_json(
    record: Mapping[str, Any],
    invocation: Mapping[str, Any],
    idempotency_key: str | None,
    deadline: str | None,
) -> str:
    """`dumps` of a command's outbox payload: the invocation (`invocation`, one element of
    `record["invocations"]`) with the decision's operation, sequence, correlation id,
    machine, event and time (`record`, the decision record), the operation's declared
    `idempotency_key` and its `deadline` (ISO-8601 text)."""
    try:
        return _command_json(record, invocation, idempotency_key, deadline)
    except _SHAPE_CHANGED:
        return dumps(_command_payload(record, invocation, idempotency_key, deadline))


def _command_payload(
    record: Mapping[str, Any],
    invocation: Mapping[str, Any],
    idempotency_key: str | None,
    deadline: str | None,
) -> dict[str, Any]:
    """The payload `command_json` encodes, as a dict (the general path): the machine
    block is the decision's name, version and digest, whatever else the record holds."""
    event, machine = record["event"], record["machine"]
    return {
        **invocation,
        "operation_id": record["operation_id"],
        "sequence": record["sequence"],
        "correlation_id": event["correlation_id"],
        "machine": {
            "name": machine["name"],
            "version": machine["version"],
            "digest": machine["digest"],
        },
        "caused_by_event": event["id"],
        "decided_at": record["decided_at"],
        "idempotency_key": idempotency_key,
        "deadline": deadline,
    }


def opened_json(body: Mapping[str, Any]) -> str:
    """`dumps(body)` for the body of an `operation-opened` audit record
    (`ledger.records`): who opened the operation, under which machine, with which facts."""
    try:
        return _opened_json(body)
    except _SHAPE_CHANGED:
        return dumps(body)


def _decision_json(r: Mapping[str, Any]) -> str:
    approval, event, transition = r["approval"], r["event"], r["transition"]
    guards, errors, refusals = r["guards"], r["errors"], r["refusals"]
    if len(r) != 17 or len(approval) != 2 or len(event) != 8:
        raise KeyError("decision record shape")
    # The event is written inline and empty lists without a call: this runs for every
    # decided event. `x == []` holds only for an empty list (or list subclass), whose
    # text is `[]` whatever it is.
    return (
        f'{{"approval":{{"consumed":{_bool(approval["consumed"])},'
        f'"used":{dumps_leaf(approval["used"])}}},'
        f'"classifier":{dumps_leaf(r["classifier"])},'
        f'"decided_at":{dumps_str(r["decided_at"])},'
        f'"errors":{"[]" if errors == [] else _notices_json(errors)},'
        f'"event":{{"causation":{dumps_leaf(event["causation"])},'
        f'"correlation_id":{dumps_str(event["correlation_id"])},'
        f'"evidence_ref":{dumps_str(event["evidence_ref"])},'
        f'"id":{dumps_str(event["id"])},'
        f'"payload_digest":{dumps_str(event["payload_digest"])},'
        f'"producer":{dumps_str(event["producer"])},'
        f'"time":{dumps_str(event["time"])},'
        f'"type":{dumps_str(event["type"])}}},'
        f'"evidence":{_evidence_json(r["evidence"])},'
        f'"guards":{"[]" if guards == [] else _guards_json(guards)},'
        f'"invocations":{_invocations_json(r["invocations"])},'
        f'"machine":{_machine_json(r["machine"])},'
        f'"operation_id":{dumps_str(r["operation_id"])},'
        f'"outcome":{dumps_str(r["outcome"])},'
        f'"policy_digest":{dumps_str(r["policy_digest"])},'
        f'"refusals":{"[]" if refusals == [] else _notices_json(refusals)},'
        f'"sequence":{_int(r["sequence"])},'
        f'"state_after":{dumps_str(r["state_after"])},'
        f'"state_before":{dumps_str(r["state_before"])},'
        f'"transition":{"null" if transition is None else _transition_json(transition)}}}'
    )


def _command_json(
    r: Mapping[str, Any],
    inv: Mapping[str, Any],
    idempotency_key: str | None,
    deadline: str | None,
) -> str:
    event = r["event"]
    if len(inv) != 6:
        raise KeyError("invocation shape")
    return (
        f'{{"capability":{dumps_str(inv["capability"])},'
        f'"caused_by_event":{dumps_str(event["id"])},'
        f'"command_id":{dumps_str(inv["command_id"])},'
        f'"correlation_id":{dumps_str(event["correlation_id"])},'
        f'"deadline":{dumps_leaf(deadline)},'
        f'"decided_at":{dumps_str(r["decided_at"])},'
        f'"idempotency_key":{dumps_leaf(idempotency_key)},'
        f'"kind":{dumps_str(inv["kind"])},'
        f'"machine":{_machine_json(r["machine"])},'
        f'"material":{_bool(inv["material"])},'
        f'"operation_id":{dumps_str(r["operation_id"])},'
        f'"origin":{dumps_str(inv["origin"])},'
        f'"params":{dumps(inv["params"])},'
        f'"sequence":{_int(r["sequence"])}}}'
    )


def _opened_json(b: Mapping[str, Any]) -> str:
    if len(b) != 16:
        raise KeyError("opened record shape")
    return (
        f'{{"agent":{dumps_str(b["agent"])},'
        f'"budget_limit":{dumps_leaf(b["budget_limit"])},'
        f'"correlation_id":{dumps_str(b["correlation_id"])},'
        f'"deadline":{dumps_leaf(b["deadline"])},'
        f'"delegated_credentials":{_list_json(b["delegated_credentials"])},'
        f'"facts":{_facts_json(b["facts"])},'
        f'"initial_state":{dumps_str(b["initial_state"])},'
        f'"initiating_principal":{dumps_str(b["initiating_principal"])},'
        f'"machine":{_machine_json(b["machine"])},'
        f'"opened_by_event":{dumps_str(b["opened_by_event"])},'
        f'"operation_id":{dumps_str(b["operation_id"])},'
        f'"origin_operation":{dumps_leaf(b["origin_operation"])},'
        f'"parent_operation":{dumps_leaf(b["parent_operation"])},'
        f'"policy_digest":{dumps_str(b["policy_digest"])},'
        f'"runtime":{dumps_leaf(b["runtime"])},'
        f'"task":{dumps_str(b["task"])}}}'
    )


def _facts_json(f: Mapping[str, Any]) -> str:
    if len(f) != 5:
        raise KeyError("facts shape")
    return (
        f'{{"compensation_supported":{_bool(f["compensation_supported"])},'
        f'"idempotency_key":{dumps_leaf(f["idempotency_key"])},'
        f'"side_effect_confirmed":{_bool(f["side_effect_confirmed"])},'
        f'"side_effect_possible":{_bool(f["side_effect_possible"])},'
        f'"status_api":{_bool(f["status_api"])}}}'
    )


def _list_json(values: Any) -> str:
    return "[]" if type(values) is list and not values else dumps(values)


def _bool(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    raise TypeError("not a boolean")


def _int(value: Any) -> str:
    if type(value) is not int:
        raise TypeError("not an int")
    return int.__repr__(value)


# The text of each machine block seen, keyed by (digest, name, version): a process
# decides under a handful of machines, and every decision and command carries the block.
_MACHINE_TEXT: dict[tuple[str, str, str], str] = {}


def _machine_json(m: Mapping[str, Any]) -> str:
    if len(m) != 3:
        raise KeyError("machine shape")
    key = (m["digest"], m["name"], m["version"])
    text = _MACHINE_TEXT.get(key)
    if text is None:
        text = (
            f'{{"digest":{dumps_str(key[0])},"name":{dumps_str(key[1])},'
            f'"version":{dumps_str(key[2])}}}'
        )
        if len(_MACHINE_TEXT) < 64:  # bounded, whatever a caller feeds it
            _MACHINE_TEXT[key] = text
    return text


def _transition_json(t: Mapping[str, Any]) -> str:
    if len(t) != 2:
        raise KeyError("transition shape")
    return f'{{"index":{_int(t["index"])},"target":{dumps_leaf(t["target"])}}}'


def _evidence_json(evidence: Mapping[str, Any]) -> str:
    # Most decisions accept no evidence, and most that do accept one verification; the
    # other kinds are rare and varied, and go through `dumps`.
    if type(evidence) is not dict:
        return dumps(evidence)
    if not evidence:
        return "{}"
    v = evidence.get("verification")
    if len(evidence) != 1 or type(v) is not dict or len(v) != 4:
        return dumps(evidence)
    return (
        f'{{"verification":{{"epoch":{_int(v["epoch"])},"outcome":{dumps_str(v["outcome"])},'
        f'"reference":{dumps_str(v["reference"])},"verifier":{dumps_str(v["verifier"])}}}}}'
    )


def _notices_json(notices: Sequence[Mapping[str, Any]]) -> str:
    if type(notices) is not list:
        raise TypeError("not a list")
    parts = []
    for n in notices:
        if len(n) != 2:
            raise KeyError("notice shape")
        parts.append(f'{{"code":{dumps_str(n["code"])},"message":{dumps_str(n["message"])}}}')
    return f"[{','.join(parts)}]"


def _guards_json(guards: Sequence[Mapping[str, Any]]) -> str:
    if type(guards) is not list:
        raise TypeError("not a list")
    parts = []
    for g in guards:
        if len(g) != 6:
            raise KeyError("guard shape")
        parts.append(
            f'{{"error":{dumps_leaf(g["error"])},"evidence":{_list_json(g["evidence"])},'
            f'"guard":{dumps_str(g["guard"])},"implementation":{dumps_leaf(g["implementation"])},'
            f'"transition_index":{_int(g["transition_index"])},"value":{_bool(g["value"])}}}'
        )
    return f"[{','.join(parts)}]"


def _invocations_json(invocations: Sequence[Mapping[str, Any]]) -> str:
    if type(invocations) is not list:
        raise TypeError("not a list")
    parts = []
    for i in invocations:
        if len(i) != 6:
            raise KeyError("invocation shape")
        parts.append(
            f'{{"capability":{dumps_str(i["capability"])},'
            f'"command_id":{dumps_str(i["command_id"])},"kind":{dumps_str(i["kind"])},'
            f'"material":{_bool(i["material"])},"origin":{dumps_str(i["origin"])},'
            f'"params":{dumps(i["params"])}}}'
        )
    return f"[{','.join(parts)}]"
