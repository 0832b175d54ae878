"""canonical-json/1 is what the standard library's `json.dumps(value, sort_keys=True,
separators=(",", ":"), ensure_ascii=False)` writes (docs/ledger.md). These bytes are
stored, hashed and published, so the one encoder (`machines.canonical_json`, orjson where
it writes the same bytes) is held to `json.dumps` over random values with what JSON must
escape, non-ASCII text, U+2028, lone surrogates, floats of every magnitude, NaN and
infinities, integers beyond 64 bits, and the non-JSON values the ledger hands it; and the
ledger's texts (decision records, command payloads, audit bodies and hashes) are checked
over random records and over every batch of the ledger benchmark."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from ledger import codec
from ledger.audit import genesis_hash, record_hash
from ledger.codec import command_json, decision_json, opened_json, view_json
from ledger.jsonutil import dumps
from ledger.records import Batch, batch_rows
from machines import (
    CATALOGUE,
    canonical_ascii_json,
    canonical_json,
    canonical_text,
    load_catalogue,
    load_registry,
)
from machines.classifier import ClassifierRecord
from machines.compiled import GuardEvaluation
from machines.decision import Decision, Invocation, Outcome
from machines.digest import digest_of
from machines.event import canonical_bytes, sha256_digest
from machines.evidence import EvidenceDelta
from machines.invariants import Notice
from machines.view import (
    Approval,
    Checkpoint,
    LineageStatus,
    OperationView,
    ToolFacts,
    Verification,
)
from ops.bench.ledger import build_batches
from tests.unit.ledger.ledger_support import opened_view

T = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _reference_default(value: Any) -> Any:
    # What the ledger's encoder does with non-JSON values, restated for the reference.
    if isinstance(value, MappingProxyType):
        return dict(value)
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def reference(value: Any) -> str:
    """The canonical encoding as the standard library's `json.dumps` writes it."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=_reference_default,
    )


# Strings with what JSON must escape, non-ASCII text and line separators.
texts = st.text(max_size=12) | st.sampled_from(
    ['"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "\u2028", "😀", "a\tb", "</x>", ""]
)
optional_texts = st.none() | texts
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63, max_value=2**80)
    | st.floats()
    | st.floats(min_value=-1e-3, max_value=1e-3)
    | st.sampled_from([1e-05, 9.999999999999999e-05, 1e-4, 1e16, -1e16, 1e22, 5e-324, -0.0])
    | texts
    | st.datetimes(timezones=st.just(UTC))
)
json_values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(texts, inner, max_size=3)
        | st.dictionaries(texts, inner, max_size=2).map(MappingProxyType)
        | st.frozensets(texts, max_size=3)
    ),
    max_leaves=12,
)


# Lone surrogates are a `str` but not UTF-8: `json.dumps` writes them, encoding fails.
with_surrogates = json_values | st.lists(
    json_values | st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"]), max_size=3
)


def _machine() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"name": texts, "version": texts, "digest": texts})


def _notice() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"code": texts, "message": texts})


def _invocation() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "command_id": texts,
            "capability": texts,
            "kind": texts,
            "material": st.booleans(),
            "params": st.dictionaries(texts, json_values, max_size=3),
            "origin": texts,
        }
    )


def _evidence() -> st.SearchStrategy[dict[str, Any]]:
    """Evidence blocks: any JSON, one verification (the common case the template writes
    itself), and blocks that only look like one."""
    verification = st.fixed_dictionaries(
        {"verifier": texts, "outcome": texts, "reference": texts, "epoch": st.integers()}
    )
    return (
        st.dictionaries(texts, json_values, max_size=3)
        | st.fixed_dictionaries({"verification": verification})
        | st.fixed_dictionaries(
            {"verification": st.dictionaries(texts, json_values, min_size=4, max_size=4)}
        )
        | st.fixed_dictionaries({"verification": json_values})
        | st.fixed_dictionaries({"verification": verification, "contained_ancestor": texts})
    )


