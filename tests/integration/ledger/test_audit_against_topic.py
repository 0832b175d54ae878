"""`recoveryctl audit verify --against-topic` against the real broker and PostgreSQL: the
controller's signed audit records and chain heads, published by the real relay, prove
what the database held. A consistent rewrite in the database (as a superuser bypassing
the append-only trigger) passes the database-only check and is reported against the
topic; so is a record missing from the topic, and an unsigned or forged record chaining
onto the real head with the controller's next record id (what a SIEM deduping by id
would otherwise keep)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import AuditRecord, PostgresLedger
from ledger.audit import chain_records, genesis_head
from machines import public_key_text, write_private_key
from ops.cli import main
from producers import EventPublisher, OutboxRelay
from schemas import (
    CONTENT_TYPE_JSON,
    OutboxSigner,
    RecordSigner,
    TopicNames,
    audit_to_ocsf_json,
)
from tests.support.kafka import TopicFactory
from tests.support.signed_outbox import CONTROLLER_ID, drive_signed

pytestmark = pytest.mark.integration

STREAMS = ("events", "commands", "evidence", "audit", "dlq")


@dataclass
class Published:
    url: str
    bootstrap: str
    topics: TopicNames
    key: Ed25519PrivateKey

    def verify_database(self, *extra: str) -> int:
        """`audit verify` without reading the topic, proving every row under this key
        (signed for the audit topic's name)."""
        key = public_key_text(self.key.public_key())
        args = ["--database-url", self.url, "--topic", self.topics.audit, "--public-key", key]
        return main(["audit", "verify", *args, "--json", *extra])

    def verify(self, *extra: str) -> int:
        args = [
            "audit",
            "verify",
            "--against-topic",
            "--database-url",
            self.url,
            "--bootstrap",
            self.bootstrap,
            "--topic",
            self.topics.audit,
            "--public-key",
            public_key_text(self.key.public_key()),
            "--json",
            *extra,
        ]
        return main(args)


def _topics(factory: TopicFactory) -> TopicNames:
    return TopicNames(
        events=factory(),
        commands=factory(),
        evidence=factory(),
        audit=factory(2),
        dlq=factory(),
    )


def _relay_all(ledger: PostgresLedger, bootstrap: str, topics: TopicNames) -> None:
    relay = OutboxRelay(ledger, bootstrap, topics=topics)
    while True:
        result = relay.relay_once()
        assert result.unpublishable == 0
        if not result.leased:
            return


@pytest.fixture
def published(database_url: str, kafka_bootstrap: str, topic_factory: TopicFactory) -> Published:
    topics = _topics(topic_factory)
    key = Ed25519PrivateKey.generate()
    ledger = PostgresLedger(database_url)
    try:
        drive_signed(ledger, OutboxSigner(RecordSigner(CONTROLLER_ID, key), topics))
        _relay_all(ledger, kafka_bootstrap, topics)
    finally:
        ledger.close()
    return Published(database_url, kafka_bootstrap, topics, key)


def _report(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _codes(report: dict[str, object]) -> list[str]:
    topic = report["topic"]
    assert isinstance(topic, dict)
    return sorted({str(f["code"]) for f in topic["findings"]})


def test_the_published_records_prove_the_database(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    status = published.verify()
    report = _report(capsys)
    assert status == 0, report
    topic = report["topic"]
    assert isinstance(topic, dict)
    assert topic["clean"] is True
    assert topic["audit_records"] >= 5
    assert topic["heads_records"] == 2


def test_a_consistent_rewrite_passes_the_database_check_but_not_the_topics(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    # Delete op-1's record 2, renumber and re-hash the rest, move the head: the database
    # alone is consistent again (the chain is unkeyed and its head lives beside it).
    with psycopg.connect(published.url) as conn:
        conn.execute("SET session_replication_role = replica")
        rows = conn.execute(
            "SELECT sequence, kind, record::text FROM audit_records "
            "WHERE operation_id = 'op-1' ORDER BY sequence"
        ).fetchall()
        kept = [(kind, json.loads(text), text) for seq, kind, text in rows if seq != 2]
        rebuilt = chain_records("op-1", genesis_head("op-1"), [(k, b, t) for k, b, t in kept])
        conn.execute("DELETE FROM audit_records WHERE operation_id = 'op-1'")
        for rec in rebuilt:
            conn.execute(
                "INSERT INTO audit_records (operation_id, sequence, kind, prev_hash, hash, "
                "record) VALUES (%s, %s, %s, %s, %s, %s::json)",
                (
                    rec.operation_id,
                    rec.sequence,
                    rec.kind,
                    rec.prev_hash,
                    rec.hash,
                    rec.body_json(),
                ),
            )
        conn.execute(
            "UPDATE operations SET audit_sequence = %s, audit_head = %s "
            "WHERE operation_id = 'op-1'",
            (rebuilt[-1].sequence, rebuilt[-1].hash),
        )
    # The rewritten records are no longer the ones the controller signed: the database
    # check finds it from the outbox rows' signatures, without the topic.
    database_only = published.verify_database("--operation", "op-1")
    authors = _report(capsys)["authors"]
    assert database_only == 1
    assert isinstance(authors, list)
    assert {f["code"] for f in authors} == {"forged-record"}
    status = published.verify()
    report = _report(capsys)
    assert status == 1
    assert "rewritten" in _codes(report)
    assert "head-mismatch" in _codes(report) or "deleted" in _codes(report)


def test_a_record_missing_from_the_topic_is_reported(
    database_url: str,
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topics = _topics(topic_factory)
    key = Ed25519PrivateKey.generate()
    ledger = PostgresLedger(database_url)
    try:
        drive_signed(ledger, OutboxSigner(RecordSigner(CONTROLLER_ID, key), topics))
        # The record marked published without ever reaching the broker.
        with psycopg.connect(database_url) as conn:
            conn.execute("UPDATE outbox SET published_at = now() WHERE record_id = 'audit:op-1:2'")
        _relay_all(ledger, kafka_bootstrap, topics)
    finally:
        ledger.close()
    status = Published(database_url, kafka_bootstrap, topics, key).verify()
    report = _report(capsys)
    assert status == 1
    topic = report["topic"]
    assert isinstance(topic, dict)
    [finding] = topic["findings"]
    assert (finding["code"], finding["chain"], finding["sequence"]) == (
        "missing-from-topic",
        "op-1",
        2,
    )


def test_a_forged_record_chaining_onto_the_head_is_reported(
    published: Published, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = PostgresLedger(published.url)
    try:
        records, head = ledger.audit_chain("op-1")
    finally:
        ledger.close()
    assert head is not None
    # Anyone can compute the unkeyed chain hash and take the controller's next id.
    body = {**records[-1].record, "forged": True}
    [forged] = chain_records("op-1", head, [("decision", body, json.dumps(body, sort_keys=True))])
    value = audit_to_ocsf_json(_published(forged))
    rid = f"audit:op-1:{forged.sequence}"
    attacker = RecordSigner(CONTROLLER_ID, Ed25519PrivateKey.generate())
    with EventPublisher(published.bootstrap, signer=None) as publisher:
        publisher.send(
            published.topics.audit,
            key="op-1",
            value=value,
            record_id=rid,
            content_type=CONTENT_TYPE_JSON,
        )
        headers = attacker.sign(
            published.topics.audit,
            b"op-1",
            value,
            [("content-type", CONTENT_TYPE_JSON.encode()), ("recovery-record-id", rid.encode())],
        )
        signature = {k: (v or b"").decode() for k, v in headers if k.startswith("recovery-")}
        signature.pop("recovery-record-id")
        publisher.send(
            published.topics.audit,
            key="op-1",
            value=value,
            record_id=rid,
            content_type=CONTENT_TYPE_JSON,
            extra_headers=signature,
        )
    status = published.verify()
    report = _report(capsys)
    assert status == 1
    assert _codes(report) == ["forged-record", "unsigned-record"]


def _published(record: AuditRecord) -> dict[str, object]:
    return record.to_dict()


def test_a_purge_leaves_signed_tombstones_and_verifies_clean_unlike_a_deletion(
    published: Published, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "controller.key"
    write_private_key(key_file, published.key)
    with_topics = {f"RECOVERY_TOPIC_{s.upper()}": getattr(published.topics, s) for s in STREAMS}
    with pytest.MonkeyPatch.context() as env:
        for name, value in with_topics.items():
            env.setenv(name, value)
        purge = ["audit", "purge", "--operation", "op-1", "--key-file", str(key_file)]
        assert main([*purge, "--database-url", published.url, "--json"]) == 0
    [done] = json.loads(capsys.readouterr().out)["purged"]
    assert done["operation_id"] == "op-1"
    assert done["rows_removed"] > 0
    ledger = PostgresLedger(published.url)
    try:
        records, _ = ledger.audit_chain("op-1")
        assert [r.kind for r in records] == ["tombstone"]
        assert ledger.decisions("op-1") == ()
        _relay_all(ledger, published.bootstrap, published.topics)
    finally:
        ledger.close()
    assert published.verify_database() == 0
    assert _report(capsys)["authors"] == []
    assert published.verify() == 0
    topic = _report(capsys)["topic"]
    assert isinstance(topic, dict)
    assert (topic["tombstones"], topic["purged_records"] > 0) == (1, True)

    # The same removal by hand, with no tombstone: the database alone looks intact (an
    # empty chain, its head moved back to genesis), the topic tells it was deleted.
    with psycopg.connect(published.url) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("DELETE FROM audit_records WHERE operation_id LIKE 'intake:%'")
        conn.execute("DELETE FROM audit_chains")
    assert published.verify() == 1
    report = _report(capsys)
    assert _codes(report) == ["deleted"]
