"""SPEC §10 through the real broker, controller, PostgreSQL and relay (issue #16 class 9):
no value at a machine's `audit.redact` path, and no payload its `audit.record` does not
keep, reaches a ledger table or an output topic; and the first audit record of an
operation names the signed machine (publisher, key id, signature digest) and the
controller that decided, in the ledger and on `recovery.audit`."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from consumer.batch import CONTROLLER_VERSION
from ledger import Ledger, with_user
from machines import EvidencePayload, key_id
from producers import OutboxRelay, read_topic
from schemas import TopicNames
from tests.integration.consumer.harness import (
    VERIFIER,
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.integration.humans.test_review_and_approve import recoveryctl
from tests.support.kafka import TopicFactory

pytestmark = pytest.mark.integration

SECRET = "SECRET-MARKER-93"  # planted at every redact path
UNKEPT = "UNKEPT-MARKER-17"  # in a payload the machine's audit.record does not keep
FOUND = EvidencePayload(outcome="applied", verifier=VERIFIER, reference="verification-1")
MACHINES = Path(__file__).resolve().parents[3] / "machines"


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _exposed(text: str) -> str:
    """`text` with every base64 and `\\x` hex run in it decoded as well (dead letters hold
    bytes as base64, PostgreSQL prints bytea as hex)."""
    found = [text]
    for run in re.findall(r"\\x([0-9a-f]{16,})", text):
        found.append(bytes.fromhex(run[: len(run) // 2 * 2]).decode("latin-1"))
    for run in re.findall(r"[A-Za-z0-9+/]{16,}={0,2}", text):
        try:
            found.append(base64.b64decode(run + "=" * (-len(run) % 4)).decode("latin-1"))
        except binascii.Error:
            continue
    return "\n".join(found)


def _tables(database_url: str) -> str:
    with psycopg.connect(database_url) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            ).fetchall()
        ]
        texts = [
            str(conn.execute(f"SELECT string_agg(t::text, E'\\n') FROM \"{n}\" t").fetchone())
            for n in names
        ]
    assert {"events", "decisions", "evidence", "audit_records", "outbox"} <= set(names)
    return "\n".join(texts)


def _codes(database_url: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT headers->>'reason' FROM outbox WHERE headers->>'reason' IS NOT NULL"
        )
        return [str(r[0]) for r in rows.fetchall()]


def _provenance(machine: str) -> dict[str, str]:
    """What the controller must record, computed here from the files it verified."""
    signature = json.loads((MACHINES / "catalogue" / machine / "RECOVERY.sig").read_text())
    raw = base64.b64decode(signature["signature"])
    trust = yaml.safe_load((MACHINES / "trusted-publishers.yaml").read_text())
    (key,) = trust["publishers"][signature["publisher"]]["keys"]
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(key))
    return {
        "publisher": signature["publisher"],
        "key_id": key_id(public),
        "signature_digest": "sha256:" + hashlib.sha256(raw).hexdigest(),
    }


def test_redacted_and_unkept_payloads_reach_no_table_or_topic_and_provenance_is_recorded(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    topics = TopicNames(
        events=topic_factory(),
        commands=topic_factory(),
        evidence=topic_factory(),
        audit=topic_factory(),
        dlq=topic_factory(),
    )
    tool = Tool(kafka_bootstrap, topics.events)
    # procurement-request keeps downstream references and evidence payloads and redacts
    # payload.requester_email and payload.cost_center.
    secret = {"requester_email": f"{SECRET}@example.com", "cost_center": f"{SECRET}-cc"}
    timeout_id = tool.event(
        "procurement-request",
        "op-proc",
        "TOOL_TIMEOUT",
        payload={**secret, "request": "REQ-1"},
    )
    tool.event(
        "procurement-request",
        "op-proc",
        "VERIFICATION_FOUND",
        evidence=FOUND,
        payload={**secret, "status": "created"},
    )
    # The first event's id reused with another payload: a conflict, dead-lettered.
    tool.event(
        "procurement-request",
        "op-proc",
        "TOOL_TIMEOUT",
        event_id=timeout_id,
        payload={**secret, "request": "REQ-2"},
    )
    # Refused once its machine is known (an opening without a scope): dead-lettered
    # with the envelope as kept, never the consumed bytes.
    tool.event("procurement-request", "op-unscoped", "TOOL_TIMEOUT", scope=None, payload=secret)
    # delegated-research does not keep evidence payloads: only a reference is stored.
    research = {"agent": "research-orchestrator"}
    tool.event(
        "delegated-research", "op-res", "TOOL_TIMEOUT", payload={"prompt_ref": SECRET}, **research
    )
    tool.event(
        "delegated-research",
        "op-res",
        "VERIFICATION_FOUND",
        evidence=FOUND,
        payload={"answer": UNKEPT, "retrieved_documents": [SECRET]},
        **research,
    )
    tool.close()
    policy = write_policy(tmp_path, Ed25519PrivateKey.generate())
    group = f"controller-{uuid.uuid4().hex[:8]}"
    settings = settings_for(kafka_bootstrap, database_url, topics.events, policy, group)
    settings = settings.model_copy(update={"topics": topics})
    with running(settings, ledger):
        wait_for(
            lambda: len(ledger.decisions("op-proc")) == 2 and len(ledger.decisions("op-res")) == 2,
            60,
            "both operations decided",
        )
        wait_for(
            lambda: {"event-id-conflict", "scope-missing"} <= set(_codes(database_url)),
            30,
            "the conflict and the refusal dead-lettered",
        )
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=topics)
    while (result := relay.relay_once()).leased:
        assert result.unpublishable == 0

    stored = _exposed(_tables(database_url))
    assert SECRET not in stored
    assert UNKEPT not in stored
    assert "REQ-1" in stored  # kept: procurement-request records downstream references
    published: dict[str, list[bytes]] = {}
    for topic in (topics.commands, topics.evidence, topics.audit, topics.dlq):
        read = list(read_topic(kafka_bootstrap, topic))
        published[topic] = [r.value or b"" for r in read]
        whole = [repr((r.key, r.value, r.headers)) for r in read]
        whole += [v.decode("latin-1") for v in published[topic]]  # Avro strings are UTF-8
        text = _exposed("\n".join(whole))
        assert SECRET not in text, topic
        assert UNKEPT not in text, topic
    assert len(published[topics.dlq]) == 2, "the conflict's and the refusal's dead letters"

    audit = [json.loads(v) for v in published[topics.audit]]
    # Chain heads are OCSF too (their heads, not a record, under unmapped.recovery).
    recovery = [a.get("unmapped", {}).get("recovery", {}) for a in audit]
    records = [r["record"] for r in recovery if "record" in r]
    controller = {"id": settings.instance_id, "version": CONTROLLER_VERSION}
    for op, machine in (("op-proc", "procurement-request"), ("op-res", "delegated-research")):
        (opened,) = (r for r in records if r.get("opened_by_event") and r["operation_id"] == op)
        assert opened["machine"]["provenance"] == _provenance(machine), op
        assert opened["controller"] == controller
        chain, _ = ledger.audit_chain(op)
        assert chain[0].record["machine"]["provenance"] == _provenance(machine)
        decisions = [r.record for r in chain if r.kind == "decision"]
        assert all(d["controller"] == controller for d in decisions)
    proc = [r.record["payload"] for r in ledger.audit_chain("op-proc")[0] if r.kind == "decision"]
    assert proc[0] == {
        "requester_email": {"redacted": True},
        "cost_center": {"redacted": True},
        "request": "REQ-1",
    }
    assert proc[1]["status"] == "created"
    res = [r.record["payload"] for r in ledger.audit_chain("op-res")[0] if r.kind == "decision"]
    assert res[1]["omitted"] is True
    assert res[1]["category"] == "evidence_payloads"
    # The chains verify, and the kept events decide again exactly as recorded.
    assert ledger.verify_audit() == ()
    reader = with_user(database_url, "recovery_reader")
    replay = recoveryctl(
        "replay", "--verify", "--json", "--policy", str(policy), "--database-url", reader
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "op-proc" in replay.stdout
    assert "op-res" in replay.stdout
