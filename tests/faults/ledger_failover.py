"""Losing the ledger's primary under load, timed:

    python -m tests.faults.ledger_failover [--events 6000] [--kills 3] [--rate 40] [--json]

starts a Kafka broker and a PostgreSQL failover pair of its own (`ops.postgres_ha`:
pg_auto_failover's monitor, a primary and its synchronous standby; in a folder under
the stack's `tests/`, removed afterwards), the run's topics and ledger, one controller
and one relay connected with the pair's multi-host URL
(`target_session_attrs=read-write`). A feeder produces the benchmark workload at a
steady rate while the primary is killed `--kills` times with SIGKILL: its keeper, its
PostgreSQL and every backend at once, as when its machine dies. After each kill the
killed node is started again (it rejoins as the standby, rewound) and the next kill
waits until the pair is synchronous again.

For each kill it prints where the time went, in seconds from the kill: the monitor
marks the node unhealthy, orders the standby's promotion (`prepare_promotion`), the
new primary takes writes (`wait_primary`), and the controller commits its first
decision on it (the earliest `decided_at` after the kill). Then the stream is drained,
the roles are stopped and the history checker (`checker.check_run`) runs: nothing
lost, duplicated or reordered per operation, every audit chain intact. Exit 0 only
when there is no anomaly. `tests/faults/test_ledger_failover.py` runs one kill of it;
docs/faults.md, "Losing the ledger's primary", has the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import psycopg

from ledger import ensure_database, migrate_database
from ops.kafka import start_kafka
from ops.postgres_ha import FailoverEvent, HaPostgres
from tests.faults.checker import CheckReport, check_run
from tests.faults.processes import FaultError
from tests.faults.stream import FaultRun, Feeder, drain, workload
from tests.support.db import ensure_login_roles
from tests.support.kafka import TopicFactory
from tests.support.keys import ensure_controller_key
from tests.support.services import name_admin, own_postgres_ha, service_root

__all__ = ["FailoverResult", "FailoverTiming", "failover_run", "kill_primary", "main"]

Say = Callable[[str], None]
_DATABASE: Final = "recovery"
# The roles wait this long for a read-write ledger at start (RECOVERY_DATABASE_WAIT_S).
_WAIT_S: Final = "120"


@dataclass(frozen=True, slots=True)
class FailoverTiming:
    """One kill of the primary: which node, which took over, and seconds from the kill
    to each step (None: the monitor's events did not show it)."""

    killed: str
    promoted: str
    unhealthy_s: float | None
    promotion_s: float | None
    writable_s: float | None
    first_decision_s: float

    def describe(self) -> str:
        """One readable line."""

        def s(value: float | None) -> str:
            return "?" if value is None else f"{value:.1f}s"

        return (
            f"killed {self.killed}, {self.promoted} took over: unhealthy {s(self.unhealthy_s)}, "
            f"promotion ordered {s(self.promotion_s)}, writable {s(self.writable_s)}, "
            f"first decision {s(self.first_decision_s)}"
        )


def _first_decision_after(url: str, after: datetime, timeout: float) -> datetime:
    """The `decided_at` of the earliest decision after `after`, polled on whichever node
    takes writes (a decision later than the kill cannot be on the killed node)."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                row = conn.execute(
                    "SELECT min(decided_at) FROM decisions WHERE decided_at > %s", (after,)
                ).fetchone()
            if row is not None and row[0] is not None:
                found: datetime = row[0]
                return found
            last = "no decision since the kill yet"
        except psycopg.OperationalError as exc:
            last = " ".join(str(exc).split())[:200]
        time.sleep(0.1)
    raise FaultError(f"no decision on a new primary within {timeout:.0f}s of the kill: {last}")


def _seconds(
    events: Sequence[FailoverEvent], since: datetime, match: Callable[..., bool]
) -> float | None:
    for event in events:
        if event.at > since and match(event):
            return (event.at - since).total_seconds()
    return None


def kill_primary(cluster: HaPostgres, url: str, say: Say, timeout: float = 120.0) -> FailoverTiming:
    """SIGKILL the pair's primary, once it has its synchronous standby, and wait for the
    first decision on the new one; return where the time went (module docstring).
    Raises `FaultError` when no decision comes within `timeout` seconds."""
    # A failover still under way (the monitor can act after the pair looked whole)
    # ends first: the kill strikes a primary with its synchronous standby.
    primary = cluster.wait_synchronous(timeout)
    killed_at = datetime.now(UTC)
    cluster.kill(primary)
    # A batch decided before every process of the primary was gone may have committed
    # on it (and on its standby) a moment after `killed_at`; one decided later cannot.
    gone_at = datetime.now(UTC)
    say(f"killed the primary {primary} (keeper, PostgreSQL and backends)")
    decided = _first_decision_after(url, gone_at, timeout)
    events = cluster.events(60)
    standby = next(n for n in ("node_a", "node_b") if n != primary)
    return FailoverTiming(
        killed=primary,
        promoted=standby,
        unhealthy_s=_seconds(
            events, killed_at, lambda e: e.node == primary and "unhealthy" in e.description
        ),
        promotion_s=_seconds(
            events, killed_at, lambda e: e.node == standby and e.goal == "prepare_promotion"
        ),
        writable_s=_seconds(
            events, killed_at, lambda e: e.node == standby and e.reported == "wait_primary"
        ),
        first_decision_s=(decided - killed_at).total_seconds(),
    )


@dataclass(slots=True)
class FailoverResult:
    """A finished run: each kill's timing and the checker's report."""

    timings: list[FailoverTiming]
    report: CheckReport
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether the checker found no anomaly."""
        return self.report.ok

    def to_json(self) -> dict[str, Any]:
        """Everything as JSON-ready data."""
        return {
            "ok": self.ok,
            "timings": [asdict(t) for t in self.timings],
            "counts": self.report.counts,
            "anomalies": [
                {"kind": a.kind, "operation": a.operation, "detail": a.detail}
                for a in self.report.anomalies
            ],
            "seconds": round(self.seconds, 1),
        }

    def summary(self) -> str:
        """The timings, their median and worst, and the checker's report."""
        lines = [f"ledger failover run: {self.seconds:.0f} s, {len(self.timings)} primary kill(s)"]
        lines += [f"  {i}. {t.describe()}" for i, t in enumerate(self.timings, start=1)]
        firsts = [t.first_decision_s for t in self.timings]
        if firsts:
            lines.append(
                f"  kill to first decision on the new primary: median "
                f"{statistics.median(firsts):.1f}s, worst {max(firsts):.1f}s"
            )
        lines += ["checker:", self.report.summary()]
        lines.append("OK: no anomaly" if self.ok else "FAILED: anomalies above")
        return "\n".join(lines)


def failover_run(
    bootstrap: str,
    cluster: HaPostgres,
    topic_factory: TopicFactory,
    log_dir: Path,
    *,
    events: int,
    kills: int,
    rate: float = 200.0,
    seed: int = 7,
    say: Say = print,
) -> FailoverResult:
    """The run of the module docstring on `bootstrap` and `cluster` (its `recovery`
    database, migrated here); role logs in `log_dir`."""
    started = time.monotonic()
    ensure_controller_key()
    ensure_database(cluster.url, _DATABASE)
    url = cluster.url_for(_DATABASE)
    migrate_database(url)
    ensure_login_roles(cluster, url)
    records, stats = workload(events, seed=seed)
    say(f"{stats.records:,} records, {stats.operations:,} operations; {kills} primary kill(s)")
    run = FaultRun(
        bootstrap, url, topic_factory, log_dir, extra_env={"RECOVERY_DATABASE_WAIT_S": _WAIT_S}
    )
    timings: list[FailoverTiming] = []
    try:
        controller, relay = run.start("controller"), run.start("relay")
        controller.wait_assigned(90)
        feeder = Feeder(run, records, rate, say).start()
        spacing = len(records) / rate / (kills + 1)
        for n in range(1, kills + 1):
            time.sleep(min(spacing, 20.0))
            left = (len(records) - feeder.sent) / rate
            if left < 5:
                # The first decision after a kill needs input produced after it (what
                # arrives during the failover is decided on the new primary).
                raise FaultError(
                    f"kill {n}/{kills}: the input ends in {left:.0f}s; give the run more "
                    "--events or a lower --rate (each kill and rejoin takes about 30 s)"
                )
            timing = kill_primary(cluster, url, say)
            say(timing.describe())
            timings.append(timing)
            run.check_alive(controller, relay)
            cluster.start(timing.killed)  # it rejoins as the standby
            say(f"restarted {timing.killed}; primary {cluster.wait_synchronous(180)} is "
                "synchronous again")  # fmt: skip
        produced = feeder.join(300)
        drain(run, produced, [controller, relay], 300, say)
        for process in (controller, relay):
            status = process.terminate()
            if status != 0:
                raise FaultError(f"{process} exited {status} after the failovers")
    finally:
        run.close()
    say("checking the history")
    report = check_run(bootstrap, url, run.topics, (r.record_id for r in records))
    return FailoverResult(timings, report, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring); exit 0 only when the checker found no anomaly."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.ledger_failover", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--events", type=int, default=6_000)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40.0, help="records/s produced")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)

    def say(message: str) -> None:
        print(f"[ledger-failover {time.strftime('%X')}] {message}", file=sys.stderr, flush=True)

    root = service_root("ledger-failover")
    log_dir = root / "logs"
    log_dir.mkdir()
    say(f"seed {seed}; role logs in {log_dir}")
    say("starting a broker and a PostgreSQL failover pair (about 30 s)")
    broker = start_kafka(root / "kafka")
    assert broker.security is not None
    restore = name_admin(broker.security)
    try:
        with own_postgres_ha("ledger-failover-pg") as cluster:
            topics = TopicFactory(broker.bootstrap, "failover")
            result = failover_run(
                broker.bootstrap, cluster, topics, log_dir,
                events=args.events, kills=args.kills, rate=args.rate, seed=seed, say=say,
            )  # fmt: skip
    finally:
        restore()
        broker.stop()
    print(json.dumps(result.to_json(), indent=2) if args.json else result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
