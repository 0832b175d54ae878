"""`recoveryctl lineage`'s report over the in-memory ledger: the whole tree from the
topmost known ancestor, effects from trusted evidence, commands with their answers."""

from __future__ import annotations

from dataclasses import replace

from ledger import MemoryLedger
from machines.event import EvidencePayload
from ops.commands.lineage import lineage_report, render_text
from tests.unit.ledger.ledger_support import GROUP, TOPIC, VERIFIER, feed
from tests.unit.ledger.lineage_contract import tree_event


def _tree() -> MemoryLedger:
    ledger = MemoryLedger()
    (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
    unknown = EvidencePayload(verifier=VERIFIER, outcome="unknown", reference="ref://a/unknown")
    feed(
        ledger,
        [
            tree_event("a", 0, "STEP_FAILED", parent="root"),
            tree_event("a1", 0, "STEP_FAILED", parent="a"),
            replace(
                tree_event("a", 1, "VERIFICATION_UNAVAILABLE"),
                producer=VERIFIER,
                evidence=unknown,
            ),
            tree_event("root", 0, "AUTHORIZATION_DENIED"),
        ],
        epoch=claim.epoch,
    )
    return ledger


def test_the_report_of_a_leaf_shows_the_whole_tree_from_its_root() -> None:
    report = lineage_report(_tree(), "a1")
    assert report["root"] == "root"
    assert [(o["operation_id"], o["depth"]) for o in report["operations"]] == [
        ("root", 0),
        ("a", 1),
        ("a1", 2),
    ]
    root = report["operations"][0]
    assert root["containing"] is True
    assert [c["capability"] for c in root["commands"]] == [
        "agent.stop-task",
        "credentials.revoke-delegation",
        "human.escalate",
    ]
    assert all(c["answered_by"] is None for c in root["commands"])


def test_effects_come_from_trusted_verifications() -> None:
    report = lineage_report(_tree(), "root")
    a = next(o for o in report["operations"] if o["operation_id"] == "a")
    assert a["effects"]["unknown"] == ["ref://a/unknown"]
    assert a["effects"]["confirmed"] == []
    assert a["contained_ancestors"] == ["root"]


def test_the_text_form_marks_the_asked_operation_and_containment() -> None:
    text = render_text(lineage_report(_tree(), "a"))
    assert "a *  [escalated]" in text
    assert "CONTAINING since root#1/root-e0" in text
    assert "held by contained root" in text
    # A stop waits for its result; an escalation expects none.
    assert "root:1:0 agent.stop-task (stop) for AUTHORIZATION_DENIED: open" in text
    assert "root:1:2 human.escalate (escalate) for AUTHORIZATION_DENIED: sent" in text
