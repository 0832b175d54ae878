"""Picking up a changed policy, roster or lock without a restart (docs/operations.md,
"Changing the rules without a restart").

A running controller reloads its rules (the lock and the machines it pins, the trusted
publishers, the registry, the policy and the roster) when asked (SIGHUP, `request`) or
when the content of one of those files changed (`RulesWatch`, every
`RECOVERY_CONTROLLER_RULES_WATCH_SECONDS`). It loads them exactly as at start-up
(`consumer.service.load_rules`: every machine checked against its pin and publisher
signature, the policy refused with public-name keys outside demo mode), between two
batches, so a batch is decided under one set of rules. When the new files do not load,
it keeps the rules it has and says why; either way it records what happened in the
audit stream: an audit record of kind `rules-changed` (or `rules-change-refused`) on the
group's rules chain `rules:<group>`, signed and published to `recovery.audit` like every
other, naming the old and the new digests (`rules_digests`: the policy's, the roster's
and the lock's, with every pinned version and the current one of each machine), the
trigger, the controller and the process that asked, and holding both policies' documents
(`policy_document`). A controller records what it starts under the same way
(`rules-loaded`), so every policy a decision names is in the audit stream, and
`recoveryctl replay --verify` decides each decision again under the policy it recorded.
Every decision names the policy and machine digests it was decided under, so a decision
after the change names the new ones.

An operation keeps the machine version it runs: a reload that drops a version still in
use strands its operations (their events are dead-lettered `machine-unpinned`), which
is why `recoveryctl machines retire` refuses while any is in flight.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from machines import Pins, Policy, Rules, digest_of

__all__ = [
    "RULES_CHANGED",
    "RULES_CHANGE_REFUSED",
    "RULES_LOADED",
    "ReloadRequests",
    "RulesWatch",
    "change_record",
    "policy_document",
    "reload_requests",
    "rules_chain_id",
    "rules_digests",
]

log = logging.getLogger("consumer.reload")

RULES_CHANGED: Final = "rules-changed"
RULES_CHANGE_REFUSED: Final = "rules-change-refused"
# What a controller starts under: a start is a change of rules too, when the files
# changed while it was down.
RULES_LOADED: Final = "rules-loaded"


def rules_chain_id(group: str) -> str:
    """The audit chain that records the rules changes of controller group `group`."""
    return f"rules:{group}"


def policy_document(policy: Policy) -> dict[str, Any]:
    """The policy as its digest covers it (without the roster), which `Policy`
    validates back to the same digest: what a rules audit record keeps, so that
    `recoveryctl replay --verify` can decide again under a policy no longer on disk."""
    data: dict[str, Any] = policy.model_dump(mode="json")
    del data["producers"]
    return data


def rules_digests(pins: Mapping[str, Any], rules: Rules) -> dict[str, Any]:
    """What a set of rules is, by digest: the policy (what decisions name), the roster
    (who may write; not part of the policy digest), and the lock (every pinned version
    and the version new operations open on)."""
    policy = rules.policy
    roster = [p.model_dump(mode="json") for p in policy.roster.producers]
    machines = {ref: machine.digest for ref, machine in sorted(pins.items())}
    current = pins.current_versions() if isinstance(pins, Pins) else {}
    return {
        "policy": {"id": policy.id, "digest": policy.digest},
        "roster_digest": digest_of({"producers": roster}),
        "lock_digest": digest_of({"machines": machines, "current": current}),
        "machines": machines,
        "current": current,
    }


class ReloadRequests:
    """Requests to reload, made from a signal handler or another thread: a generation
    number that each controller compares with the last one it acted on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._trigger = ""

    def request(self, trigger: str) -> None:
        """Ask every controller of this process to reload (safe in a signal handler:
        it takes no lock a handler could interrupt on the same thread)."""
        self._trigger = trigger
        self._generation += 1

    @property
    def generation(self) -> int:
        """How many reloads were requested so far."""
        return self._generation

    @property
    def trigger(self) -> str:
        """What asked last (`SIGHUP from pid 1234`)."""
        return self._trigger


# The process's requests: `ops.runtime.stop_on_signals` and `python -m consumer` turn
# SIGHUP into one; `Controller` reads it between batches.
reload_requests: Final = ReloadRequests()


class RulesWatch:
    """When to reload: a request newer than the last one acted on, or a change in the
    content of a watched file, looked at no more often than every `interval` seconds
    (0: never; requests only)."""

    def __init__(
        self,
        paths: Sequence[Path | None],
        interval: float,
        *,
        requests: ReloadRequests = reload_requests,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._paths = tuple(sorted({p for p in paths if p is not None}))
        self._interval = interval
        self._requests = requests
        self._seen = requests.generation
        self._clock = clock
        self._next = clock() + interval
        self._prints = self._fingerprints()

    def _fingerprints(self) -> dict[Path, str]:
        prints = {}
        for path in self._paths:
            try:
                prints[path] = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as exc:
                prints[path] = f"unreadable: {exc.strerror}"
        return prints

    def due(self) -> str | None:
        """What asks for a reload now (a description for the audit record), or None."""
        generation = self._requests.generation
        if generation != self._seen:
            self._seen = generation
            self._prints = self._fingerprints()
            return self._requests.trigger or "request"
        if self._interval <= 0 or self._clock() < self._next:
            return None
        self._next = self._clock() + self._interval
        prints = self._fingerprints()
        changed = sorted(str(p) for p in prints if prints[p] != self._prints.get(p))
        self._prints = prints
        if not changed:
            return None
        return f"file watch: {', '.join(changed)} changed"


def change_record(
    kind: str,
    *,
    controller: str,
    group: str,
    trigger: str,
    old: Mapping[str, Any],
    new: Mapping[str, Any] | None,
    error: str | None,
    at: str,
    policies: Sequence[Policy] = (),
) -> dict[str, Any]:
    """The body of a rules-change audit record (module docstring), with the document of
    each of `policies` (the old and the new) by digest."""
    return {
        "kind": kind,
        "controller": controller,
        "consumer_group": group,
        "trigger": trigger,
        "old": dict(old),
        "new": None if new is None else dict(new),
        "changed": sorted(k for k in old if new is not None and old[k] != new.get(k)),
        "error": error,
        "policies": {p.digest: policy_document(p) for p in policies},
        "decided_at": at,
    }
