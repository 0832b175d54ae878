"""The tests' producer roster: every producer name the tests publish as, with a key and
every role for any scope, so that tests about something else are not refused at intake;
tests about authentication build narrower producers with `producer_entry`.

Keys are derived from the producer's name (`machines.insecure_test_key`): fine in tests,
never anywhere else. Every publisher in the tests signs through `signers()`, and every
controller a test runs gets a policy with `roster()` (`with_roster`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    ANY,
    Grant,
    Policy,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    insecure_test_key,
    public_key_text,
)
from machines.producer_roles import DEFAULT_EVENT_ROLES
from schemas import DEFAULT_CONTROLLER_ID, RecordSigner
from tests.support.keys import controller_key

# A controller whose policy holds this roster runs in demo mode: the roster speaks for
# any agent (`all_grants`), which a controller refuses outside it.
DEMO_ENV: Final[Mapping[str, str]] = {"RECOVERY_DEMO_MODE": "1"}

# Every producer id a test or a catalogue case publishes as.
TEST_PRODUCERS: tuple[str, ...] = (
    "agent-1",
    "agent-7",
    "approval-console",
    "approvals-service",
    "approver-1",
    "approver-console",
    "approver-dana",
    "mallory",
    "approver-ui",
    "bench-tool",
    "bench-worker",
    "bob",
    "capability-worker",
    "idp-integration",
    "research-tool",
    "controller-1",
    "coupa-adapter",
    "coupa-integration",
    "coupa-worker",
    "demo",
    "demo-tool",
    "demo-worker",
    "deploy-agent",
    "fault-tool",
    "nobody",
    "recovery-controller",
    "research-lead",
    "research-orchestrator",
    "research-subagent-4",
    "research-worker",
    "smtp-relay",
    "someone-else",
    "status-api",
    "tool-1",
    "tool-2",
    "tool-integration",
    "planner-agent",
    "unknown-scanner",
    "validator-1",
    "verifier-1",
    "verifier-2",
    "verifier-untrusted-9",
    "worker-containment",
    "worker-payments",
    "worker-x",
    "payment.verify-refund",
    "procurement.verify-request",
    "deploy.verify-steps",
)


def key_of(producer: str) -> Ed25519PrivateKey:
    """The private key of test producer `producer` (derived from its name; the
    controller's is the session's generated controller key)."""
    if producer == DEFAULT_CONTROLLER_ID:
        return controller_key()
    return insecure_test_key(f"test producer:{producer}")


def all_grants() -> tuple[Grant, ...]:
    """Every role, for any capability, tool, environment and agent."""
    return tuple(
        Grant(role=role, capabilities=(ANY,), tools=(ANY,), environments=(ANY,), agents=(ANY,))
        for role in Role
    )


def producer_entry(
    producer: str,
    grants: Iterable[Grant] | None = None,
    *,
    key: Ed25519PrivateKey | None = None,
    **key_fields: Any,
) -> ProducerEntry:
    """A roster entry for `producer` with its test key (or `key`), `grants` (default:
    every role for anything) and key fields (`not_before`, `not_after`, `revoked`)."""
    public = public_key_text((key or key_of(producer)).public_key())
    return ProducerEntry(
        id=producer,
        keys=(ProducerKey(public_key=public, **key_fields),),
        grants=tuple(all_grants() if grants is None else grants),
    )


# Test producers the roster lists with fewer roles: producers with a key that verify
# nothing (the cases' untrusted verifiers; their verifications are refused at intake).
_NARROW: dict[str, tuple[Role, ...]] = {
    "nobody": (Role.TOOL,),
}


def verifiers_only(trusted: Iterable[str]) -> Roster:
    """The test roster in which only `trusted` hold the roles verifier and validator (as
    a deployment's roster grants them to its trusted verifiers alone)."""
    keep = set(trusted)
    entries = []
    for p in roster().producers:
        if p.id in keep:
            entries.append(p)
            continue
        grants = tuple(g for g in p.grants if g.role not in (Role.VERIFIER, Role.VALIDATOR))
        entries.append(p.model_copy(update={"grants": grants}))
    return Roster(producers=tuple(entries))


def lacks_role(producer: str, event_type: str, chosen: Roster | None = None) -> bool:
    """Whether `producer` holds none of the roles that may send `event_type`
    (`machines.DEFAULT_EVENT_ROLES`) in `chosen` (default: the test roster): intake
    refuses it."""
    entry = (chosen or roster()).producer(producer)
    if entry is None:
        return True
    return not set(DEFAULT_EVENT_ROLES.roles_for(event_type)) & entry.roles()


@cache
def roster() -> Roster:
    """Every test producer with every role (`nobody`: tool only)."""
    entries = []
    for p in TEST_PRODUCERS:
        narrow = _NARROW.get(p)
        grants = None if narrow is None else [g for g in all_grants() if g.role in narrow]
        entries.append(producer_entry(p, grants))
    return Roster(producers=tuple(entries))


def roster_with(*entries: ProducerEntry) -> Roster:
    """The test roster with `entries` added or replacing the test producers of their ids."""
    chosen = {e.id: e for e in entries}  # a later entry of the same id wins
    kept = tuple(p for p in roster().producers if p.id not in chosen)
    return Roster(producers=kept + tuple(chosen.values()))


def signer(producer: str, key: Ed25519PrivateKey | None = None) -> RecordSigner:
    """The record signer of test producer `producer`."""
    return RecordSigner(producer, key or key_of(producer))


@cache
def _signers() -> dict[str, RecordSigner]:
    return {p: signer(p) for p in TEST_PRODUCERS}


def signers() -> Mapping[str, RecordSigner]:
    """A signer for every test producer (what a test's `EventPublisher` holds)."""
    return _signers()


def with_roster(policy: Policy, extra: Roster | None = None) -> Policy:
    """`policy` with the test roster (or `extra`) as its producers, unless it has its own."""
    if policy.producers:
        return policy
    chosen = extra or roster()
    return policy.model_copy(update={"producers": chosen.producers})


def roster_document() -> list[dict[str, Any]]:
    """The test roster as a policy file's `producers:` list (JSON-ready)."""
    return [p.model_dump(mode="json") for p in roster().producers]


def write_roster(folder: Path) -> Path:
    """The test roster as a `producers:`-only file in `folder`, for a controller started
    with `RECOVERY_CONTROLLER_ROSTER_PATH` (or `ControllerSettings.roster_path`)."""
    path = folder / "test-roster.json"
    path.write_text(json.dumps({"producers": roster_document()}), encoding="utf-8")
    return path