def decision_records() -> st.SearchStrategy[dict[str, Any]]:
    """Records of `Decision.to_dict()`'s shape with arbitrary leaves."""
    guard = st.fixed_dictionaries(
        {
            "transition_index": st.integers(),
            "guard": texts,
            "implementation": optional_texts,
            "value": st.booleans(),
            "evidence": st.lists(texts, max_size=3),
            "error": optional_texts,
        }
    )
    event = st.fixed_dictionaries(
        {
            "id": texts,
            "type": texts,
            "correlation_id": texts,
            "time": texts,
            "evidence_ref": texts,
            "producer": texts,
            "payload_digest": texts,
            "causation": optional_texts,
        }
    )
    return st.fixed_dictionaries(
        {
            "operation_id": texts,
            "sequence": st.integers(),
            "machine": _machine(),
            "policy_digest": texts,
            "decided_at": texts,
            "event": event,
            "outcome": texts,
            "state_before": texts,
            "state_after": texts,
            "guards": st.lists(guard, max_size=3),
            "transition": st.none()
            | st.fixed_dictionaries({"index": st.integers(), "target": optional_texts}),
            "invocations": st.lists(_invocation(), max_size=3),
            "refusals": st.lists(_notice(), max_size=2),
            "errors": st.lists(_notice(), max_size=2),
            "evidence": _evidence(),
            "classifier": st.none() | st.dictionaries(texts, json_values, max_size=3),
            "approval": st.fixed_dictionaries({"used": optional_texts, "consumed": st.booleans()}),
        }
    )


def opened_bodies() -> st.SearchStrategy[dict[str, Any]]:
    """Bodies of `operation-opened` audit records with arbitrary leaves."""
    facts = st.fixed_dictionaries(
        {
            "idempotency_key": optional_texts,
            "side_effect_possible": st.booleans(),
            "side_effect_confirmed": st.booleans(),
            "compensation_supported": st.booleans(),
            "status_api": st.booleans(),
        }
    )
    return st.fixed_dictionaries(
        {
            "operation_id": texts,
            "correlation_id": texts,
            "machine": _machine(),
            "policy_digest": texts,
            "initial_state": texts,
            "initiating_principal": texts,
            "agent": texts,
            "runtime": optional_texts,
            "task": texts,
            "origin_operation": optional_texts,
            "parent_operation": optional_texts,
            "delegated_credentials": st.lists(texts, max_size=3),
            "facts": facts,
            "budget_limit": st.none() | st.integers(),
            "deadline": optional_texts,
            "opened_by_event": texts,
        }
    )


def old_command_payload(
    record: dict[str, Any], invocation: dict[str, Any], key: str | None, deadline: str | None
) -> dict[str, Any]:
    """The payload as `ledger.records` built it from the decision's attributes, which the
    record copies."""
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
        "idempotency_key": key,
        "deadline": deadline,
    }


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(with_surrogates)
def test_dumps_writes_what_json_dumps_writes(value: Any) -> None:
    assert dumps(value) == reference(value)
    assert canonical_text(value) == reference(value)


def _utf8_or_error(value: Any) -> bytes | str:
    try:
        return reference(value).encode("utf-8")
    except (TypeError, ValueError) as exc:  # a lone surrogate cannot be UTF-8
        return type(exc).__name__


def _bytes_or_error(encode: Any, value: Any) -> bytes | str:
    try:
        return bytes(encode(value))
    except (TypeError, ValueError) as exc:
        return type(exc).__name__


@FAST
@given(with_surrogates)
def test_the_canonical_bytes_are_the_utf8_of_what_json_dumps_writes(value: Any) -> None:
    expected = _utf8_or_error(value)
    assert _bytes_or_error(canonical_json, value) == expected
    assert _bytes_or_error(canonical_bytes, value) == expected
    if isinstance(expected, bytes):
        digest = "sha256:" + hashlib.sha256(expected).hexdigest()
        assert digest_of(value) == digest
        assert sha256_digest(value) == digest


