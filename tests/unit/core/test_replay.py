"""`machines.replay`: recorded decisions recomputed from recorded events and compared."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from machines import (
    CATALOGUE,
    DEFAULT_REGISTRY,
    Arrival,
    BatchFold,
    Policy,
    Rules,
    compare_decisions,
    load_machine,
    load_registry,
    replay_decisions,
)
from tests.unit.core.test_review_packet import OP, T0, _event


def test_replay_reproduces_the_controllers_fold_and_names_an_edited_field() -> None:
    registry = load_registry(DEFAULT_REGISTRY)
    email = load_machine(Path(CATALOGUE) / "email-send", registry)
    rules = Rules(Policy(id="default"), registry)
    events = [
        _event(email, "TOOL_TIMEOUT", "evt-1", T0),
        _event(email, "STEP_COMPLETED", "evt-2", T0 + timedelta(seconds=5)),
    ]
    times = [T0 + timedelta(seconds=1), T0 + timedelta(seconds=6)]
    fold = BatchFold({}, rules)
    recorded = []
    for event, now in zip(events, times, strict=True):
        decision = fold.decider(event, email, now)()
        fold.fold(event, decision)
        recorded.append(decision.to_dict())

    replayed = replay_decisions(email, rules, events, times, Arrival(OP))
    assert compare_decisions(OP, recorded, replayed) == ()

    edited = [dict(recorded[0], state_after="abandoned"), recorded[1]]
    (mismatch,) = compare_decisions(OP, edited, replayed)
    assert (mismatch.sequence, mismatch.fields) == (1, ("state_after",))
    assert "recorded 'abandoned', replayed 'unresolved'" in mismatch.describe()

    # A decision decided at another time replays differently where time shows.
    later = replay_decisions(email, rules, events, [times[0], times[1] + timedelta(1)], Arrival(OP))
    (moved,) = compare_decisions(OP, recorded, later)
    assert "decided_at" in moved.fields

    (missing,) = compare_decisions(OP, recorded[:1], replayed)
    assert missing.fields == ("count",)


def test_replay_decides_each_event_under_the_policy_its_decision_names() -> None:
    registry = load_registry(DEFAULT_REGISTRY)
    email = load_machine(Path(CATALOGUE) / "email-send", registry)
    before, after = Policy(id="before"), Policy(id="after", max_retry_attempts=1)
    events = [
        _event(email, "TOOL_TIMEOUT", "evt-1", T0),
        _event(email, "STEP_COMPLETED", "evt-2", T0 + timedelta(seconds=5)),
    ]
    times = [T0 + timedelta(seconds=1), T0 + timedelta(seconds=6)]
    fold = BatchFold({}, Rules(before, registry))
    recorded = []
    # A reload between the two events: the second is decided under the new policy.
    for event, now, policy in zip(events, times, (before, after), strict=True):
        fold.rules = Rules(policy, registry)
        decision = fold.decider(event, email, now)()
        fold.fold(event, decision)
        recorded.append(decision.to_dict())
    assert [d["policy_digest"] for d in recorded] == [before.digest, after.digest]

    rules = Rules(after, registry)
    (wrong,) = compare_decisions(
        OP, recorded, replay_decisions(email, rules, events, times, Arrival(OP))
    )
    assert "policy_digest" in wrong.fields
    replayed = replay_decisions(email, rules, events, times, Arrival(OP), policies=[before, after])
    assert compare_decisions(OP, recorded, replayed) == ()
