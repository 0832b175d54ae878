"""Moving one operation to another version of its machine (`machines.migration`): a
signed MIGRATION_APPROVED decision whose state mapping the new machine validates,
decided in the controller's batch and committed to the ledger."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from consumer import DecidedBatch, Intake, decide_batch
from consumer.batch import operation_ids, positions_for
from ledger import MemoryLedger
from machines import (
    MIGRATION_APPROVED,
    Arrival,
    HumanDecision,
    Machine,
    OperationView,
    Outcome,
    Pins,
    Policy,
    Rules,
    compare_decisions,
    mapping_refusal,
    migration_digest,
    public_key_b64,
    replay_decisions,
    sign_decision,
)
from tests.support.producers import key_of, with_roster
from tests.support.producers import roster as producer_roster
from tests.support.rollout import review_renamed, versioned
from tests.unit.consumer.support import CONTROLLER, GROUP, T0, TOPIC, encoded, event, pinned

APPROVER = "approver-1"
NOW = T0 + timedelta(minutes=1)


V1 = pinned()[0]["email-send@1.0.0"]
V2 = versioned("email-send", "2.0.0", review_renamed)


def _pins() -> Pins:
    return Pins({**pinned()[0], "email-send@2.0.0": V2}, {"email-send": "1.0.0"})


def _rules() -> Rules:
    policy = with_roster(
        Policy.model_validate(
            {
                "id": "migration-tests",
                "trusted_verifiers": ["verifier-1"],
                "approvers": [
                    {
                        "id": APPROVER,
                        "public_key": public_key_b64(key_of(APPROVER)),
                        "roles": ["recovery-approver"],
                    }
                ],
            }
        )
    )
    return Rules(policy=policy, registry=pinned()[1].registry)


def _plan(raws: list[Any], ledger: MemoryLedger, now: datetime = NOW) -> DecidedBatch:
    pins = _pins()
    intake = Intake(pins, roster=producer_roster(), max_record_bytes=65536)
    outcomes = [intake.examine(r) for r in raws]
    epochs = {(c.topic, c.partition): c.epoch for c in ledger.claim(GROUP, TOPIC, [0], "me")}
    return decide_batch(
        outcomes,
        ledger.load_views(operation_ids(outcomes)),
        _rules(),
        group=GROUP,
        controller=CONTROLLER,
        positions=positions_for(raws, epochs),
        now=now,
        pins=pins,
    )


def _opened() -> tuple[MemoryLedger, OperationView]:
    """An operation opened on version 1, waiting in `unresolved` with its commands open."""
    ledger = MemoryLedger()
    ledger.commit(_plan([encoded(event("TOOL_TIMEOUT"), 0)], ledger, T0).batch)
    view = ledger.load_views(["op-1"])["op-1"]
    assert (view.state, view.machine_digest) == ("unresolved", V1.digest)
    assert view.open_commands
    return ledger, view


def _migration(
    view: OperationView,
    to_state: str,
    *,
    nonce: str = "m-1",
    target: Machine = V2,
    reviewed: str | None = None,
    version: str | None = None,
    operation: str = "op-1",
    event_id: str | None = None,
) -> Any:
    decision = HumanDecision(
        approver=APPROVER,
        operation_id=view.operation_id,
        state=view.state,
        transition=to_state,
        machine_digest=view.machine_digest,
        expires_at=T0 + timedelta(hours=1),
        nonce=nonce,
        decision="approved",
        reviewed_digest=reviewed or migration_digest(view, target, to_state),
    )
    return event(
        MIGRATION_APPROVED,
        operation,
        event_id=event_id or f"migration:{nonce}",
        version=version or target.version,
        human_decision=sign_decision(decision, key_of(APPROVER)),
    )


def test_a_signed_migration_moves_the_operation_and_later_events_follow_the_new_version() -> None:
    ledger, view = _opened()
    planned = _plan([encoded(_migration(view, "awaiting-review"), 1)], ledger)
    assert not planned.refused, planned.refused
    (decision,) = planned.decisions
    assert decision.outcome is Outcome.TRANSITIONED
    assert (decision.machine_version, decision.machine_digest) == ("2.0.0", V2.digest)
    assert decision.invocations == ()
    record = decision.to_dict()
    assert record["migration"] == {
        "from": {"version": "1.0.0", "digest": V1.digest},
        "to": {"version": "2.0.0", "digest": V2.digest},
        "states": {"unresolved": "awaiting-review"},
    }
    ledger.commit(planned.batch)
    info = ledger.operation("op-1")
    assert (info.machine_version, info.machine_digest, info.state) == (
        "2.0.0",
        V2.digest,
        "awaiting-review",
    )
    moved = ledger.load_views(["op-1"])["op-1"]
    assert moved.open_commands == view.open_commands
    # A tool still naming version 1 is decided by version 2 now, the mismatch recorded.
    later = _plan([encoded(event("HUMAN_REJECTED", human_decision=None), 2)], ledger)
    (answer,) = later.decisions
    assert (answer.machine_digest, answer.named_version) == (V2.digest, "1.0.0")
    ledger.commit(later.batch)
    assert ledger.verify_audit() == ()
    # Replay decides each event under the version the operation ran it under.
    recorded = ledger.decisions("op-1")
    events = [event("TOOL_TIMEOUT"), _migration(view, "awaiting-review")]
    events.append(event("HUMAN_REJECTED", human_decision=None))
    times = [datetime.fromisoformat(d["decided_at"]) for d in recorded]
    replayed = replay_decisions(V1, _rules(), events, times, Arrival("op-1"), _pins())
    assert compare_decisions("op-1", recorded, replayed) == ()
    stuck = replay_decisions(V1, _rules(), events, times, Arrival("op-1"))
    assert compare_decisions("op-1", recorded, stuck) != ()


@pytest.mark.parametrize(
    ("to_state", "code"),
    [
        ("no-such-state", "migration-state-unknown"),
        ("abandoned", "migration-final"),
        ("triage", "migration-entry-unrun"),
        ("resume-pending", "migration-results-unrouted"),
    ],
)
def test_a_mapping_the_new_version_does_not_allow_is_refused_and_changes_nothing(
    to_state: str, code: str
) -> None:
    ledger, view = _opened()
    planned = _plan([encoded(_migration(view, to_state), 1)], ledger)
    (decision,) = planned.decisions
    assert decision.outcome is Outcome.REFUSED
    assert [n.code for n in decision.refusals] == [code]
    ledger.commit(planned.batch)
    info = ledger.operation("op-1")
    assert (info.machine_version, info.state) == ("1.0.0", "unresolved")


def test_a_migration_signed_for_another_plan_or_a_replayed_nonce_is_refused() -> None:
    ledger, view = _opened()
    stale = _migration(view, "awaiting-review", reviewed="sha256:" + "0" * 64)
    planned = _plan([encoded(stale, 1)], ledger)
    assert [n.code for n in planned.decisions[0].refusals] == ["approval-review-mismatch"]
    ledger.commit(planned.batch)
    ledger, view = _opened()
    ledger.commit(_plan([encoded(_migration(view, "awaiting-review"), 1)], ledger).batch)
    moved = ledger.load_views(["op-1"])["op-1"]
    again = _migration(moved, "awaiting-review", target=V1, event_id="migration:again")
    replayed = _plan([encoded(again, 2)], ledger)
    assert replayed.decisions[0].outcome is Outcome.REFUSED
    assert [r.code for _, r in replayed.refused] == ["forged-signature"]
    assert "nonce" in replayed.refused[0][1].reason


def test_a_migration_by_someone_not_an_approver_is_dead_lettered_as_forged() -> None:
    ledger, view = _opened()
    forged = _migration(view, "awaiting-review")
    decision = sign_decision(forged.human_decision, key_of("mallory"))
    raw = encoded(
        event(
            MIGRATION_APPROVED,
            event_id="migration:forged",
            version="2.0.0",
            human_decision=decision,
        ),
        1,
    )
    planned = _plan([raw], ledger)
    assert [r.code for _, r in planned.refused] == ["forged-signature"]
    assert ledger.operation("op-1").machine_version == "1.0.0"


def test_a_migration_of_an_unknown_operation_or_to_an_unpinned_version_is_dead_lettered() -> None:
    ledger, view = _opened()
    unknown = _migration(view, "awaiting-review", operation="op-9", event_id="m-9")
    unpinned = _migration(view, "awaiting-review", nonce="m-2", version="9.9.9")
    planned = _plan([encoded(unknown, 1), encoded(unpinned, 2)], ledger)
    assert [r.code for _, r in planned.refused] == [
        "migration-unknown-operation",
        "machine-unpinned",
    ]


def test_the_mapping_check_names_the_states_each_version_defines() -> None:
    _, view = _opened()
    notice = mapping_refusal(V1, V2, view, {"unresolved": "nowhere"})
    assert notice is not None
    assert "awaiting-review" in notice.message
    assert mapping_refusal(V1, V1, view, {"unresolved": "unresolved"}) is not None
    assert mapping_refusal(V1, V2, view, {"unresolved": "awaiting-review"}) is None
