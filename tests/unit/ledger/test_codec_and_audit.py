"""The pure parts of the ledger: the view codec, the envelope encoding, named-query
parsing and the audit hash chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from types import MappingProxyType

import pytest

from ledger.audit import AuditRecord, chain_records, genesis_head, verify_chain
from ledger.codec import envelope_json, view_from_json, view_from_text, view_json, view_to_json
from ledger.jsonutil import column_json, dumps
from ledger.queries import QUERIES, parse_queries
from machines.event import CheckpointReport, ClassifierOutput, EvidencePayload, HumanDecision
from machines.view import Approval, Checkpoint, LineageStatus, OperationView, Verification
from tests.unit.ledger.ledger_support import event, opened_view

T = datetime(2026, 1, 1, 12, tzinfo=UTC)


def test_a_rich_view_survives_the_json_round_trip_exactly() -> None:
    view = replace(
        opened_view("op-1", "agent-1"),
        lineage=LineageStatus("agent-1", frozenset({"a", "b"}), ("root",)),
        version=4,
        epoch=2,
        verifications=(Verification("v-1", "not_applied", "ref://1", "e-1", 1),),
        retry_attempts=1,
        budget_spent=1,
        approvals=(Approval("h-1", "s", "t", "sha256:x", T, "n-1", "approved", "e-2", True),),
        used_nonces=frozenset({"n-1"}),
        checkpoints=(
            Checkpoint("c-1", T, "ref://c", True, "v-1", "sha256:m", "sha256:p", None, "e-3"),
        ),
        entry_approval="e-2",
        open_commands=frozenset({"op-1:3:0", "op-1:3:1"}),
        seen_events=MappingProxyType({"e-1": "sha256:1", "e-2": "sha256:2"}),
    )
    stored = json.loads(dumps(view_to_json(view)))
    assert view_from_json(stored) == view
    # Every field is stored, so a field added to the view cannot be dropped silently.
    assert set(stored) == {f.name for f in fields(OperationView)}


def test_the_view_column_text_is_the_cores_json_form_of_the_view() -> None:
    view = replace(
        opened_view("op-1", "agent-1"),
        lineage=LineageStatus("agent-1", frozenset({"a", "b"}), ("root",)),
        deadline=T,
        approvals=(Approval("h-1", "s", "t", "sha256:x", T, "n-1", "approved", "e-2", True),),
        checkpoints=(
            Checkpoint("c-1", T, "ref://c", True, "v-1", "sha256:m", "sha256:p", T, "e-3"),
        ),
        used_nonces=frozenset({"n-1", "n-2"}),
        open_commands=frozenset({"op-1:3:0"}),
        seen_events=MappingProxyType({"e-1": "sha256:1", "é-2": "sha256:2"}),
    )
    assert json.loads(view_json(view)) == view_to_json(view)
    assert view_from_json(json.loads(view_json(view))) == view
    # What `load_views` reads: the column's text, parsed and validated in one pass.
    assert view_from_text(view_json(view)) == view
    assert view_from_text(view_json(view).encode()) == view


def test_column_json_refuses_what_it_cannot_store() -> None:
    assert json.loads(column_json({"a": [1, (2, "é")], "b": None})) == {
        "a": [1, [2, "é"]],
        "b": None,
    }
    with pytest.raises(TypeError, match="cannot store"):
        column_json({"a": MappingProxyType({})})


def test_envelope_fast_path_matches_the_events_own_encoding() -> None:
    plain = event("op-1", 0, "TOOL_TIMEOUT", parent="root")
    verified = event("op-1", 1, "VERIFICATION_FOUND", outcome="applied")
    human = replace(
        plain,
        human_decision=HumanDecision("h", "op-1", "s", "t", "sha256:m", T, "n", "approved"),
    )
    classified = replace(
        plain, classifier=ClassifierOutput("clf", "1", "q?", MappingProxyType({"yes": 0.9}))
    )
    checkpointed = replace(
        plain,
        evidence=EvidencePayload(checkpoint=CheckpointReport("c", T, "ref://c")),
    )
    for ev in (plain, verified, human, classified, checkpointed):
        assert json.loads(envelope_json(ev)) == json.loads(dumps(ev.to_dict()))


def test_named_queries_load_and_bad_files_are_refused() -> None:
    assert "lock_operations" in QUERIES
    assert "FOR UPDATE" in QUERIES["lock_operations"]
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    with pytest.raises(ValueError, match="empty"):
        parse_queries("-- name: a\n-- only a comment\n")


def _chain(op: str, n: int) -> list[AuditRecord]:
    bodies = [("decision", {"sequence": i, "at": T + timedelta(seconds=i)}) for i in range(n)]
    return chain_records(op, genesis_head(op), [(k, b, dumps(b)) for k, b in bodies])


def test_a_chain_links_every_record_to_the_previous_one() -> None:
    records = _chain("op-1", 3)
    assert [r.sequence for r in records] == [1, 2, 3]
    assert records[0].prev_hash == genesis_head("op-1").hash
    assert all(b.prev_hash == a.hash for a, b in pairwise(records))
    head = replace(genesis_head("op-1"), sequence=3, hash=records[-1].hash)
    assert verify_chain("op-1", records, head) is None


def test_a_chain_moved_to_another_operation_does_not_verify() -> None:
    records = _chain("op-1", 2)
    moved = [replace(r, operation_id="op-2") for r in records]
    head = replace(genesis_head("op-2"), sequence=2, hash=records[-1].hash)
    found = verify_chain("op-2", moved, head)
    assert found is not None
    assert (found.sequence, found.reason) == (1, "has a broken link")


def test_a_rehashed_forgery_is_caught_by_the_next_link() -> None:
    records = _chain("op-1", 3)
    forged_body = {"sequence": 99}
    forged = chain_records(
        "op-1", genesis_head("op-1"), [("decision", forged_body, dumps(forged_body))]
    )[0]
    tampered = [forged, *records[1:]]
    head = replace(genesis_head("op-1"), sequence=3, hash=records[-1].hash)
    found = verify_chain("op-1", tampered, head)
    assert found is not None
    assert (found.sequence, found.reason) == (2, "has a broken link")


_ROOT = Path(__file__).resolve().parents[3]
_WRITE_VIEW = """
from dataclasses import replace
from ledger.codec import view_json
from machines.view import LineageStatus
from tests.unit.ledger.ledger_support import opened_view
names = frozenset(f"item-{i}" for i in range(40))
view = replace(
    opened_view("op-1", "agent-1"),
    lineage=LineageStatus("agent-1", names, ()),
    used_nonces=names,
    open_commands=names,
)
print(view_json(view))
"""


def test_the_view_column_is_the_same_bytes_under_every_hash_seed() -> None:
    # Sets iterate in an order that follows PYTHONHASHSEED: unsorted, two controllers
    # storing the same view would write (and commit to, in the audit record's
    # view_digest) different bytes.
    texts = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", _WRITE_VIEW],
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(_ROOT)},
            capture_output=True,
            text=True,
            check=True,
        )
        texts.add(done.stdout)
    assert len(texts) == 1
    stored = json.loads(texts.pop())
    for name in ("used_nonces", "open_commands"):
        assert stored[name] == sorted(stored[name])
    assert stored["lineage"]["lineage_agents"] == sorted(stored["lineage"]["lineage_agents"])
