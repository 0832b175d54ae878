"""The Action Ledger interface: what the controller, the relay and `recoveryctl` may ask.

Two implementations, `PostgresLedger` (the real one) and `MemoryLedger` (for tests of the
core and the consumer), run the same abstract test suite. The consumer's loop is:

1. On assignment, `claim(group, topic, partitions, owner)`: bumps each partition's epoch
   (fencing out the previous owner) and returns the stored next offsets to seek to.
2. For each polled batch: `load_views(operation ids)` and, for the operations the
   batch opens, `arrival_lineage` (their lineage on arrival), decide every event with
   `machines.decision.decide`, folding views with `apply` as it goes.
3. `commit(Batch(...))`: one transaction that checks the epochs (a zombie gets
   `FencedError`, nothing written), locks the operations in sorted order, checks their
   versions (`VersionConflict`: reload and decide again), writes every row and the next
   offsets. It is all-or-nothing, so after any error the batch is replayed from the
   stored offsets, never half-applied.

Between batches the controller fires the timers due on its partitions (`fire_timers`,
fenced by the same epochs; `ledger.timers`) and reads its gauges (`timer_summary`).

The relay uses `lease_outbox` (and `OutboxLease.hold` for a row it cannot publish);
`recoveryctl outbox` uses `held_outbox` / `release_outbox`; `recoveryctl audit verify`
uses `verify_audit`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ledger.audit import (
    AuditRecord,
    AuditSubject,
    ChainBreak,
    ChainHead,
    verify_chain,
    verify_subject,
)
from ledger.records import Batch, RowSigner
from ledger.timers import FiredTimers, TimerSummary
from machines import Arrival, ClaimKey, KeyClaim, Lineage, LineageRow, OperationView
from schemas import DEFAULT_TOPICS, TopicNames

__all__ = [
    "Arrival",
    "AuditOutboxRow",
    "CommitResult",
    "HeldOutboxRow",
    "Ledger",
    "LineageRow",
    "OperationInfo",
    "OutboxLease",
    "OutboxRecord",
    "PartitionAttempt",
    "PartitionClaim",
]


@dataclass(frozen=True, slots=True)
class PartitionAttempt:
    """What a start of the controller recorded it was about to decide on one partition
    (crash quarantine, docs/controller.md): offsets `first_offset`..`last_offset`, one
    record at a time when `single`; `starts` counts the starts in a row that attempted
    this range without the stored offset moving past it, `record_starts` those of them
    that attempted the record at `first_offset` alone."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    starts: int
    single: bool
    owner: str = ""
    record_starts: int = 0


@dataclass(frozen=True, slots=True)
class PartitionClaim:
    """A partition now owned at `epoch`; `next_offset` is where to resume (None: nothing
    stored yet, start from the group's reset policy); `attempt` is what the previous
    start recorded it was deciding there (None: nothing recorded)."""

    topic: str
    partition: int
    epoch: int
    next_offset: int | None
    attempt: PartitionAttempt | None = None


@dataclass(frozen=True, slots=True)
class CommitResult:
    """How many rows of each kind one committed batch wrote."""

    events: int
    decisions: int
    evidence: int
    approvals: int
    audit_records: int
    outbox_rows: int
    dead_letters: int = 0

    @property
    def rows(self) -> int:
        """All rows written (operations and offsets not counted)."""
        return (
            self.events
            + self.decisions
            + self.evidence
            + self.approvals
            + self.audit_records
            + self.outbox_rows
        )


@dataclass(frozen=True, slots=True)
class OperationInfo:
    """The identity and lineage of one operation as stored."""

    operation_id: str
    correlation_id: str
    machine_name: str
    machine_version: str
    machine_digest: str
    state: str
    version: int
    initiating_principal: str
    agent: str
    runtime: str | None
    task: str
    origin_operation: str | None
    parent_operation: str | None
    depth: int
    delegated_credentials: tuple[str, ...] = ()

    @property
    def lineage(self) -> Lineage:
        """The operation's lineage as an event envelope carries it."""
        return Lineage(
            agent=self.agent,
            task=self.task,
            initiating_principal=self.initiating_principal,
            origin_operation=self.origin_operation,
            parent_operation=self.parent_operation,
            delegated_credentials=self.delegated_credentials,
        )


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One unpublished outbox row; `position` is its place in the global insertion order.
    `value` is the Kafka value the controller signed (migration 0012), to publish as it
    is; without one (older rows, unsigned writers) the relay encodes `payload`. A row with
    a value comes with an empty `payload` from a lease without payloads."""

    position: int
    record_id: str
    topic: str
    key: str
    headers: Mapping[str, str]
    payload: Mapping[str, Any]
    value: bytes | None = None


@dataclass(frozen=True, slots=True)
class AuditOutboxRow:
    """The outbox row that publishes one audit record (published or not): what the
    controller signed for it (`value`, with the signature in `headers`), so that the
    record's author can be proved from the database alone (`recoveryctl audit verify`)."""

    chain: str
    sequence: int
    record: OutboxRecord
    created_at: datetime
    published_at: datetime | None


