"""Recomputing recorded decisions from recorded events (recoverability paper §7.3).

A decision is checkable apart from its outcome: the ledger keeps every event an
operation was decided on and the time each was decided, so the decisions can be made
again through the pinned machine and policy and compared with what was recorded.
`replay_decisions` folds one operation's events through `machines.batch.BatchFold`,
the fold the controller runs, opening the operation as the controller does (its first
event's lineage agent, the lineage the ledger links it into) and deciding each event at
its recorded `decided_at`; `compare_decisions` names every decision whose recorded form
differs from the replayed one, field by field. Pure: no clock, no I/O.

An operation migrated to another version of its machine (`machines.migration`) is
replayed across the move: each event is decided by the version the operation's view
names at that point, and a `MIGRATION_APPROVED` event towards the version it names, so
`versions` (the pinned machines, `machines.Pins`) must hold every version the operation
ran under. An operation decided across a policy reload is replayed under the policy
each decision names (`policies`, which `recoveryctl replay --verify` finds in the audit
stream's rules records).

One limit: the lineage an operation is opened with is the one the ledger holds now. An
operation linked below an ancestor that was already containing when it arrived is
replayed as if it were not (that containment reached the view as a lineage column, not
as an event), so its first decisions may differ for that reason alone; the mismatch
then names the guards that read the lineage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import orjson

from machines.batch import BatchFold, Rules
from machines.containment import Arrival
from machines.decision import Decision
from machines.digest import canonical_json
from machines.event import Event
from machines.migration import MIGRATION_APPROVED
from machines.model import Machine
from machines.policy import Policy

__all__ = ["ReplayMismatch", "compare_decisions", "replay_decisions"]


@dataclass(frozen=True, slots=True)
class ReplayMismatch:
    """One recorded decision that the replay does not reproduce (or a count that
    differs: `sequence` is then the first one missing on either side)."""

    operation_id: str
    sequence: int
    event_id: str | None
    fields: tuple[str, ...]
    recorded: Mapping[str, Any]
    replayed: Mapping[str, Any]

    def describe(self) -> str:
        """One line for an operator: which decision, which fields, both values."""
        shown = ", ".join(
            f"{f}: recorded {self.recorded.get(f)!r}, replayed {self.replayed.get(f)!r}"
            for f in self.fields
        )
        return (
            f"operation {self.operation_id}: decision {self.sequence} (event "
            f"{self.event_id or '-'}) does not replay: {shown}; the decision row or its event "
            "was altered, or it was decided under other rules: investigate before trusting it"
        )


def replay_decisions(
    machine: Machine,
    rules: Rules,
    events: Sequence[Event],
    decided_at: Sequence[datetime],
    arrival: Arrival,
    versions: Mapping[str, Machine] | None = None,
    policies: Sequence[Policy] | None = None,
) -> tuple[Decision, ...]:
    """Decide one operation's `events` again, in order, each at its `decided_at`,
    opening the operation with `arrival` on `machine`; later events are decided by the
    version in `versions` (by `name@version`) whose digest the operation's view names,
    each under its policy in `policies` (aligned with `events`; default: `rules`'s) (see
    the module docstring)."""
    if len(events) != len(decided_at):
        raise ValueError(f"{len(events)} events but {len(decided_at)} decision times")
    if policies is not None and len(policies) != len(events):
        raise ValueError(f"{len(events)} events but {len(policies)} policies")
    if not events:
        return ()
    fold = BatchFold({}, rules, {arrival.operation_id: arrival})
    by_digest = {m.digest: m for m in (versions or {}).values()}
    decisions = []
    for index, (event, now) in enumerate(zip(events, decided_at, strict=True)):
        if policies is not None:
            fold.rules = replace(rules, policy=policies[index])
        view = fold.known(event.operation_id)
        governing = machine if view is None else by_digest.get(view.machine_digest, machine)
        target = None
        if event.event_type == MIGRATION_APPROVED and versions is not None:
            target = versions.get(f"{event.machine_name}@{event.machine_version}")
        decision = fold.decider(event, governing, now, target=target)()
        fold.fold(event, decision)
        decisions.append(decision)
    return tuple(decisions)


def _plain(record: Mapping[str, Any]) -> dict[str, Any]:
    # Both sides through the canonical encoder, so tuples, datetimes and key order
    # cannot make equal decisions look different.
    value: dict[str, Any] = orjson.loads(canonical_json(dict(record)))
    return value


def compare_decisions(
    operation_id: str, recorded: Sequence[Mapping[str, Any]], replayed: Sequence[Decision]
) -> tuple[ReplayMismatch, ...]:
    """Every recorded decision that differs from its replay, in sequence order."""
    mismatches = []
    for want, got in zip(recorded, replayed, strict=False):
        a, b = _plain(want), _plain(got.to_dict())
        if a != b:
            keys = tuple(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)))
            mismatches.append(
                ReplayMismatch(
                    operation_id, int(a.get("sequence", got.sequence)), got.event_id, keys, a, b
                )
            )
    if len(recorded) != len(replayed):
        first = min(len(recorded), len(replayed))
        mismatches.append(
            ReplayMismatch(
                operation_id,
                first + 1,
                None,
                ("count",),
                {"count": len(recorded)},
                {"count": len(replayed)},
            )
        )
    return tuple(mismatches)
