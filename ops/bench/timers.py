"""The timer storm of `ops/dev bench --timers N` (issue #29): N timers due at once.

`seed_due_timers` commits, straight into the run's ledger and with the real decision
core, N operations of the pinned email-send machine whose first event was rejected (the
seeding policy escalates nothing and stalls after a second), so that each holds a stall
timer due a second later on one of the run's partitions; it then marks the seeded
outbox rows published (they are the seed's, not the run's to publish). The runner then
starts a controller and a relay on those due timers and a fresh live backlog together:
the controller fires the timers slice by slice between its batches, each comes back
through the events topic and is decided (escalated once, outcome `fired`), and the
figures say how long the N took and what the live backlog's throughput was meanwhile,
against the saturation phase's (`runner._timer_storm`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import psycopg

from ledger import Batch, Entry, PostgresLedger, Source
from machines import BatchFold, Event, Lineage, Policy, Rules, parse_policy
from ops.bench.workload import pinned_machines

__all__ = ["SEED_MACHINE", "seed_due_timers", "timers_fired"]

SEED_MACHINE = "email-send"
_SEED_BATCH = 500
# Nothing the seed decides escalates or commands anything; every seeded state stalls
# after a second.
_SEED_POLICY: Policy = parse_policy(
    {
        "id": "bench-timer-seed",
        "escalate_rejected_events": False,
        "timeouts": {"stalled_after": "1s"},
    }
)


def seed_due_timers(url: str, run_id: str, count: int, topic: str, partitions: int) -> list[str]:
    """Commit `count` operations whose stall timers fall due a second from now (module
    docstring); returns their ids."""
    machines, registry = pinned_machines()
    machine = next(m for m in machines.values() if m.name == SEED_MACHINE)
    rules = Rules(_SEED_POLICY, registry)
    ops = [f"bench-{run_id}-timer-{n}" for n in range(count)]
    ledger = PostgresLedger(url, max_size=1)
    try:
        for start in range(0, count, _SEED_BATCH):
            chunk = ops[start : start + _SEED_BATCH]
            fold = BatchFold({}, rules)
            now = datetime.now(UTC)
            entries = []
            for n, op in enumerate(chunk, start=start):
                event = _rejected(machine.name, machine.version, op, now)
                decision = fold.decider(event, machine, now)()
                fold.fold(event, decision)
                entries.append(Entry(event, decision, Source(topic, n % partitions, n)))
            ledger.commit(
                Batch(
                    "bench-timer-seed",
                    (),
                    dict(fold.base),
                    tuple(entries),
                    folded=dict(fold.current),
                )
            )
    finally:
        ledger.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE outbox SET published_at = now() WHERE published_at IS NULL")
    return ops


def _rejected(name: str, version: str, op: str, now: datetime) -> Event:
    """An event the machine's initial state does not accept: rejected, nothing invoked."""
    return Event(
        event_type="RETRY_SUCCEEDED",
        event_id=f"{op}-seed",
        operation_id=op,
        correlation_id=f"corr-{op}",
        machine_name=name,
        machine_version=version,
        event_time=now,
        evidence_ref=f"bench-seed:{op}",
        producer="bench-tool",
        lineage=Lineage(agent="bench-agent", task=f"task-{op}", initiating_principal="bench"),
    )


def timers_fired(url: str, prefix: str) -> int:
    """How many of the seeded operations' stall timers have been decided."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM decisions WHERE operation_id LIKE %s "
            "AND event_id LIKE 'timer:%%' AND outcome = 'fired'",
            (f"{prefix}%",),
        ).fetchone()
    return 0 if row is None else int(row[0])


def wait_fired(url: str, prefix: str, count: int, timeout: float) -> float | None:
    """Wait until `count` seeded timers are decided; when (`time.time()`), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if timers_fired(url, prefix) >= count:
            return time.time()
        time.sleep(0.5)
    return None