@dataclass(frozen=True, slots=True)
class HeldOutboxRow:
    """An unpublished row the relay held as unpublishable: its key is skipped by every
    lease until the hold is released; `waiting` counts the key's unpublished rows behind
    it (held back with it, so the key's order is kept)."""

    position: int
    record_id: str
    topic: str
    key: str
    held_at: datetime
    reason: str
    waiting: int


class OutboxLease(abc.ABC):
    """Unpublished rows leased to one relay instance, in insertion order.

    A lease holds the oldest unpublished row of each of its keys, so no other relay
    instance can publish any row of those keys until the lease ends: several relays run
    side by side without reordering a key. Publish `records` in order, call
    `mark_published` with what was acknowledged, `hold` a key's first unpublished row
    when it can never be published, and leave the context to commit."""

    records: tuple[OutboxRecord, ...]

    @abc.abstractmethod
    def mark_published(self, record_ids: Sequence[str]) -> None:
        """Mark rows of this lease as published (effective when the lease ends)."""

    @abc.abstractmethod
    def hold(self, record_id: str, reason: str) -> None:
        """Hold a leased row that cannot be published (effective when the lease ends):
        from then on no lease takes its key while the row heads it, so the key stays
        blocked in order but no longer fills the leases other keys need. Hold only a
        key's first row not marked published. An operator lifts it with
        `Ledger.release_outbox` after fixing the cause."""


