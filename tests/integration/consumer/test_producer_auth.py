"""Issue 14's attacks on the event path, against the real broker and PostgreSQL: forged
evidence (unsigned, signed by another producer, by a verifier of another capability),
a first record that picks another machine, a bystander named as the agent, a producer
field that is not the signer, and a revoked key. Each is dead-lettered with its code
and audited; none is decided, and no retry is commanded."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger, intake_chain_id
from machines import ANY, EvidencePayload, Grant, Lineage, Role, Roster, Scope, issue_call_context
from producers import EventPublisher, RecoveryClient
from schemas import EVENT_ENVELOPE, AvroSingleObjectCodec, TopicNames, event_to_record
from tests.integration.consumer.harness import open_ledger, outbox, running, settings_for, wait_for
from tests.support.kafka import TopicFactory
from tests.support.producers import key_of, producer_entry, roster_with, signer

pytestmark = pytest.mark.integration

REFUND = Scope(capability="payment.create-refund", tool="stripe", environment="production")
EMAIL = Scope(capability="email.send", tool="smtp-relay", environment="production")
ROSTER = roster_with(
    producer_entry(
        "stripe-tool",
        (
            Grant(
                role=Role.TOOL,
                capabilities=("payment.create-refund",),
                tools=("stripe",),
                environments=(ANY,),
                agents=("billing-agent",),
            ),
        ),
    ),
    producer_entry(
        "mail-tool",
        (
            Grant(
                role=Role.TOOL,
                capabilities=("email.send",),
                tools=("smtp-relay",),
                environments=(ANY,),
                agents=("mail-agent",),
            ),
        ),
    ),
    producer_entry(
        "refund-verifier", (Grant(role=Role.VERIFIER, capabilities=("payment.verify-refund",)),)
    ),
    producer_entry(
        "deploy-verifier", (Grant(role=Role.VERIFIER, capabilities=("deploy.verify-steps",)),)
    ),
    producer_entry("mallory", ()),
    producer_entry("revoked-tool", (Grant(role=Role.TOOL, capabilities=(ANY,)),), revoked=True),
)
SIGNERS = {
    name: signer(name)
    for name in (
        "stripe-tool",
        "mail-tool",
        "refund-verifier",
        "deploy-verifier",
        "mallory",
        "revoked-tool",
    )
}


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _policy(folder: Path) -> Path:
    path = folder / "policy.json"
    path.write_text(
        json.dumps(
            {
                "id": "producer-auth",
                "producers": [p.model_dump(mode="json") for p in ROSTER.producers],
            }
        ),
        encoding="utf-8",
    )
    return path


def _fields(op: str, machine: str, agent: str, **extra: Any) -> dict[str, Any]:
    return {
        "operation_id": op,
        "correlation_id": f"corr-{op}",
        "machine_name": machine,
        "machine_version": "1.0.0",
        "lineage": Lineage(agent=agent, task=f"task-{op}", initiating_principal="alice"),
        "evidence_ref": f"ref-{uuid.uuid4().hex[:8]}",
        **extra,
    }


def test_forged_and_unauthorized_events_are_dead_lettered_not_decided(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    topics = TopicNames(events=topic)
    refund = _fields("op-refund", "payment-refund", "billing-agent")
    verify_command = "op-refund:1:0"
    expected: dict[str, str] = {}
    with (
        EventPublisher(kafka_bootstrap, signer=SIGNERS, topics=topics) as signed,
        EventPublisher(kafka_bootstrap, signer=None, topics=topics) as unsigned,
    ):
        tool = RecoveryClient(signed, "stripe-tool")
        tool.publish_event("TOOL_TIMEOUT", event_id="opening", scope=REFUND, **refund)

        def not_found(client: RecoveryClient, event_id: str, verifier: str) -> None:
            evidence = EvidencePayload(outcome="not_applied", verifier=verifier, reference="r")
            event = client.build_event(
                "VERIFICATION_NOT_FOUND",
                event_id=event_id,
                causation=verify_command,
                evidence=evidence,
                **{**refund, "evidence_ref": f"forged:{event_id}"},
            )
            signed.publish(event)

        # 1. The trusted verifier's name, unsigned (any Kafka client can write this).
        forged = RecoveryClient(signed, "refund-verifier").build_event(
            "VERIFICATION_NOT_FOUND",
            event_id="unsigned",
            causation=verify_command,
            evidence=EvidencePayload(
                outcome="not_applied", verifier="refund-verifier", reference="r"
            ),
            **refund,
        )
        unsigned.publish(forged)
        expected["unsigned"] = "signature-missing"
        # 2. The verifier's name in the evidence, signed by a producer with no role.
        not_found(RecoveryClient(signed, "mallory"), "by-mallory", "refund-verifier")
        expected["by-mallory"] = "role-not-permitted"
        # 3. A verifier of another capability, as itself.
        not_found(RecoveryClient(signed, "deploy-verifier"), "by-deploy", "deploy-verifier")
        expected["by-deploy"] = "role-not-permitted"
        # 4. The envelope's producer is not the signer.
        mismatch = RecoveryClient(signed, "refund-verifier").build_event(
            "VERIFICATION_NOT_FOUND",
            event_id="moved",
            causation=verify_command,
            evidence=EvidencePayload(
                outcome="not_applied", verifier="refund-verifier", reference="r"
            ),
            **refund,
        )
        codec = AvroSingleObjectCodec()
        signed.send(
            topic,
            key="op-refund",
            value=codec.encode(event_to_record(mismatch), EVENT_ENVELOPE),
            record_id="moved",
            content_type=codec.content_type,
            fingerprint=codec.fingerprint(EVENT_ENVELOPE),
            producer="mallory",  # signed by mallory, naming the verifier as producer
        )
        expected["moved"] = "identity-mismatch"
        # 5. The mail tool opens its email operation as a procurement request.
        mail = RecoveryClient(signed, "mail-tool")
        mail.publish_event(
            "TOOL_TIMEOUT",
            event_id="hijack",
            scope=Scope(
                capability="procurement.create-request", tool="coupa", environment="production"
            ),
            **_fields("op-mail", "procurement-request", "mail-agent"),
        )
        expected["hijack"] = "role-not-permitted"
        mail.publish_event(
            "TOOL_TIMEOUT",
            event_id="real-mail",
            scope=EMAIL,
            **_fields("op-mail", "email-send", "mail-agent"),
        )
        # 6. An operation naming a bystander as its agent.
        mail.publish_event(
            "TOOL_TIMEOUT",
            event_id="bystander",
            scope=EMAIL,
            **_fields("op-bystander", "email-send", "billing-agent"),
        )
        expected["bystander"] = "agent-unproven"
        # 7. A revoked key.
        RecoveryClient(signed, "revoked-tool").publish_event(
            "TOOL_TIMEOUT",
            event_id="revoked",
            scope=EMAIL,
            **_fields("op-revoked", "email-send", "mail-agent"),
        )
        expected["revoked"] = "key-revoked"
    settings = settings_for(kafka_bootstrap, database_url, topic, _policy(tmp_path), "auth")
    total = 1 + len(expected) + 1
    with running(settings, ledger):
        wait_for(lambda: ledger.offsets(settings.group_id, topic) == {0: total}, 60, "settled")
    rows = outbox(ledger)
    assert sum(r.topic == "recovery.dlq" for r in rows) == len(expected)
    chain = intake_chain_id(settings.group_id, topic, 0)
    audited = [
        r.payload["record"]
        for r in rows
        if r.topic == "recovery.audit" and r.payload.get("operation_id") == chain
    ]
    by_event = {a.get("event_id"): a["reason_code"] for a in audited}
    assert by_event == expected
    # The refund stays waiting for the real verifier; no retry was ever commanded.
    assert ledger.operation("op-refund").state == "verifying"
    commands = [r.payload["capability"] for r in rows if r.topic == "recovery.commands"]
    assert "payment.create-refund" not in commands
    # The real email report opened its operation under the right machine.
    assert ledger.decisions("op-mail")[0]["event"]["id"] == "real-mail"
    assert ledger.operation("op-mail").machine_name == "email-send"
    assert ledger.verify_audit() == ()


# A deployment without demo mode, so without grants for any agent: a tool that names its
# own agent, a shared mail relay that speaks for no agent by itself, and the mail
# agent's runtime, which vouches for its calls with call contexts.
NAMED = Roster(
    producers=(
        producer_entry(
            "mail-tool",
            (
                Grant(
                    role=Role.TOOL,
                    capabilities=("email.send",),
                    tools=("smtp-relay",),
                    environments=(ANY,),
                    agents=("mail-agent",),
                ),
            ),
        ),
        producer_entry(
            "mail-relay",
            (
                Grant(
                    role=Role.TOOL,
                    capabilities=("email.send",),
                    tools=("smtp-relay",),
                    environments=(ANY,),
                ),
            ),
        ),
        producer_entry("mail-runtime", (Grant(role=Role.ORCHESTRATOR, agents=("mail-agent",)),)),
    )
)


def test_a_tool_cannot_aim_a_containment_at_a_bystander_and_a_runtime_vouches(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    topics = TopicNames(events=topic)
    path = tmp_path / "named.json"
    producers = [p.model_dump(mode="json") for p in NAMED.producers]
    path.write_text(json.dumps({"id": "named", "producers": producers}), encoding="utf-8")
    signers = {name: signer(name) for name in ("mail-tool", "mail-relay")}
    real = Lineage(agent="mail-agent", task="task-x", initiating_principal="alice")
    with EventPublisher(kafka_bootstrap, signer=signers, topics=topics) as publisher:
        mail = RecoveryClient(publisher, "mail-tool")
        # The attack: a denial "for" a bystander, so the controller would stop it.
        mail.publish_event(
            "AUTHORIZATION_DENIED",
            event_id="aimed",
            scope=EMAIL,
            **_fields("op-x", "email-send", "innocent-bystander"),
        )
        # The real report of the same call names the agent that made it.
        mail.publish_event(
            "AUTHORIZATION_DENIED",
            event_id="real",
            scope=EMAIL,
            **{**_fields("op-x", "email-send", "mail-agent"), "lineage": real},
        )
        # A shared relay forwards the runtime's call context: the lineage is the one the
        # runtime signed, not the relay's word.
        context = issue_call_context(
            "mail-runtime", key_of("mail-runtime"), "op-relay", real, now=datetime.now(UTC)
        )
        RecoveryClient(publisher, "mail-relay").publish_event(
            "TOOL_TIMEOUT",
            event_id="relayed",
            call_context=context,
            scope=EMAIL,
            correlation_id="corr-relay",
            machine_name="email-send",
            machine_version="1.0.0",
            evidence_ref="ref-relay",
        )
        # Without the context the relay proves no agent.
        RecoveryClient(publisher, "mail-relay").publish_event(
            "TOOL_TIMEOUT",
            event_id="bare",
            scope=EMAIL,
            **_fields("op-bare", "email-send", "mail-agent"),
        )
    settings = settings_for(
        kafka_bootstrap, database_url, topic, path, f"named-{uuid.uuid4().hex[:6]}", demo_mode=False
    )
    with running(settings, ledger):
        wait_for(lambda: ledger.offsets(settings.group_id, topic) == {0: 4}, 60, "settled")
    letters = {
        r.payload["event_id"]: r.payload["reason_code"]
        for r in outbox(ledger)
        if r.topic == "recovery.dlq"
    }
    assert letters == {"aimed": "agent-unproven", "bare": "agent-unproven"}
    # The real denial opened op-x for the agent that made the call; every command the
    # containment sends names that agent, never the bystander.
    assert ledger.operation("op-x").agent == "mail-agent"
    commands = [r.payload for r in outbox(ledger) if r.topic == "recovery.commands"]
    contained = [c for c in commands if c["operation_id"] == "op-x"]
    assert contained
    assert {c["lineage"]["agent"] for c in contained} == {"mail-agent"}
    assert "innocent-bystander" not in json.dumps(commands)
    # The relay's operation carries the vouched lineage and says how it was proven.
    assert ledger.operation("op-relay").agent == "mail-agent"
    [view] = ledger.load_views(["op-relay"]).values()
    assert (view.opened_by, view.agent_proof) == ("mail-relay", "call-context:mail-runtime")
    assert ledger.load_views(["op-x"])["op-x"].agent_proof == "grant"
