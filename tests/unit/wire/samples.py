"""Sample envelopes shared by the wire tests."""

from __future__ import annotations

from datetime import UTC, datetime

from machines.event import (
    CheckpointReport,
    ClassifierOutput,
    Event,
    EvidencePayload,
    HumanDecision,
    Lineage,
)

LINEAGE = Lineage(
    agent="agent-7",
    task="task-3",
    initiating_principal="alice@example.com",
    origin_operation="op-root",
    parent_operation="op-parent",
    delegated_credentials=("cred-a", "cred-b"),
)


def minimal_event(**overrides: object) -> Event:
    """An event with only the required fields."""
    fields: dict[str, object] = {
        "event_type": "TOOL_TIMEOUT",
        "event_id": "evt-1",
        "operation_id": "op-17",
        "correlation_id": "corr-1",
        "machine_name": "email-send",
        "machine_version": "1.0.0",
        "event_time": datetime(2026, 11, 30, 3, 0, 0, 123456, tzinfo=UTC),
        "evidence_ref": "smtp-log:42",
        "producer": "smtp-relay",
        "lineage": LINEAGE,
    }
    fields.update(overrides)
    return Event(**fields)  # type: ignore[arg-type]


def full_event() -> Event:
    """An event with every optional block filled in."""
    return minimal_event(
        event_type="HUMAN_APPROVED",
        evidence=EvidencePayload(
            outcome="not_applied",
            verifier="payment.verify-refund",
            reference="ledger:9",
            checkpoint=CheckpointReport(
                checkpoint_id="cp-1",
                saved_at=datetime(2026, 11, 30, 2, 0, tzinfo=UTC),
                reference="s3://cp/1",
                validated=True,
                validator="validator-1",
                validated_machine_digest="sha256:aa",
                validated_policy_digest="sha256:bb",
                valid_until=datetime(2026, 12, 1, tzinfo=UTC),
            ),
            ancestor_operation="op-root",
        ),
        human_decision=HumanDecision(
            approver="bob",
            operation_id="op-17",
            state="unresolved",
            transition="resume-pending",
            machine_digest="sha256:cc",
            expires_at=datetime(2026, 11, 30, 4, 0, tzinfo=UTC),
            nonce="n-1",
            decision="approved",
            signature="c2ln",
        ),
        classifier=ClassifierOutput(
            identity="clf",
            version="2",
            question="is this a timeout?",
            probabilities={"TOOL_TIMEOUT": 0.9, "TOOL_FAILED": 0.1},
            candidate_event="TOOL_TIMEOUT",
        ),
        causation="cmd-1",
    )
