"""Rotating every key with work in flight, on a real broker and PostgreSQL, with the
controller and the relay as processes (docs/operations.md, "Keys" and "Producer
roster"): a tool publishes without pause while its key is rotated and then revoked, the
controller's signing key is rotated by a restart, and an approver's key is replaced.
Every record a valid key signed is decided; every record a retired or revoked key
signed after its `not_after` is dead-lettered with its code; the worker's check accepts
commands signed by either controller key while both are listed and refuses the old one
once it is retired; and `recoveryctl audit verify --against-topic` accepts the whole
history under the final roster, in which the old controller key is retired and then
revoked from the time the new one took over."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import rules_chain_id
from ledger import LedgerInspector, PostgresLedger
from machines import (
    AuthenticationError,
    HumanDecision,
    Lineage,
    key_id,
    load_roster,
    public_key_b64,
    public_key_text,
    sign_decision,
    write_private_key,
)
from producers import EventPublisher, RecoveryClient, read_topic
from schemas import (
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    HEADER_KEY_ID,
    RecordSigner,
    TopicNames,
    header_value,
    verify_record,
)
from tests.integration.consumer.harness import open_ledger
from tests.integration.lineage.children import Child, wait_until
from tests.support.kafka import TopicFactory
from tests.support.producers import DEMO_ENV, roster_document
from tests.support.roles import role_env
from tests.support.scopes import catalogue_scope

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT: Final = Path(__file__).resolve().parents[2]
TOOL: Final = "rotating-tool"
CONTROLLER: Final = "rotating-controller"
APPROVER: Final = "approver-rotated"


def _key(key: Ed25519PrivateKey, **window: datetime | bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"public_key": public_key_text(key.public_key())}
    for name, value in window.items():
        entry[name] = value.isoformat() if isinstance(value, datetime) else value
    return entry


def _grant(role: str) -> dict[str, Any]:
    return {"role": role, "capabilities": ["*"], "tools": ["*"], "environments": ["*"],
            "agents": ["*"]}  # fmt: skip


class Deployment:
    """The files a deployment edits, the processes it runs, and the ledger to check."""

    def __init__(self, root: Path, env: dict[str, str], topics: TopicNames, url: str) -> None:
        self.root = root
        self.env = env
        self.topics = topics
        self.url = url
        self.controller: Child | None = None
        self.relay: Child | None = None
        self.roster_path = root / "roster.json"
        self.audit_roster_path = root / "controller-roster.json"
        self.policy_path = root / "policy.json"

    def write(self, path: Path, data: Any) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)

    def start_controller(self, key_file: Path) -> None:
        env = {**self.env, "RECOVERY_CONTROLLER_SIGNING_KEY_FILE": str(key_file)}
        self.controller = Child("controller", env, self.root / "controller.log")
        self.controller.wait_assigned(90)

    def reload(self, ledger: PostgresLedger, what: str) -> None:
        """SIGHUP the controller and wait for its `rules-changed` record."""
        chain = rules_chain_id(self.env["RECOVERY_CONTROLLER_GROUP_ID"])
        before = len(ledger.audit_chain(chain)[0])
        assert self.controller is not None
        self.controller.hangup()

        def changed() -> bool:
            records = ledger.audit_chain(chain)[0]
            return len(records) > before and records[-1].record["kind"] == "rules-changed"

        wait_until(changed, 30, f"the controller to reload {what}")


class Load:
    """A tool publishing one new operation every `every` seconds, signed with whichever
    key `use` last chose; remembers which key signed which event."""

    def __init__(self, bootstrap: str, topics: TopicNames, key: Ed25519PrivateKey) -> None:
        self.bootstrap, self.topics = bootstrap, topics
        self.signed: dict[str, str] = {}
        self._publisher = self._client(key)
        self._stop = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _client(self, key: Ed25519PrivateKey) -> tuple[EventPublisher, RecoveryClient, str]:
        publisher = EventPublisher(
            self.bootstrap, signer=RecordSigner(TOOL, key), topics=self.topics
        )
        return publisher, RecoveryClient(publisher, TOOL), public_key_text(key.public_key())

    def use(self, key: Ed25519PrivateKey) -> None:
        with self._lock:
            old = self._publisher
            self._publisher = self._client(key)
        old[0].close(30)

    def publish(self, key: Ed25519PrivateKey | None = None) -> str:
        with self._lock:
            publisher, client, public = self._publisher if key is None else self._client(key)
            op = f"op-k-{uuid.uuid4().hex[:10]}"
            client.publish_event(
                "TOOL_TIMEOUT",
                operation_id=op,
                correlation_id=f"corr-{op}",
                machine_name="email-send",
                machine_version="1.0.0",
                lineage=Lineage(agent="agent-1", task=f"task-{op}", initiating_principal="p"),
                evidence_ref=f"ref-{op}",
                scope=catalogue_scope("email-send"),
            )
            publisher.flush(30)
            if key is not None:
                publisher.close(30)
            self.signed[op] = public
            return op

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.publish()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        with self._lock:
            if not self._closed:
                self._closed = True
                self._publisher[0].close(30)


@pytest.fixture
def deployment(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> Iterator[Deployment]:
    topics = TopicNames(
        events=topic_factory(2),
        commands=topic_factory(2),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": database_url,
        "RECOVERY_CONTROLLER_GROUP_ID": f"keys-{uuid.uuid4().hex[:8]}",
        "RECOVERY_CONTROLLER_ID": CONTROLLER,
        "RECOVERY_CONTROLLER_BATCH_MAX_WAIT_MS": "50",
        "RECOVERY_CONTROLLER_RULES_WATCH_SECONDS": "0",
        **DEMO_ENV,
        **{f"RECOVERY_TOPIC_{s.upper()}": getattr(topics, s) for s in TopicNames.model_fields},
    }
    found = Deployment(tmp_path, env, topics, database_url)
    env["RECOVERY_CONTROLLER_POLICY_PATH"] = str(found.policy_path)
    env["RECOVERY_CONTROLLER_ROSTER_PATH"] = str(found.roster_path)
    try:
        yield found
    finally:
        for child in (found.controller, found.relay):
            if child is not None:
                child.stop()


def _dead_letters(url: str, topic: str) -> dict[str, str]:
    inspector = LedgerInspector(url)
    try:
        # Keyed by the record's key: each refused record here is its operation's only one.
        return {d.key: str(d.payload["reason_code"]) for d in inspector.dead_letters(topic)}
    finally:
        inspector.close()


def _decided(ledger: PostgresLedger, ops: list[str]) -> bool:
    return all(ledger.decisions(op) for op in ops)


def _audit_verify(deployment: Deployment) -> subprocess.CompletedProcess[str]:
    env = {
        **deployment.env,
        "RECOVERY_ROSTER_FILE": str(deployment.audit_roster_path),
    }
    child = role_env(env)
    # The roster, with every controller key and its window, not one key file.
    del child[ENV_CONTROLLER_SIGNING_KEY_FILE]
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", "audit", "verify", "--against-topic",
         "--topic", deployment.topics.audit, "--json"],
        cwd=ROOT, env=child, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_every_key_is_rotated_and_revoked_with_work_in_flight(
    deployment: Deployment, kafka_bootstrap: str, database_url: str
) -> None:
    root = deployment.root
    tool_old, tool_new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    ctl_old, ctl_new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    approver_old, approver_new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    ctl_old_file, ctl_new_file = root / "controller-1.key", root / "controller-2.key"
    write_private_key(ctl_old_file, ctl_old)
    write_private_key(ctl_new_file, ctl_new)

    def roster(tool_keys: list[dict[str, Any]], approver_keys: list[dict[str, Any]]) -> Any:
        return {
            "producers": [
                {"id": TOOL, "keys": tool_keys, "grants": [_grant("tool")]},
                {"id": APPROVER, "keys": approver_keys, "grants": [_grant("approver")]},
            ]
        }

    def policy(approver_key: Ed25519PrivateKey) -> Any:
        return {
            "id": "key-rotation",
            "producers": [p for p in roster_document() if p["id"] != CONTROLLER],
            "approvers": [
                {
                    "id": APPROVER,
                    "public_key": public_key_b64(approver_key),
                    "roles": ["recovery-approver"],
                }
            ],
        }

    def controller_roster(keys: list[dict[str, Any]]) -> Any:
        return {"producers": [{"id": CONTROLLER, "keys": keys, "grants": [{"role": "controller"}]}]}

    deployment.write(deployment.roster_path, roster([_key(tool_old)], [_key(approver_old)]))
    deployment.write(deployment.policy_path, policy(approver_old))
    deployment.write(deployment.audit_roster_path, controller_roster([_key(ctl_old)]))
    deployment.start_controller(ctl_old_file)
    deployment.relay = Child("relay", deployment.env, root / "relay.log")
    ledger = open_ledger(database_url)
    load = Load(kafka_bootstrap, deployment.topics, tool_old)
    load.start()
    try:
        # -- a producer's key, under load ------------------------------------------
        time.sleep(1)
        switched = datetime.now(UTC)
        deployment.write(
            deployment.roster_path,
            roster([_key(tool_old), _key(tool_new, not_before=switched)], [_key(approver_old)]),
        )
        deployment.reload(ledger, "the roster with the tool's new key")
        load.use(tool_new)
        old_ops = [
            op for op, k in load.signed.items() if k == public_key_text(tool_old.public_key())
        ]
        wait_until(lambda: _decided(ledger, old_ops), 90, "every event the old key signed")
        retired = datetime.now(UTC)
        deployment.write(
            deployment.roster_path,
            roster(
                [_key(tool_old, not_after=retired), _key(tool_new, not_before=switched)],
                [_key(approver_old)],
            ),
        )
        deployment.reload(ledger, "the roster retiring the tool's old key")
        stale = load.publish(tool_old)  # a copy of the tool still on the retired key

        # -- the controller's key: listed beside the old one, then a restart --------
        handover = datetime.now(UTC)
        deployment.write(
            deployment.audit_roster_path,
            controller_roster([_key(ctl_old), _key(ctl_new, not_before=handover)]),
        )
        time.sleep(1)
        assert deployment.controller is not None
        deployment.controller.stop()
        # The old key signed nothing after this: the time it is retired (and, below,
        # revoked) from.
        stopped = datetime.now(UTC)
        deployment.start_controller(ctl_new_file)
        time.sleep(2)

        # -- an approver's key: the new one listed, the old one removed -------------
        deployment.write(deployment.policy_path, policy(approver_new))
        deployment.write(
            deployment.roster_path,
            roster(
                [_key(tool_old, not_after=retired), _key(tool_new, not_before=switched)],
                [_key(approver_old, not_after=datetime.now(UTC)), _key(approver_new)],
            ),
        )
        deployment.reload(ledger, "the policy with the approver's new key")
        escalated = [op for op in list(load.signed)[:2]]
        wait_until(lambda: _decided(ledger, escalated), 60, "two escalated operations")
        for op, key in zip(escalated, (approver_old, approver_new), strict=True):
            view = ledger.load_views([op])[op]
            decision = sign_decision(
                HumanDecision(
                    approver=APPROVER,
                    operation_id=op,
                    state=view.state,
                    transition="containing",
                    machine_digest=view.machine_digest,
                    expires_at=datetime.now(UTC) + timedelta(minutes=10),
                    nonce=uuid.uuid4().hex,
                    decision="rejected",
                ),
                key,
            )
            with EventPublisher(
                kafka_bootstrap, signer=RecordSigner(APPROVER, key), topics=deployment.topics
            ) as publisher:
                event = RecoveryClient(publisher, APPROVER).publish_signed_decision(
                    decision,
                    correlation_id=f"corr-{op}",
                    machine_name="email-send",
                    machine_version="1.0.0",
                    lineage=Lineage(agent="agent-1", task=f"task-{op}", initiating_principal="p"),
                )
                publisher.flush(30)
            assert event.event_id
        new_op = escalated[1]
        wait_until(
            lambda: ledger.operation(new_op).state == "containing", 60, "the new key's decision"
        )

        # -- a compromised key: revoked from now -----------------------------------
        # The tool stops first: what it signs after the revocation is refused, and is
        # checked below as the one record the compromised key signs late.
        load.stop()
        compromised = datetime.now(UTC)
        deployment.write(
            deployment.roster_path,
            roster(
                [
                    _key(tool_old, not_after=retired),
                    _key(tool_new, not_before=switched, not_after=compromised, revoked=True),
                ],
                [_key(approver_old, not_after=compromised), _key(approver_new)],
            ),
        )
        deployment.reload(ledger, "the roster revoking the tool's key")
        forged = load.publish(tool_new)
        wait_until(
            lambda: {stale, forged} <= set(_dead_letters(database_url, deployment.topics.dlq)),
            60,
            "the retired and the revoked key's records dead-lettered",
        )

        # Every other record was decided; exactly the three refusals were dead-lettered.
        legit = [op for op in load.signed if op not in (stale, forged)]
        wait_until(
            lambda: _decided(ledger, legit),
            90,
            "every legitimately signed event",
            detail=lambda: (
                f"undecided {[op for op in legit if not ledger.decisions(op)][:5]}, "
                f"dead letters {_dead_letters(database_url, deployment.topics.dlq)}"
            ),
        )
        letters = _dead_letters(database_url, deployment.topics.dlq)
        assert letters[stale] == "key-expired"
        assert letters[forged] == "key-revoked"
        assert letters[escalated[0]] == "key-expired"  # the old approver key's record
        assert len(letters) == 3, letters
        assert ledger.operation(escalated[0]).state == "unresolved"

        # The worker's check: commands signed by either controller key verify while both
        # are listed; the old one's are refused once it is retired.
        commands = list(read_topic(kafka_bootstrap, deployment.topics.commands, timeout=60))
        both = load_roster(deployment.audit_roster_path)
        signed_by = {header_value(c.headers, HEADER_KEY_ID) for c in commands}
        assert len(signed_by) == 2, signed_by
        now = datetime.now(UTC)
        for c in commands:
            verify_record(both, c.topic, c.key, c.value, c.headers, at=now)
        deployment.write(
            deployment.audit_roster_path,
            controller_roster(
                [_key(ctl_old, not_after=stopped), _key(ctl_new, not_before=handover)]
            ),
        )
        retired_roster = load_roster(deployment.audit_roster_path)
        new_key_id = key_id(ctl_new.public_key())
        old_key_id = header_value(
            next(
                c for c in commands if header_value(c.headers, HEADER_KEY_ID) != new_key_id
            ).headers,
            HEADER_KEY_ID,
        )
        for c in commands:
            if header_value(c.headers, HEADER_KEY_ID) == new_key_id:
                verify_record(retired_roster, c.topic, c.key, c.value, c.headers, at=now)
                continue
            with pytest.raises(AuthenticationError) as caught:
                verify_record(retired_roster, c.topic, c.key, c.value, c.headers, at=now)
            assert caught.value.code == "key-expired"
        assert old_key_id != new_key_id

        # The whole history verifies against the topic under the final roster: the
        # old controller key retired when it stopped signing, then revoked from then.
        last: list[subprocess.CompletedProcess[str]] = []

        def verifies() -> bool:
            last[:] = [_audit_verify(deployment)]
            return last[0].returncode == 0

        wait_until(
            verifies,
            90,
            "audit verify",
            every=2,
            detail=lambda: last[0].stdout[-3000:] + last[0].stderr[-2000:] if last else "",
        )
        deployment.write(
            deployment.audit_roster_path,
            controller_roster(
                [
                    _key(ctl_old, not_after=stopped, revoked=True),
                    _key(ctl_new, not_before=handover),
                ]
            ),
        )
        verified = _audit_verify(deployment)
        assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
        report = json.loads(verified.stdout)
        assert report["topic"]["records_read"] > 0
        assert ledger.verify_audit() == ()
    finally:
        load.stop()
        ledger.close()
