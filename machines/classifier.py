"""The classifier boundary (SPEC §11): record the proposal, validate it, fail closed.

A classifier may turn a raw failure signal into a candidate event. The core records its
identity, version, question and probabilities as evidence distinct from any guard
decision, and refuses the event when the output is missing, malformed, not confident
enough, conflicting, disagrees with the event it rides on, or proposes an event that
carries authority. An accepted candidate is then validated like any other event; no
guard can read the classifier record because the guard context does not hold it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from machines.event import Event
from machines.invariants import Notice
from machines.policy import Policy


@dataclass(frozen=True, slots=True)
class ClassifierRecord:
    """What the classifier said and whether the core admitted its candidate."""

    identity: str
    version: str
    question: str
    probabilities: tuple[tuple[str, float], ...]
    candidate: str | None
    admitted: bool
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return {
            "identity": self.identity,
            "version": self.version,
            "question": self.question,
            "probabilities": dict(self.probabilities),
            "candidate": self.candidate,
            "admitted": self.admitted,
            "reason": self.reason,
        }


def _problem(event: Event, policy: Policy) -> str | None:
    output = event.classifier
    assert output is not None
    probs = output.probabilities
    if not probs or output.candidate_event is None:
        return "classifier-missing-output"
    values = list(probs.values())
    if any(not math.isfinite(p) or p < 0.0 or p > 1.0 for p in values) or sum(values) > 1.0001:
        return "classifier-malformed"
    ranked = sorted(probs.items(), key=lambda item: (-item[1], item[0]))
    top_event, top = ranked[0]
    second = ranked[1][1] if len(ranked) > 1 else 0.0
    if output.candidate_event != top_event or output.candidate_event != event.event_type:
        return "classifier-conflicting"
    if top - second < policy.classifier.min_margin:
        return "classifier-conflicting"
    if top < policy.classifier.min_confidence:
        return "classifier-low-confidence"
    if event.event_type not in policy.classifier.allowed_events:
        return "classifier-event-not-allowed"
    return None


def classifier_refusal(
    event: Event, policy: Policy
) -> tuple[ClassifierRecord | None, Notice | None]:
    """The classifier record for `event` (None when no classifier contributed) and the
    reason its candidate is refused, if it is. Refusal fails closed: the event is not
    decided on, and the decision escalates."""
    output = event.classifier
    if output is None:
        return None, None
    problem = _problem(event, policy)
    record = ClassifierRecord(
        identity=output.identity,
        version=output.version,
        question=output.question,
        probabilities=tuple(sorted(output.probabilities.items())),
        candidate=output.candidate_event,
        admitted=problem is None,
        reason=problem,
    )
    if problem is None:
        return record, None
    notice = Notice(
        problem,
        f"event {event.event_id}: classifier {output.identity} {output.version} candidate "
        f"{output.candidate_event} refused ({problem}); a probability is not evidence, so "
        "the signal is escalated for a human or a verifier",
    )
    return record, notice
