"""JSON forms of the values the ledger stores: the `OperationView` in `operations.view`,
the tool facts in `operations.facts`, and the event envelope in `events.envelope`.

`load_views` must give the decision core the very view `apply` produced, or a replayed
batch would be decided differently from the first time. The view's JSON form is the
decision core's own (`machines.view_to_json` / `view_from_json`, derived from the
dataclass, so a field added to the view is stored without a change here); the ledger's
tests hold `view_from_json(view_to_json(v)) == v` for views with every field set, and
the parity test compares views stored by PostgreSQL with the in-memory ledger's.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

from pydantic import TypeAdapter

from ledger.jsonutil import column_json, dumps
from machines import view_from_json as _core_view_from_json
from machines import view_to_json as _core_view_to_json
from machines.event import Event
from machines.view import OperationView, ToolFacts

__all__ = ["envelope_json", "facts_to_json", "view_from_json", "view_json", "view_to_json"]


def view_to_json(view: OperationView) -> dict[str, Any]:
    """The view as plain JSON-ready data (the decision core's form)."""
    return _core_view_to_json(view)


@cache
def _view_adapter() -> TypeAdapter[OperationView]:
    # Built on first use, like the core's: the schema walk costs milliseconds.
    return TypeAdapter(OperationView)


def view_json(view: OperationView) -> str:
    """The JSON text of `view_to_json(view)` for the `operations.view` column, written by
    pydantic's serializer in one pass (a third of the time of building the dict and
    encoding it; the view is the largest value a batch writes per operation). Key order
    is the dataclass's, which no reader depends on (`view_from_json` takes a mapping); a
    unit test holds the value equal to `view_to_json`'s."""
    # The serializer knows dicts, not the read-only mapping proxy the view holds.
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
