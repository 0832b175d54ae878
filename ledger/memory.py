"""The in-memory Action Ledger: the same plan, checks and chains as PostgreSQL, in dicts.

It executes `ledger.records.batch_rows` exactly as `PostgresLedger` does and raises the
same errors in the same situations (the abstract suite in `tests/unit/ledger` holds both
to it), so tests of the core and of the consumer that run on it mean something. One lock
serialises writers, which is the strongest form of the row locks PostgreSQL takes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger.audit import (
    AuditRecord,
    AuditSubject,
    ChainHead,
    DecisionRowFacts,
    chain_records,
    genesis_head,
)
from ledger.cascade import lineage_message, plan_lineage
from ledger.claims import check_claims
from ledger.codec import view_to_json
from ledger.deadletters import plan_dead_letters
from ledger.errors import (
    EventIdReused,
    FencedError,
    NonceReused,
    UnknownOperation,
    VersionConflict,
    fenced_message,
    reuse_message,
    version_message,
)
from ledger.interface import (
    AuditOutboxRow,
    CommitResult,
    HeldOutboxRow,
    Ledger,
    OperationInfo,
    OutboxLease,
    OutboxRecord,
    PartitionAttempt,
    PartitionClaim,
)
from ledger.jsonutil import dumps
from ledger.lineage_step import (
    batch_time,
    cascade_producer,
    check_arrivals,
    lineage_inputs,
    lineage_moved,
    opened_lineage,
    with_lineage_plan,
)
from ledger.records import (
    Batch,
    BatchRows,
    OperationRow,
    OutboxRow,
    RowSigner,
    TimerRow,
    TimerRows,
    audit_bodies,
    batch_rows,
    command_lineage,
    finish_outbox,
    heads_row,
)
from ledger.timers import (
    DueTimer,
    FiredTimer,
    FiredTimers,
    TimerSummary,
    WaitingState,
    firing_rows,
)
from machines import (
    Arrival,
    ClaimKey,
    KeyClaim,
    LineageRow,
    OperationView,
    arrival_of,
    with_lineage,
)
from schemas import DEFAULT_TOPICS, TopicNames

__all__ = ["MemoryLedger"]


@dataclass(slots=True)
class _Operation:
    info: OperationInfo
    view: OperationView
    head: ChainHead


@dataclass(slots=True)
class _Outbox:
    position: int
    row: OutboxRow
    published: bool = False
    held: tuple[datetime, str] | None = None  # (held_at, reason): OutboxLease.hold
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    published_at: datetime | None = None


@dataclass(slots=True)
class _Timer:
    row: TimerRow
    fired_at: datetime | None = None
    spent: bool = False


@dataclass(slots=True)
class _State:
    operations: dict[str, _Operation] = field(default_factory=dict)
    events: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (op, digest)
    decisions: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    evidence: list[Any] = field(default_factory=list)
    nonces: set[str] = field(default_factory=set)
    audit: dict[str, list[AuditRecord]] = field(default_factory=dict)
    outbox: list[_Outbox] = field(default_factory=list)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    epochs: dict[tuple[str, str, int], tuple[int, str]] = field(default_factory=dict)
    attempts: dict[tuple[str, str, int], PartitionAttempt] = field(default_factory=dict)
    leased_keys: set[str] = field(default_factory=set)
    chains: dict[str, ChainHead] = field(default_factory=dict)  # intake chain heads
    lineage: dict[str, LineageRow] = field(default_factory=dict)
    timers: dict[str, _Timer] = field(default_factory=dict)
    claims: dict[ClaimKey, KeyClaim] = field(default_factory=dict)


class _MemoryLease(OutboxLease):
    def __init__(self, records: tuple[OutboxRecord, ...]) -> None:
        self.records = records
        self.published: set[str] = set()
        self.held: dict[str, str] = {}

    def mark_published(self, record_ids: Sequence[str]) -> None:
        self.published.update(record_ids)

    def hold(self, record_id: str, reason: str) -> None:
        self.held.setdefault(record_id, reason)


class MemoryLedger(Ledger):
    """An Action Ledger held in memory; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._s = _State()

    def claim(
        self, group: str, topic: str, partitions: Sequence[int], owner: str
    ) -> tuple[PartitionClaim, ...]:
        """See `Ledger.claim`."""
        out: list[PartitionClaim] = []
        with self._lock:
            for partition in sorted(set(partitions)):
                key = (group, topic, partition)
                epoch = self._s.epochs.get(key, (0, ""))[0] + 1
                self._s.epochs[key] = (epoch, owner)
                out.append(
                    PartitionClaim(
                        topic, partition, epoch, self._s.offsets.get(key), self._s.attempts.get(key)
                    )
                )
        return tuple(out)

    def record_attempts(
        self,
        group: str,
        attempts: Sequence[PartitionAttempt],
        epochs: Mapping[tuple[str, int], int],
    ) -> tuple[tuple[str, int], ...]:
        """See `Ledger.record_attempts`."""
        fenced: list[tuple[str, int]] = []
        with self._lock:
            for a in attempts:
                key = (group, a.topic, a.partition)
                owned = self._s.epochs.get(key)
                if owned is None or owned[0] != epochs[(a.topic, a.partition)]:
                    fenced.append((a.topic, a.partition))
                    continue
                self._s.attempts[key] = replace(a, owner=owned[1])
        return tuple(fenced)

    def load_views(self, operation_ids: Sequence[str]) -> dict[str, OperationView]:
        """See `Ledger.load_views`."""
        with self._lock:
            ops, lineage = self._s.operations, self._s.lineage
            out: dict[str, OperationView] = {}
            for op in operation_ids:
                if op in ops:
                    row = lineage[op]
                    out[op] = with_lineage(
                        ops[op].view,
                        row.ancestors,
                        row.lineage_agents,
                        row.contained_ancestors,
                        row.descendant_agents,
                    )
            return out

    def arrival_lineage(self, openings: Mapping[str, str | None]) -> dict[str, Arrival]:
        """See `Ledger.arrival_lineage`."""
        with self._lock:
            known = self._s.lineage
            children: dict[str, list[LineageRow]] = {}
            for row in known.values():
                parent = row.parent_operation
                if parent is not None and parent in openings:
                    children.setdefault(parent, []).append(row)
            return {
                op: arrival_of(op, known.get(parent) if parent else None, children.get(op, ()))
                for op, parent in openings.items()
            }

    def key_claims(self, keys: Sequence[ClaimKey]) -> dict[ClaimKey, KeyClaim]:
        """See `Ledger.key_claims`."""
        with self._lock:
            claims = self._s.claims
            return {k: claims[k] for k in keys if k in claims}

    def commit(self, batch: Batch) -> CommitResult:
        """See `Ledger.commit`."""
        plan = batch_rows(batch)
        with self._lock:
            self._check_fences(batch)
            self._check_versions(plan)
            self._check_ids(plan)
            check_claims(plan, self._s.claims)
            plan, lineage = self._lineage_step(plan, batch)
            result = self._write(batch, plan)
            self._s.lineage.update(lineage)
            self._s.claims.update((c.key, c.claim) for c in plan.claims)
            return result

    def _lineage_step(
        self, plan: BatchRows, batch: Batch
    ) -> tuple[BatchRows, dict[str, LineageRow]]:
        """Link opened operations and walk the lineage of containment changes, as
        `PostgresLedger` does inside its transaction (the lock makes it atomic here)."""
        if not plan.needs_lineage:
            return plan, {}
        ids, roots = lineage_inputs(plan)
        known = self._s.lineage
        stored = {op: known[op] for op in ids if op in known}
        for op in list(stored):  # and their ancestors, as the PostgreSQL walk reads them
            stored.update({a: known[a] for a in stored[op].ancestors if a in known})
        for op in self._below(roots):
            stored[op] = known[op]
        check_arrivals(plan, stored, batch.unlinked)
        lineage = plan_lineage(
            stored,
            opened_lineage(plan),
            plan.containments,
            batch_time(plan),
            cascade_producer(batch.sign),
            batch.unlinked,
        )
        return with_lineage_plan(plan, lineage, batch.topics, batch.sign), dict(lineage.rows)

    def _below(self, roots: set[str]) -> set[str]:
        children: dict[str, list[str]] = {}
        for op, row in self._s.lineage.items():
            if row.parent_operation is not None:
                children.setdefault(row.parent_operation, []).append(op)
        found: set[str] = set()
        stack = [c for r in roots for c in children.get(r, ())]
        while stack:
            op = stack.pop()
            if op not in found:
                found.add(op)
                stack.extend(children.get(op, ()))
        return found

    def _check_fences(self, batch: Batch) -> None:
        for pos in batch.positions:
            key = (batch.group, pos.topic, pos.partition)
            stored = self._s.epochs.get(key)
            if stored is None or stored[0] != pos.epoch:
                raise FencedError(
                    fenced_message(
                        batch.group,
                        pos.topic,
                        pos.partition,
                        pos.epoch,
                        None if stored is None else stored[0],
                    )
                )

    def _check_versions(self, plan: BatchRows) -> None:
        for row in plan.operations:
            stored = self._s.operations.get(row.operation_id)
            version = 0 if stored is None else stored.info.version
            if version != row.expected_version:
                raise VersionConflict(
                    version_message(row.operation_id, row.expected_version, version)
                )
            known = self._s.lineage.get(row.operation_id)
            if known is not None and lineage_moved(
                row, known.contained_ancestors, known.lineage_agents + known.descendant_agents
            ):
                raise VersionConflict(lineage_message(row.operation_id))

    def _check_ids(self, plan: BatchRows) -> None:
        for event in plan.events:
            stored = self._s.events.get(event.event_id)
            if stored is not None:
                raise EventIdReused(
                    reuse_message(event.event_id, event.operation_id, stored[0]),
                    event_id=event.event_id,
                )
        nonces = [a.nonce for a in plan.approvals]
        for approval in plan.approvals:
            if approval.nonce in self._s.nonces or nonces.count(approval.nonce) > 1:
                raise NonceReused(
                    f"approval nonce {approval.nonce} of event {approval.event_id} (operation "
                    f"{approval.operation_id}) is already stored: dead-letter the replay",
                    nonce=approval.nonce,
                )

    def _stored_info(
        self, row: OperationRow, existing: _Operation | None, depth: int
    ) -> OperationInfo:
        """The operation row `row` leaves: its state and version, and its machine when
        the batch migrated it (`OperationRow.migrated`), in the lineage rows too."""
        info = existing.info if existing is not None else _new_info(row, depth)
        info = replace(info, state=row.view.state, version=row.view.version)
        if row.migrated:
            info = replace(
                info,
                machine_version=row.view.machine_version,
                machine_digest=row.view.machine_digest,
            )
            known = self._s.lineage.get(row.operation_id)
            if known is not None:
                self._s.lineage[row.operation_id] = replace(
                    known, machine_version=row.view.machine_version
                )
        return info

    def _write(self, batch: Batch, plan: BatchRows) -> CommitResult:
        s = self._s
        chained: dict[str, list[AuditRecord]] = {}
        for op, bodies in audit_bodies(plan).items():
            existing = s.operations.get(op)
            head = existing.head if existing is not None else genesis_head(op)
            chained[op] = chain_records(op, head, bodies)
        # Depths come from the operations stored before this batch, as PostgreSQL's
        # single INSERT ... SELECT sees them.
        depths = {row.operation_id: self._depth(row.parent_operation) for row in plan.operations}
        for row in plan.operations:
            existing = s.operations.get(row.operation_id)
            records = chained.get(row.operation_id, [])
            head = (
                ChainHead(records[-1].sequence, records[-1].hash)
                if records
                else (existing.head if existing is not None else genesis_head(row.operation_id))
            )
            info = self._stored_info(row, existing, depths[row.operation_id])
            s.operations[row.operation_id] = _Operation(info, row.view, head)
        self._write_timers(plan.timers)
        for event in plan.events:
            s.events[event.event_id] = (event.operation_id, event.payload_digest)
        for decision in plan.decisions:
            s.decisions.setdefault(decision.operation_id, []).append(decision.decision)
        s.evidence.extend(plan.evidence)
        s.nonces.update(a.nonce for a in plan.approvals)
        for op, records in chained.items():
            s.audit.setdefault(op, []).extend(records)
        outbox = finish_outbox(
            plan, chained, batch.topics, sign=batch.sign, lineages=self._lineages(plan)
        )
        for out in outbox:
            s.outbox.append(_Outbox(len(s.outbox) + 1, out))
        heads_at = len(s.outbox)
        stored_ids = {item.row.record_id for item in s.outbox}
        cascaded = 0
        for out in plan.cascade:
            if out.record_id not in stored_ids:  # as ON CONFLICT DO NOTHING
                s.outbox.append(_Outbox(len(s.outbox) + 1, out))
                cascaded += 1
        letters, intake = self._write_dead_letters(batch)
        heads = heads_row({**chained, **intake}, batch.topics, batch.sign)
        self._insert_at(heads_at, heads)
        for pos in batch.positions:
            s.offsets[(batch.group, pos.topic, pos.partition)] = pos.next_offset
        return CommitResult(
            events=len(plan.events),
            decisions=len(plan.decisions),
            evidence=len(plan.evidence),
            approvals=len(plan.approvals),
            audit_records=sum(len(r) for r in chained.values()) + letters[0],
            outbox_rows=len(outbox) + cascaded + letters[1] + (heads is not None),
            dead_letters=len(batch.dead_letters),
        )

    def _write_timers(self, timers: TimerRows) -> None:
        """The batch's changes to the timers, as `ledger.postgres_commit` writes them."""
        table = self._s.timers
        for timer_id in timers.disarmed:
            table.pop(timer_id, None)
        for timer_id in timers.spent:
            if timer_id in table:
                table[timer_id].spent = True
        for row in timers.armed:
            table.setdefault(row.timer.timer_id, _Timer(row, spent=row.timer.spent))

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
        """See `Ledger.fire_timers`: the same slice, rows and fencing as PostgreSQL."""
        with self._lock:
            s = self._s
            fenced = tuple(
                tp
                for tp in sorted(epochs)
                if s.epochs.get((group, *tp), (None, ""))[0] != epochs[tp]
            )
            live = set(epochs) - set(fenced)
            due = sorted(
                (
                    t
                    for t in s.timers.values()
                    if t.fired_at is None
                    and t.row.timer.due_at <= now
                    and (t.row.topic, t.row.partition) in live
                ),
                key=lambda t: t.row.timer.due_at,
            )[: max(limit, 0)]
            items = [self._due(t.row) for t in due]
            stored = {item.row.record_id for item in s.outbox}
            for out in firing_rows(items, topics, sign, now):
                if out.record_id not in stored:  # as ON CONFLICT DO NOTHING
                    s.outbox.append(_Outbox(len(s.outbox) + 1, out))
            for t in due:
                t.fired_at = now
            fired = tuple(
                FiredTimer(t.row.timer.timer_id, t.row.operation_id, t.row.timer.kind,
                           t.row.timer.due_at, now)
                for t in due
            )  # fmt: skip
            return FiredTimers(fired, fenced, full=limit > 0 and len(due) >= limit)

    def _due(self, row: TimerRow) -> DueTimer:
        info = self._s.operations[row.operation_id].info
        return DueTimer(
            row.timer,
            row.operation_id,
            info.correlation_id,
            info.machine_name,
            info.machine_version,
            info.lineage,
        )

    def timer_summary(
        self, partitions: Sequence[tuple[str, int]], now: datetime, overdue_after: timedelta
    ) -> TimerSummary:
        """See `Ledger.timer_summary`."""
        wanted = set(partitions)
        with self._lock:
            rows = [t for t in self._s.timers.values() if (t.row.topic, t.row.partition) in wanted]
        groups: dict[tuple[str, str], list[_Timer]] = {}
        for t in rows:
            if t.row.timer.kind in ("state", "stalled"):
                groups.setdefault((t.row.machine_name, t.row.timer.state), []).append(t)
        waiting = tuple(
            WaitingState(
                machine,
                state,
                len(ts),
                min(t.row.timer.armed_at for t in ts),
                sum(t.row.timer.kind == "stalled" and t.spent for t in ts),
            )
            for (machine, state), ts in sorted(groups.items())
        )
        before = now - overdue_after
        overdue = sum(not t.spent and t.row.timer.due_at < before for t in rows)
        return TimerSummary(waiting, len(rows), overdue)

    def _insert_at(self, index: int, row: OutboxRow | None) -> None:
        """Insert `row` (the batch's chain-heads record) where PostgreSQL puts it: after
        the batch's rows, before its cascade events and dead letters."""
        if row is None:
            return
        later = [item.row for item in self._s.outbox[index:]]
        del self._s.outbox[index:]
        for out in (row, *later):
            self._s.outbox.append(_Outbox(len(self._s.outbox) + 1, out))

    def _lineages(self, plan: BatchRows) -> dict[str, dict[str, Any]]:
        """As `ledger.postgres_commit`: the lineage each operation's commands carry, from
        its stored row (opened earlier, or just now by `_write`)."""
        out: dict[str, dict[str, Any]] = {}
        for op in {c.key for c in plan.commands}:
            stored = self._s.operations.get(op)
            if stored is not None:
                i = stored.info
                out[op] = command_lineage(
                    i.agent,
                    i.task,
                    i.initiating_principal,
                    i.origin_operation,
                    i.parent_operation,
                    i.delegated_credentials,
                )
        return out

    def _write_dead_letters(
        self, batch: Batch
    ) -> tuple[tuple[int, int], dict[str, list[AuditRecord]]]:
        """The same rows `ledger.postgres_commit` writes for dead letters on PostgreSQL."""
        s = self._s
        heads = {
            d.chain_id: s.chains.get(d.chain_id, genesis_head(d.chain_id))
            for d in batch.dead_letters
        }
        chained, rows = plan_dead_letters(
            batch.dead_letters, heads, batch.topics.audit, batch.topics.dlq, batch.sign
        )
        for chain, records in chained.items():
            s.audit.setdefault(chain, []).extend(records)
            s.chains[chain] = ChainHead(records[-1].sequence, records[-1].hash)
        for row in rows:
            out = OutboxRow(
                row.record_id,
                row.topic,
                row.key,
                row.headers,
                dumps(row.payload),
                audit_sequence=row.audit_sequence,
                value=row.value,
            )
            s.outbox.append(_Outbox(len(s.outbox) + 1, out))
        return (sum(len(r) for r in chained.values()), len(rows)), chained

    def _depth(self, parent: str | None) -> int:
        if parent is None:
            return 0
        stored = self._s.operations.get(parent)
        return 1 if stored is None else stored.info.depth + 1

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        """See `Ledger.offsets`."""
        with self._lock:
            return {
                p: offset
                for (g, t, p), offset in self._s.offsets.items()
                if (g, t) == (group, topic)
            }

    def operation(self, operation_id: str) -> OperationInfo:
        """See `Ledger.operation`."""
        with self._lock:
            stored = self._s.operations.get(operation_id)
        if stored is None:
            raise UnknownOperation(f"operation {operation_id} is not in the ledger")
        return stored.info

    def descendants(self, operation_id: str) -> tuple[str, ...]:
        """See `Ledger.descendants`."""
        with self._lock:
            infos = [o.info for o in self._s.operations.values()]
        found: dict[str, int] = {}
        frontier = {operation_id}
        level = 0
        while frontier:
            level += 1
            children = {
                i.operation_id
                for i in infos
                if i.parent_operation in frontier and i.operation_id not in found
            }
            found.update(dict.fromkeys(children, level))
            frontier = children
        return tuple(sorted(found, key=lambda op: (found[op], op)))

    def lineage(self, operation_id: str) -> LineageRow:
        """See `Ledger.lineage`."""
        with self._lock:
            return self._lineage_row(operation_id)

    def _lineage_row(self, operation_id: str) -> LineageRow:
        stored = self._s.operations.get(operation_id)
        if stored is None:
            raise UnknownOperation(f"operation {operation_id} is not in the ledger")
        return replace(self._s.lineage[operation_id], state=stored.info.state)

    def lineage_tree(self, operation_id: str) -> tuple[LineageRow, ...]:
        """See `Ledger.lineage_tree`."""
        with self._lock:
            root = self._lineage_row(operation_id)
            below = self._below({operation_id})
            rows = [self._lineage_row(op) for op in below]
        depth = len(root.ancestors)
        rows.sort(key=lambda r: (_level(r, operation_id, depth), r.operation_id))
        return (root, *rows)

    def decisions(self, operation_id: str) -> tuple[Mapping[str, Any], ...]:
        """See `Ledger.decisions`."""
        with self._lock:
            return tuple(self._s.decisions.get(operation_id, ()))

    @contextmanager
    def lease_outbox(self, limit: int, *, payloads: bool = True) -> Iterator[OutboxLease]:
        """See `Ledger.lease_outbox`."""
        with self._lock:
            keys: list[str] = []
            seen: set[str] = set()  # keys whose head was passed: leased, held or busy
            for item in self._s.outbox:
                key = item.row.key
                if len(keys) >= limit:
                    break
                if item.published or key in seen:
                    continue
                seen.add(key)
                if key not in self._s.leased_keys and item.held is None:
                    keys.append(key)
            self._s.leased_keys.update(keys)
            records = tuple(
                _leased(i) for i in self._s.outbox if not i.published and i.row.key in keys
            )
        lease = _MemoryLease(records)
        try:
            yield lease
            with self._lock:
                now = datetime.now(UTC)
                for item in self._s.outbox:
                    if item.row.key not in keys or item.published:
                        continue
                    if item.row.record_id in lease.published:
                        item.published = True
                        item.published_at = datetime.now(UTC)
                    elif item.row.record_id in lease.held and item.held is None:
                        item.held = (now, lease.held[item.row.record_id])
        finally:
            with self._lock:
                self._s.leased_keys.difference_update(keys)

    def held_outbox(self) -> tuple[HeldOutboxRow, ...]:
        """See `Ledger.held_outbox`."""
        with self._lock:
            unpublished = [i for i in self._s.outbox if not i.published]
            return tuple(
                HeldOutboxRow(
                    i.position,
                    i.row.record_id,
                    i.row.topic,
                    i.row.key,
                    i.held[0],
                    i.held[1],
                    _waiting_behind(unpublished, i),
                )
                for i in unpublished
                if i.held is not None
            )

    def release_outbox(self, record_id: str) -> str | None:
        """See `Ledger.release_outbox`."""
        with self._lock:
            for item in self._s.outbox:
                if item.row.record_id == record_id and not item.published and item.held:
                    item.held = None
                    return item.row.key
            return None

    def audit_outbox(self, operation_id: str | None = None) -> tuple[AuditOutboxRow, ...]:
        """See `Ledger.audit_outbox`."""
        with self._lock:
            found = [
                AuditOutboxRow(
                    chain=i.row.key,
                    sequence=i.row.audit_sequence,
                    record=OutboxRecord(
                        i.position, i.row.record_id, i.row.topic, i.row.key,
                        dict(i.row.headers), {}, i.row.value,
                    ),
                    created_at=i.created_at,
                    published_at=i.published_at,
                )
                for i in self._s.outbox
                if i.row.audit_sequence is not None
                and (operation_id is None or i.row.key == operation_id)
            ]  # fmt: skip
        return tuple(sorted(found, key=lambda r: (r.chain, r.sequence)))

    def audit_operation_ids(self) -> tuple[str, ...]:
        """See `Ledger.audit_operation_ids`."""
        with self._lock:
            return tuple(sorted(set(self._s.operations) | set(self._s.audit)))

    def audit_chain(self, operation_id: str) -> tuple[tuple[AuditRecord, ...], ChainHead | None]:
        """See `Ledger.audit_chain`."""
        with self._lock:
            stored = self._s.operations.get(operation_id)
            records = tuple(sorted(self._s.audit.get(operation_id, ()), key=lambda r: r.sequence))
            head = stored.head if stored is not None else self._s.chains.get(operation_id)
        return records, head

    def audit_subject(self, operation_id: str) -> AuditSubject:
        """See `Ledger.audit_subject`."""
        with self._lock:
            stored = self._s.operations.get(operation_id)
            decided = tuple(self._s.decisions.get(operation_id, ()))
        rows = tuple(
            DecisionRowFacts(
                int(d["sequence"]), d["outcome"], d["state_before"], d["state_after"], d
            )
            for d in decided
        )
        if stored is None:
            return AuditSubject(rows, None, {}, None)
        view = stored.view
        counters = {
            "version": view.version,
            "epoch": view.epoch,
            "retry_attempts": view.retry_attempts,
            "recovery_attempts": view.recovery_attempts,
            "budget_spent": view.budget_spent,
        }
        return AuditSubject(rows, view.state, counters, view_to_json(view))

    def tamper_audit(self, operation_id: str, sequence: int, record: Mapping[str, Any]) -> None:
        """Test hook: overwrite a stored audit record's body, as an attacker with write
        access to the store would (the PostgreSQL tests do it with UPDATE)."""
        with self._lock:
            records = self._s.audit[operation_id]
            records[:] = [
                replace(r, record=record) if r.sequence == sequence else r for r in records
            ]

    def delete_audit(self, operation_id: str, sequence: int) -> None:
        """Test hook: remove a stored audit record (the PostgreSQL tests use DELETE)."""
        with self._lock:
            records = self._s.audit[operation_id]
            records[:] = [r for r in records if r.sequence != sequence]

    def close(self) -> None:
        """Nothing to release."""


