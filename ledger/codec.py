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
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from typing import Any, cast

from pydantic import TypeAdapter
from pydantic_core import SchemaSerializer, core_schema

from ledger.jsonutil import column_json, dumps
from machines import Event, OperationView, ToolFacts
from machines import view_from_json as _core_view_from_json
from machines import view_from_json_text as _core_view_from_text
from machines import view_to_json as _core_view_to_json

__all__ = [
    "command_json",
    "decision_json",
    "envelope_json",
    "facts_to_json",
    "opened_json",
    "view_from_json",
    "view_from_text",
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


def view_from_text(text: str | bytes) -> OperationView:
    """`view_from_json` of the column's text (`view_json`), parsed and validated in one
    pass: what `PostgresLedger.load_views` reads every batch."""
    return _core_view_from_text(text)


def facts_to_json(facts: ToolFacts) -> dict[str, Any]:
    """The tool integration's declared facts as JSON (also the `operations.facts` column)."""
    return {
        "idempotency_key": facts.idempotency_key,
        "side_effect_possible": facts.side_effect_possible,
        "side_effect_confirmed": facts.side_effect_confirmed,
        "compensation_supported": facts.compensation_supported,
        "status_api": facts.status_api,
        "arguments_digest": facts.arguments_digest,
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


def decision_json(record: Mapping[str, Any]) -> str:
    """The canonical text of a decision record (`Decision.to_dict()`): the text stored in
    `decisions.decision` and hashed in the decision's audit record."""
    return dumps(record)


def command_json(
    record: Mapping[str, Any],
    invocation: Mapping[str, Any],
    idempotency_key: str | None,
    deadline: str | None,
) -> str:
    """The canonical text of a command's outbox payload: the invocation (`invocation`, one
    element of `record["invocations"]`) with the decision's operation, sequence,
    correlation id, machine, event and time (`record`, the decision record), the
    operation's declared `idempotency_key` and its `deadline` (ISO-8601 text). The machine
    block is the decision's name, version and digest, whatever else the record holds."""
    event, machine = record["event"], record["machine"]
    return dumps(
        {
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
    )


def opened_json(body: Mapping[str, Any]) -> str:
    """The canonical text of the body of an `operation-opened` audit record
    (`ledger.records`): who opened the operation, under which machine, with which facts."""
    return dumps(body)