@FAST
@given(with_surrogates)
def test_the_ascii_form_is_what_json_dumps_writes_with_ensure_ascii(value: Any) -> None:
    try:
        expected: bytes | str = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        expected = type(exc).__name__
    assert _bytes_or_error(canonical_ascii_json, value) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (
            {"b": 1, "a": [1, 2], "é": "\u2028", "A": None},
            '{"A":null,"a":[1,2],"b":1,"é":"\u2028"}',
        ),
        ({"x": '\x00\x1f\x7f"\\'}, '{"x":"\\u0000\\u001f\x7f\\"\\\\"}'),
        ([1e-05, 1e-4, 1e16, 0.1, -0.0], "[1e-05,0.0001,1e+16,0.1,-0.0]"),
        ([float("nan"), float("inf"), -float("inf")], "[NaN,Infinity,-Infinity]"),
        ([2**64, -(2**70)], f"[{2**64},{-(2**70)}]"),
        ({2: "a", 10: "b"}, '{"2":"a","10":"b"}'),
        (
            (T, frozenset({"b", "a"}), MappingProxyType({"k": ()})),
            '["2026-01-01T12:00:00+00:00",["a","b"],{"k":[]}]',
        ),
    ],
)
def test_canonical_json_1_is_pinned(value: Any, text: str) -> None:
    """The form, written out: changing any of these bytes is canonical-json/2."""
    assert canonical_text(value) == text
    assert canonical_json(value) == text.encode("utf-8")


@pytest.mark.parametrize("value", [object(), {"k": {1, "a"}}, [b"bytes"]])
def test_what_is_not_plain_data_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


@FAST
@given(decision_records())
def test_a_decision_record_is_written_as_json_dumps_writes_it(record: dict[str, Any]) -> None:
    assert decision_json(record) == reference(record)


@FAST
@given(decision_records().filter(lambda r: bool(r["invocations"])), optional_texts, optional_texts)
def test_a_command_payload_is_written_as_json_dumps_writes_it(
    record: dict[str, Any], key: str | None, deadline: str | None
) -> None:
    for invocation in record["invocations"]:
        expected = reference(old_command_payload(record, invocation, key, deadline))
        assert command_json(record, invocation, key, deadline) == expected


@FAST
@given(opened_bodies())
def test_an_opened_body_is_written_as_json_dumps_writes_it(body: dict[str, Any]) -> None:
    assert opened_json(body) == reference(body)


@FAST
@given(texts, st.integers(min_value=1), texts, texts, json_values)
def test_audit_hashes_are_sha256_of_the_canonical_json(
    operation_id: str, sequence: int, kind: str, prev_hash: str, body: Any
) -> None:
    def sha(value: Any) -> str:
        return "sha256:" + hashlib.sha256(reference(value).encode("utf-8")).hexdigest()

    assert genesis_hash(operation_id) == sha({"genesis": operation_id})
    linked = {
        "operation_id": operation_id,
        "sequence": sequence,
        "kind": kind,
        "prev_hash": prev_hash,
        "record": body,
    }
    assert record_hash(operation_id, sequence, kind, prev_hash, dumps(body)) == sha(linked)


def full_decision() -> Decision:
    """A decision with every optional part filled in."""
    evidence = EvidenceDelta(
        verification=Verification("verifier-1", "applied", "ref://1", "e-1", 2),
        approval=Approval("alice", "s", "t", "sha256:m", T, "nonce-1", "approved", "e-1"),
        checkpoint=Checkpoint("c-1", T, "ref://c", True, "v-1", "sha256:m", "sha256:p", T, "e"),
        contained_ancestor="op-root",
        facts=ToolFacts("key-1", True, False, True, True, "tool"),
    )
    return Decision(
        operation_id="op-1",
        sequence=3,
        machine_name="delegated-research",
        machine_version="1.0.0",
        machine_digest="sha256:m",
        policy_digest="sha256:p",
        decided_at=T,
        event_id="e-1",
        event_type="HUMAN_APPROVED",
        correlation_id="corr-1",
        event_time=T - timedelta(seconds=1),
        evidence_ref="evidence://1",
        producer="approver-ui",
        payload_digest="sha256:d",
        causation="op-1:2:0",
        outcome=Outcome.TRANSITIONED,
        state_before="awaiting-approval",
        state_after="resuming",
        guards=(GuardEvaluation(0, "approval.valid", "standard.approval", True, ("e-1",), None),),
        transition_index=0,
        transition_target="resuming",
        invocations=(
            Invocation(
                "op-1:3:0", "research.resume", "resume", True, MappingProxyType({"n": 1}), "entry"
            ),
        ),
        refusals=(Notice("r", 'refused: é "quoted"'),),
        errors=(Notice("guard-error", "line\nbreak"),),
        evidence=evidence,
        classifier=ClassifierRecord("clf", "1", "q?", (("yes", 0.25),), "HUMAN_APPROVED", True),
        approval_used="e-1",
        approval_consumed=True,
    )