class Ledger(abc.ABC):
    """The Action Ledger. Every method is safe to call from several threads."""

    @abc.abstractmethod
    def claim(
        self, group: str, topic: str, partitions: Sequence[int], owner: str
    ) -> tuple[PartitionClaim, ...]:
        """Take ownership of `partitions` of `topic` for `group`: bump each one's epoch,
        record `owner`, and return the new epochs with the stored next offsets. Any
        batch still in flight under an older epoch will fail with `FencedError`."""

    @abc.abstractmethod
    def record_attempts(
        self,
        group: str,
        attempts: Sequence[PartitionAttempt],
        epochs: Mapping[tuple[str, int], int],
    ) -> tuple[tuple[str, int], ...]:
        """Durably record, in a transaction of its own, what this start is about to
        decide on each partition, while `epochs` (by topic and partition) still own
        them; returns the partitions a newer claim fenced (nothing recorded for them).
        The next `claim` returns the row as `PartitionClaim.attempt`."""

    @abc.abstractmethod
    def load_views(self, operation_ids: Sequence[str]) -> dict[str, OperationView]:
        """The stored views of the named operations; unknown ids are absent."""

    @abc.abstractmethod
    def arrival_lineage(self, openings: Mapping[str, str | None]) -> dict[str, Arrival]:
        """The lineage each operation a batch is about to open gets from what is stored
        now, in one read for the whole batch: `openings` maps each operation id (not yet
        stored) to the parent its first event names (or None). Every id is answered;
        one the ledger knows nothing about gets an empty `Arrival`. The consumer lays it
        over the new view (`Arrival.applied_to`) so a first batch is decided with the
        lineage its commit will link; `commit` refuses with `VersionConflict` when the
        stored lineage moved in between (docs/lineage.md)."""

    @abc.abstractmethod
    def key_claims(self, keys: Sequence[ClaimKey]) -> dict[ClaimKey, KeyClaim]:
        """The stored owner of each idempotency claim key in `keys` (`machines.claims`:
        principal, capability, key) that has one, in one read for the whole batch: the
        consumer asks for the keys the operations it opens declare, and the fold decides
        a second claimant as a duplicate or a conflicting reuse. `commit` writes the
        claims of the operations a batch opens under a unique key and refuses with
        `VersionConflict` when another operation claimed one in between, so the batch
        is decided again on the stored owner (docs/decision-core.md, "Duplicate business
        operations")."""

    @abc.abstractmethod
    def commit(self, batch: Batch) -> CommitResult:
        """Write everything `batch` caused in one transaction, or nothing. Raises
        `FencedError` (stale epoch), `VersionConflict` (a view moved on),
        `EventIdReused` / `NonceReused` (an id stored for something else), or
        `LedgerUnavailable` (the database stayed unreachable)."""

    @abc.abstractmethod
    def fire_timers(
        self,
        group: str,
        epochs: Mapping[tuple[str, int], int],
        now: datetime,
        *,
        limit: int,
        topics: TopicNames = DEFAULT_TOPICS,
        sign: RowSigner | None = None,
    ) -> FiredTimers:
        """Fire up to `limit` timers due at `now` (the controller's clock) on the
        partitions `epochs` maps (topic, partition) to the epoch claimed at, earliest
        first, in one transaction: each one's event (`machines.timer_event`, signed by
        `sign`) written to the outbox for `topics.events`, keyed by its operation, and
        the timer marked fired. Fenced like `commit`: a partition a newer claim owns
        fires nothing and is named in `FiredTimers.fenced`."""

    @abc.abstractmethod
    def timer_summary(
        self, partitions: Sequence[tuple[str, int]], now: datetime, overdue_after: timedelta
    ) -> TimerSummary:
        """The operations waiting per machine and state, the armed timers and the overdue
        ones (not decided though due before `now - overdue_after`) of `partitions`."""

    @abc.abstractmethod
    def offsets(self, group: str, topic: str) -> dict[int, int]:
        """The stored next offset per partition of `topic` for `group`."""

    @abc.abstractmethod
    def operation(self, operation_id: str) -> OperationInfo:
        """Identity and lineage of one operation; raises `UnknownOperation`."""

    @abc.abstractmethod
    def descendants(self, operation_id: str) -> tuple[str, ...]:
        """Every operation whose parent chain leads to `operation_id`, sorted by depth
        then id (the lineage walk containment cascades along)."""

    @abc.abstractmethod
    def lineage(self, operation_id: str) -> LineageRow:
        """The operation's stored lineage: its known ancestors and their agents, the
        ancestors containing it, whether it is containing and why, its delegated
        credentials (docs/lineage.md). Raises `UnknownOperation`."""

    @abc.abstractmethod
    def lineage_tree(self, operation_id: str) -> tuple[LineageRow, ...]:
        """The operation and every known operation below it, shallowest first then by
        id. Raises `UnknownOperation` when the operation is not stored."""

    @abc.abstractmethod
    def decisions(self, operation_id: str) -> tuple[Mapping[str, Any], ...]:
        """The operation's decision records in sequence order."""

    @abc.abstractmethod
    def lease_outbox(
        self, limit: int, *, payloads: bool = True
    ) -> AbstractContextManager[OutboxLease]:
        """Lease up to `limit` keys' unpublished rows (see `OutboxLease`). With `payloads`
        False a row that carries its signed value may come without its payload (`{}`):
        the relay publishes the value and has no use for it, and PostgreSQL then reads
        neither the payload nor an audit row's record."""

    @abc.abstractmethod
    def held_outbox(self) -> tuple[HeldOutboxRow, ...]:
        """Every held, unpublished outbox row in insertion order (see `OutboxLease.hold`)."""

    @abc.abstractmethod
    def release_outbox(self, record_id: str) -> str | None:
        """Lift the hold on an unpublished row so the next lease retries its key; returns
        the row's key, or None when no held unpublished row has that id."""

    @abc.abstractmethod
    def audit_operation_ids(self) -> tuple[str, ...]:
        """Every operation that has an operation row or an audit record, sorted."""

    @abc.abstractmethod
    def audit_chain(self, operation_id: str) -> tuple[tuple[AuditRecord, ...], ChainHead | None]:
        """The operation's stored audit records in sequence order, and the chain head its
        operation row names (None when there is no operation row)."""

    @abc.abstractmethod
    def audit_outbox(self, operation_id: str | None = None) -> tuple[AuditOutboxRow, ...]:
        """The outbox rows of one operation's audit records (of every operation's, when
        None), published or not, by chain and sequence."""

    @abc.abstractmethod
    def audit_subject(self, operation_id: str) -> AuditSubject:
        """The decision rows and the operation row (state, counter columns, stored view)
        that the operation's audit/2 records commit to, read back as stored."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the ledger is unusable afterwards."""

    def verify_audit(self, operation_id: str | None = None) -> tuple[ChainBreak, ...]:
        """Recompute the audit chain of one operation, or of all; one `ChainBreak` per
        broken chain (the first break in it), empty when every chain is intact."""
        ids = (operation_id,) if operation_id is not None else self.audit_operation_ids()
        breaks: list[ChainBreak] = []
        for op in ids:
            records, head = self.audit_chain(op)
            found = verify_chain(op, records, head)
            if found is None:
                found = verify_subject(op, records, self.audit_subject(op))
            if found is not None:
                breaks.append(found)
        return tuple(breaks)
