"""Benchmark of the Action Ledger against the real server: `python -m ops.bench.ledger`.

Builds realistic batches with the real decision core on a catalogue machine (per
operation: a tool timeout that invokes a capability, a trusted verification, a rejected
event that escalates, and a redelivered duplicate), then times `PostgresLedger.commit`
of each batch into a freshly migrated database: fencing check, operation locks and
version checks, event dedupe, events, decisions, evidence, hash-chained audit records,
outbox rows, folded views and offsets, one transaction per batch, synchronous_commit on.
It prints events per second and rows per second, and the CPU time one event costs the
writer process and its server backend (read from /proc when the server runs on this
host): on a machine shared with other work, the CPU figures are the ones to compare. A
figure, not a test: the target is at least 20,000 events' worth of rows per second on
this machine.

With `--signed` every outbox row is signed as the controller signs it
(`schemas.OutboxSigner`, a key made for the run; its CPU is the writer's). With
`--without-timers` the decisions and views are stripped of their timers before the
commit (the benchmark's doing, not the controller's), so the timers table is never
written: run with and without to read what arming and disarming timers costs a commit
(issue #29).

The server is the one RECOVERY_DATABASE_URL (or --database-url) names, as an
administrative connection, or else a local one started for the run and stopped after.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg.conninfo import make_conninfo

from ledger import (
    Batch,
    CommitResult,
    Entry,
    Position,
    PostgresLedger,
    Source,
    create_database,
    drop_database,
    migrate_database,
    with_database,
)
from machines import (
    CATALOGUE,
    LineageStatus,
    Machine,
    OperationView,
    Policy,
    Registry,
    TimerChange,
    ToolFacts,
    apply,
    decide,
    load_catalogue,
    load_registry,
    new_view,
)
from ops.bench.core import T0, bench_event
from ops.postgres import start_postgres
from schemas import (
    DEFAULT_CONTROLLER_ID,
    DEFAULT_TOPICS,
    OutboxSigner,
    RecordSigner,
    ServiceSettings,
)

GROUP, TOPIC = "bench", "recovery.events"
NO_TIMER_CHANGE = TimerChange()
TARGET_EVENTS_PER_SECOND = 20_000
POLICY = Policy(id="bench", trusted_verifiers=("verifier-1",))
# (event type, verification outcome): the per-operation story of the benchmark.
STORY: tuple[tuple[str, str | None], ...] = (
    ("TOOL_TIMEOUT", None),
    ("VERIFICATION_FOUND", "applied"),
    ("RETRY_SUCCEEDED", None),
)


def _view(machine: Machine, op: str) -> OperationView:
    return new_view(
        operation_id=op,
        machine_name=machine.name,
        machine_digest=machine.digest,
        policy_digest=POLICY.digest,
        initial_state=machine.initial,
        lineage=LineageStatus(agent="agent-1"),
        facts=ToolFacts(idempotency_key=f"key-{op}", status_api=True),
        budget_limit=3,
        deadline=T0 + timedelta(hours=1),
    )


def build_batches(
    machine: Machine,
    registry: Registry,
    operations: int,
    batch_size: int,
    partition: int = 0,
    sign: OutboxSigner | None = None,
    timers: bool = True,
) -> list[Batch]:
    """Batches of about `batch_size` events: each group of operations is opened by one
    batch (timeouts and verifications) and finished by the next (rejected events and
    redelivered duplicates), so half the batches lock and update existing operations.
    Without `timers`, every decision and view is stripped of its timers."""
    per_group = max(1, batch_size // 2)
    batches: list[Batch] = []
    offset = 0
    for start in range(0, operations, per_group):
        ops = [f"op-{partition}-{n:07d}" for n in range(start, min(start + per_group, operations))]
        views = {op: _view(machine, op) for op in ops}
        for stage in ((0, 1), (2, 1)):  # the second stage redelivers event 1
            base = dict(views)
            entries: list[Entry] = []
            for op in ops:
                for index in stage:
                    kind, outcome = STORY[index]
                    event = bench_event(machine, op, index, kind, outcome, task=f"task-{op}")
                    decision = decide(machine, views[op], event, POLICY, registry, event.event_time)
                    if not timers:
                        decision = replace(decision, timers=NO_TIMER_CHANGE)
                    views[op] = apply(views[op], decision)
                    entries.append(Entry(event, decision, Source(TOPIC, partition, offset)))
                    offset += 1
            position = Position(TOPIC, partition, 1, offset)
            batches.append(
                Batch(
                    GROUP,
                    (position,),
                    base,
                    tuple(entries),
                    folded=dict(views),
                    sign=sign,
                )
            )
    return batches


@dataclass
class _Totals:
    events: int = 0
    rows: int = 0
    decisions: int = 0
    audit: int = 0
    outbox: int = 0
    client_cpu: float = 0.0  # seconds of the writer process
    server_cpu: float | None = None  # seconds of its backend; None: not readable here

    def add(self, batch: Batch, result: CommitResult) -> None:
        self.events += len(batch.entries)
        self.rows += result.rows
        self.decisions += result.decisions
        self.audit += result.audit_records
        self.outbox += result.outbox_rows


def fill_signed_ledger(url: str, operations: int) -> None:
    """Migrate the database at `url` and commit `operations` operations of the
    delegated-research machine into it, in batches of 500 with every outbox row signed as
    the controller signs it: the ledger the read and drain benchmarks start from."""
    migrate_database(url)
    registry = load_registry()
    machine = load_catalogue(registry, CATALOGUE)["delegated-research"]
    key = Ed25519PrivateKey.generate()
    sign = OutboxSigner(RecordSigner(DEFAULT_CONTROLLER_ID, key), DEFAULT_TOPICS)
    writer = PostgresLedger(url, max_size=1)
    try:
        writer.claim(GROUP, TOPIC, [0], "bench")
        for batch in build_batches(machine, registry, operations, 500, 0, sign):
            writer.commit(batch)
    finally:
        writer.close()


def _backend_pid(url: str, application_name: str) -> int:
    """The server process of the writer's one pooled connection, found by the
    `application_name` the writer gave it (the ledger does not expose its connections)."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = "
            "current_database()",
            (application_name,),
        ).fetchone()
    if row is None:
        raise RuntimeError(f"no server backend has application_name {application_name!r}")
    return int(row[0])