def test_a_decision_with_every_part_and_its_command_are_what_json_dumps_writes() -> None:
    record = full_decision().to_dict()
    assert decision_json(record) == reference(record)
    for invocation in record["invocations"]:
        expected = reference(old_command_payload(record, invocation, "k", "d"))
        assert command_json(record, invocation, "k", "d") == expected
    assert opened_json(_opened_example()) == reference(_opened_example())


def _opened_example() -> dict[str, Any]:
    return {
        "operation_id": "op-1",
        "correlation_id": "corr-1",
        "machine": {"name": "m", "version": "1", "digest": "sha256:m"},
        "policy_digest": "sha256:p",
        "initial_state": "s",
        "initiating_principal": "alice",
        "agent": "agent-1",
        "runtime": None,
        "task": "t",
        "origin_operation": None,
        "parent_operation": None,
        "delegated_credentials": ["cred"],
        "facts": {
            "idempotency_key": None,
            "side_effect_possible": True,
            "side_effect_confirmed": False,
            "compensation_supported": False,
            "status_api": False,
        },
        "budget_limit": 3,
        "deadline": None,
        "opened_by_event": "e-0",
    }


def _bench_batches() -> list[Batch]:
    registry = load_registry()
    machine = load_catalogue(registry, CATALOGUE)["delegated-research"]
    batches = build_batches(machine, registry, 60, 20)
    return [b for batch in batches for b in (batch, replace(batch, folded=None))]


def test_every_text_of_the_benchmark_batches_is_what_json_dumps_writes() -> None:
    for batch in _bench_batches():
        plan = batch_rows(batch)
        by_event = {e.decision.event_id: e.decision for e in batch.entries}
        for row in plan.decisions:
            assert row.decision_json == reference(row.decision)
            assert row.decision == by_event[row.event_id].to_dict()
        for item in plan.audit:
            assert item.body_json == reference(item.body)
        commands = {c.record_id: c for c in plan.commands}
        for entry in batch.entries:
            record = entry.decision.to_dict()
            for invocation in record["invocations"]:
                command = commands.get(invocation["command_id"])
                if command is None:  # a duplicate: recorded before, no command now
                    continue
                facts = (batch.folded or {}).get(entry.decision.operation_id)
                payload = json.loads(command.payload_json)
                if facts is not None:
                    assert payload["idempotency_key"] == facts.facts.idempotency_key
                expected = old_command_payload(
                    record, invocation, payload["idempotency_key"], payload["deadline"]
                )
                assert command.payload_json == reference(expected)


def _adapter_view_json(view: OperationView) -> str:
    """The view's column text as `view_json` wrote it before its own serializer: the
    view copied with a plain dict of seen events, then pydantic's adapter."""
    plain = replace(view, seen_events=dict(view.seen_events))
    return TypeAdapter(OperationView).dump_json(plain).decode("utf-8")


def rich_view() -> OperationView:
    """A view with every field set, seen events in a read-only mapping as the core
    keeps them."""
    return replace(
        opened_view("op-1", "agent-1"),
        lineage=LineageStatus("agent-1", frozenset({"a", "b"}), ("root",)),
        deadline=T,
        verifications=(Verification("v-1", "not_applied", "ref://1", "e-1", 1),),
        approvals=(Approval("h-1", "s", "t", "sha256:x", T, "n-1", "approved", "e-2", True),),
        checkpoints=(
            Checkpoint("c-1", T, "ref://c", True, "v-1", "sha256:m", "sha256:p", T, "e-3"),
        ),
        used_nonces=frozenset({"n-1", "n-2"}),
        entry_approval="e-2",
        open_commands=frozenset({"op-1:3:0"}),
        seen_events=MappingProxyType({"e-1": "sha256:1", "é-2": "sha\n2"}),
    )


def test_the_view_column_text_is_the_adapters_text_without_copying_the_view() -> None:
    views = [rich_view(), replace(rich_view(), seen_events={"e": "d"}), opened_view("o", "a")]
    for batch in _bench_batches():
        views.extend(batch.views.values())
        views.extend((batch.folded or {}).values())
    for view in views:
        assert view_json(view) == _adapter_view_json(view)
    assert codec._view_serializer() is not None  # the fast path, not the fallback
