"""The reviewer console without a browser or services: what a page is given to sign is
exactly what the controller verifies, a tampered or foreign payload is refused, tokens
are stored only as hashes (0600) and expire or are revoked, sessions carry their own
CSRF token."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    CATALOGUE,
    DEFAULT_REGISTRY,
    Event,
    Lineage,
    Machine,
    OperationSetup,
    OperationView,
    Policy,
    Registry,
    ReviewPacket,
    apply,
    check_decision,
    decide,
    load_machine,
    load_registry,
    public_key_b64,
    review_packet,
)
from machines.approvals import ApprovalRejection
from machines.batch import open_view
from machines.policy import Approver
from ops.cli import main
from ops.console import (
    PendingDecision,
    Sessions,
    SigningRefused,
    TokenFile,
    pending,
    submitted_decision,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
OP = "op-console"
KEY = Ed25519PrivateKey.generate()
APPROVER = Approver(id="approver-1", public_key=public_key_b64(KEY), roles=("recovery-approver",))
POLICY = Policy(id="console-tests", approvers=(APPROVER,))


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(DEFAULT_REGISTRY)


@pytest.fixture(scope="module")
def email(registry: Registry) -> Machine:
    return load_machine(Path(CATALOGUE) / "email-send", registry)


@pytest.fixture(scope="module")
def escalated(email: Machine, registry: Registry) -> tuple[OperationView, ReviewPacket]:
    view = open_view(email, POLICY, OperationSetup(operation_id=OP, agent="agent-9"), T0)
    timeout = Event(
        event_type="TOOL_TIMEOUT",
        event_id="evt-1",
        operation_id=OP,
        correlation_id="corr-console",
        machine_name=email.name,
        machine_version=email.version,
        event_time=T0,
        evidence_ref="ref-1",
        producer="smtp-relay",
        lineage=Lineage(agent="agent-9", task="task-9", initiating_principal="alice"),
    )
    decision = decide(email, view, timeout, POLICY, registry, T0)
    view = apply(view, decision)
    packet = review_packet(
        machine=email,
        policy=POLICY,
        registry=registry,
        view=view,
        operation={
            "operation_id": OP,
            "correlation_id": "corr-console",
            "initiating_principal": "alice",
            "agent": "agent-9",
            "runtime": None,
            "task": "task-9",
            "origin_operation": None,
            "parent_operation": None,
            "depth": 0,
            "delegated_credentials": [],
            "policy_digest": POLICY.digest,
        },
        events=[timeout.to_dict()],
        decisions=[decision.to_dict()],
        now=T0,
    )
    return view, packet


def _pending(escalated: tuple[OperationView, ReviewPacket]) -> dict[str, PendingDecision]:
    view, packet = escalated
    found = pending(packet, view=view, approver="approver-1", now=T0,
                    ttl=timedelta(minutes=15), nonce="n1")  # fmt: skip
    return {d.verdict: d for d in found}


def _sign(text: str, key: Ed25519PrivateKey = KEY) -> str:
    """What the page does: sign the UTF-8 bytes of the payload text, base64."""
    return base64.b64encode(key.sign(text.encode("utf-8"))).decode("ascii")


def test_the_payload_a_page_signs_is_the_decision_the_controller_accepts(
    escalated: tuple[OperationView, ReviewPacket],
) -> None:
    view, _ = escalated
    offered = _pending(escalated)
    assert sorted(offered) == ["approved", "rejected"]
    approve = offered["approved"]
    assert (approve.event_type, approve.target) == ("HUMAN_APPROVED", "resume-pending")
    fields = json.loads(approve.payload)
    assert fields["domain"] == "agent-recovery/human-decision/v2"
    assert (fields["operation_id"], fields["state"], fields["nonce"]) == (
        OP,
        "unresolved",
        "n1-approved",
    )
    decision = submitted_decision(approve.payload, _sign(approve.payload), approver="approver-1",
                                  verdict="approved")  # fmt: skip
    assert check_decision(decision, event_type="HUMAN_APPROVED", view=view, policy=POLICY,
                          now=T0) is None  # fmt: skip
    # Signed by another key: the payload parses, the controller's check refuses it.
    stranger = _sign(approve.payload, Ed25519PrivateKey.generate())
    forged = submitted_decision(
        approve.payload, stranger, approver="approver-1", verdict="approved"
    )
    assert check_decision(forged, event_type="HUMAN_APPROVED", view=view, policy=POLICY,
                          now=T0) == ApprovalRejection.BAD_SIGNATURE  # fmt: skip


def test_a_payload_that_is_not_the_rendered_one_is_refused(
    escalated: tuple[OperationView, ReviewPacket],
) -> None:
    payload = _pending(escalated)["approved"].payload
    spaced = json.dumps(json.loads(payload), indent=1)
    with pytest.raises(SigningRefused, match="not in canonical form"):
        submitted_decision(spaced, _sign(spaced), approver="approver-1", verdict="approved")
    with pytest.raises(SigningRefused, match="signed in as approver-2"):
        submitted_decision(payload, _sign(payload), approver="approver-2", verdict="approved")
    with pytest.raises(SigningRefused, match="decides approved, not rejected"):
        submitted_decision(payload, _sign(payload), approver="approver-1", verdict="rejected")
    extra = json.dumps({**json.loads(payload), "packet": "x"})
    with pytest.raises(SigningRefused, match="not a human decision"):
        submitted_decision(extra, _sign(extra), approver="approver-1", verdict="approved")


def test_tokens_are_kept_as_hashes_and_expire_or_are_revoked(tmp_path: Path) -> None:
    tokens = TokenFile(tmp_path / "console-tokens.json")
    issued = tokens.issue("approver-1", T0, timedelta(days=1))
    stored = tokens.path.read_text()
    assert tokens.path.stat().st_mode & 0o777 == 0o600
    assert issued.token not in stored
    assert tokens.approver_for(issued.token, T0 + timedelta(hours=23)) == "approver-1"
    assert tokens.approver_for(issued.token, T0 + timedelta(days=1)) is None
    assert tokens.approver_for(issued.token + "x", T0) is None
    assert tokens.revoke("approver-1") == 1
    assert tokens.approver_for(issued.token, T0) is None


def test_console_token_is_issued_only_for_a_roster_approver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(POLICY.model_dump_json())
    path = tmp_path / "tokens.json"
    common = ["--policy", str(policy), "--tokens-file", str(path)]
    assert main(["console", "token", "--approver", "approver-1", "--json", *common]) == 0
    issued = json.loads(capsys.readouterr().out)
    assert TokenFile(path).approver_for(issued["token"], datetime.now(UTC)) == "approver-1"
    assert main(["console", "token", "--approver", "mallory", *common]) == 1
    assert "mallory is not in policy console-tests's approver roster" in capsys.readouterr().err


def test_each_session_has_its_own_csrf_token_and_ends_on_sign_out() -> None:
    sessions = Sessions(ttl=60)
    first, second = sessions.open("approver-1", "d1"), sessions.open("approver-1", "d2")
    assert first.csrf != second.csrf
    assert first.csrf_ok(first.csrf)
    assert not first.csrf_ok(second.csrf)
    assert not first.csrf_ok(None)
    assert sessions.get(first.session_id) is first
    sessions.close(first.session_id)
    assert sessions.get(first.session_id) is None
    expired = Sessions(ttl=-1)
    assert expired.get(expired.open("approver-1", "d").session_id) is None