def _backend_cpu(pid: int) -> float | None:
    """CPU seconds the server process `pid` has run (Linux schedstat), or None when it
    is not a process of this host."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
            return int(stat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _writer(
    url: str,
    partition: int,
    operations: int,
    batch_size: int,
    signed: bool,
    barrier: Barrier,
    results: Queue[tuple[float, float, int, _Totals]],
    timers: bool = True,
) -> None:
    """One controller process owning one partition: build its batches with the core,
    warm up, wait for the others, commit every batch, report (start, end, batches)."""
    registry = load_registry()
    machine = load_catalogue(registry, CATALOGUE)["delegated-research"]
    sign = None
    if signed:
        key = Ed25519PrivateKey.generate()
        sign = OutboxSigner(RecordSigner(DEFAULT_CONTROLLER_ID, key), DEFAULT_TOPICS)
    batches = build_batches(machine, registry, operations, batch_size, partition, sign, timers)
    # The prebuilt batches stand for the Kafka backlog, which a controller does not hold
    # as Python objects (it holds one batch, and freezes its startup objects out of the
    # collector, consumer/heap.py): without this, every full collection walks the
    # whole backlog, about 15% of the writer's CPU that no controller pays.
    gc.collect()
    gc.freeze()
    application_name = f"bench-ledger-writer-{partition}-{os.getpid()}"
    ledger = PostgresLedger(
        make_conninfo(url, application_name=application_name), min_size=1, max_size=1
    )
    totals = _Totals()
    try:
        ledger.commit(batches[0])  # warm the connection and the caches
        backend = _backend_pid(url, application_name)
        barrier.wait()
        start, cpu, server = time.perf_counter(), time.process_time(), _backend_cpu(backend)
        for batch in batches[1:]:
            totals.add(batch, ledger.commit(batch))
        end = time.perf_counter()
        totals.client_cpu = time.process_time() - cpu
        after = _backend_cpu(backend)
        if server is not None and after is not None:
            totals.server_cpu = after - server
    finally:
        ledger.close()
    results.put((start, end, len(batches) - 1, totals))


def run(
    admin_url: str,
    operations: int,
    batch_size: int,
    writers: int,
    signed: bool = False,
    timers: bool = True,
) -> None:
    """Create a database, migrate it, commit every batch, print the figures, drop it.
    Each writer is a process owning one partition with its own connection, as one
    controller per partition would be; they share the server, as in production."""
    name = f"bench_ledger_{uuid.uuid4().hex[:10]}"
    create_database(admin_url, name)
    url = with_database(admin_url, name)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(writers)
    results: Queue[tuple[float, float, int, _Totals]] = context.Queue()
    try:
        migrate_database(url)
        ledger = PostgresLedger(url, max_size=1)
        try:
            ledger.claim(GROUP, TOPIC, list(range(writers)), "bench")
        finally:
            ledger.close()
        procs = [
            context.Process(
                target=_writer,
                args=(url, p, operations // writers, batch_size, signed, barrier, results, timers),
            )
            for p in range(writers)
        ]
        for proc in procs:
            proc.start()
        reports = [results.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join()
    finally:
        drop_database(admin_url, name)
    elapsed = max(r[1] for r in reports) - min(r[0] for r in reports)
    committed = sum(r[2] for r in reports)
    _report([r[3] for r in reports], elapsed, committed, batch_size, writers)


def _report(
    totals: list[_Totals], elapsed: float, committed: int, batch_size: int, writers: int
) -> None:
    events = sum(t.events for t in totals)
    rows = sum(t.rows for t in totals)
    decisions = sum(t.decisions for t in totals)
    audit = sum(t.audit for t in totals)
    outbox = sum(t.outbox for t in totals)
    print(
        f"batches: {committed} of ~{batch_size} events by {writers} writer(s), "
        f"{elapsed:.2f}s, synchronous_commit on"
    )
    print(f"events committed:        {events / elapsed:>10,.0f} events/s")
    print(
        f"decisions+audit+outbox:  {(decisions + audit + outbox) / elapsed:>10,.0f} rows/s "
        f"({decisions:,} decisions, {audit:,} audit, {outbox:,} outbox)"
    )
    print(f"all rows (incl. events, evidence): {rows / elapsed:,.0f} rows/s")
    print(f"per batch and writer:    {elapsed / committed * writers * 1000:>10.1f} ms")
    client = sum(t.client_cpu for t in totals) / events * 1e6
    servers = [t.server_cpu for t in totals]
    server = (
        "not readable (remote server)"
        if any(s is None for s in servers)
        else f"{sum(s or 0.0 for s in servers) / events * 1e6:.0f} us"
    )
    print(f"CPU per event:           client {client:.0f} us, server backend {server}")
    rate = events / elapsed
    verdict = "met" if rate >= TARGET_EVENTS_PER_SECOND else "NOT met"
    share = rate / TARGET_EVENTS_PER_SECOND
    print(f"target {TARGET_EVENTS_PER_SECOND:,} events/s: {verdict} ({share:.0%})")


def main() -> None:
    """Parse arguments, find or start a server, run the benchmark."""
    parser = argparse.ArgumentParser(prog="python -m ops.bench.ledger", description=__doc__)
    parser.add_argument("--database-url", default=ServiceSettings.load().database_url)
    parser.add_argument("--operations", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--writers", type=int, default=2, help="writer processes, one partition each"
    )
    parser.add_argument(
        "--signed", action="store_true", help="sign every outbox row as the controller does"
    )
    parser.add_argument(
        "--without-timers",
        action="store_true",
        help="strip the decisions' timers first: what a commit costs without them",
    )
    args = parser.parse_args()
    timers = not args.without_timers
    if args.database_url:
        run(args.database_url, args.operations, args.batch_size, args.writers, args.signed, timers)
        return
    root = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    root.chmod(0o755)
    server = start_postgres(root / "postgres")
    try:
        run(server.url, args.operations, args.batch_size, args.writers, args.signed, timers)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