def _waiting_behind(unpublished: Sequence[_Outbox], held: _Outbox) -> int:
    return sum(1 for w in unpublished if w.row.key == held.row.key and w.position > held.position)


def _new_info(row: Any, depth: int) -> OperationInfo:
    view: OperationView = row.view
    return OperationInfo(
        operation_id=row.operation_id,
        correlation_id=row.correlation_id,
        machine_name=view.machine_name,
        machine_version=row.machine_version,
        machine_digest=view.machine_digest,
        state=view.state,
        version=view.version,
        initiating_principal=row.initiating_principal,
        agent=row.agent,
        runtime=row.runtime,
        task=row.task,
        origin_operation=row.origin_operation,
        parent_operation=row.parent_operation,
        depth=depth,
        delegated_credentials=tuple(row.delegated_credentials),
    )


def _level(row: LineageRow, root: str, root_depth: int) -> int:
    """How far below `root` the row is (its position in its ancestor chain)."""
    if root in row.ancestors:
        return row.ancestors.index(root) + 1
    return len(row.ancestors) - root_depth


def _leased(item: _Outbox) -> OutboxRecord:
    """An outbox row as a lease returns it."""
    row = item.row
    return OutboxRecord(
        item.position,
        row.record_id,
        row.topic,
        row.key,
        dict(row.headers),
        json.loads(row.payload_json),
        row.value,
    )
