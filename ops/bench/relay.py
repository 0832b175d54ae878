"""How should an idle relay learn of new outbox rows: LISTEN/NOTIFY or short polling?

Two measurements on a throwaway database (RECOVERY_DATABASE_URL's server, or a local
PostgreSQL started for the run), each with the NOTIFY trigger of migration 0002 on and
off:

1. commit throughput: `--writers` threads commit outbox batches (`--rows` rows each,
   one COPY per transaction, as the ledger does) for `--seconds`. NOTIFY takes a
   cluster-wide lock at commit, so this is where it could hurt.
2. wake-up latency: one writer commits a row every 20 ms (jittered); a watcher notices
   it either by NOTIFY (`ledger.outbox_watch.OutboxWatch`) or by polling every
   `--poll-ms`; we report the commit-to-notice latency and the idle queries per second.

Usage: python -m ops.bench.relay [--writers 8] [--seconds 5]. The numbers of one run are
in docs/relay.md. This harness writes raw outbox rows with psycopg, which only the
ledger package does in the product: it measures the database, not our code.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from ledger import OutboxWatch, create_database, drop_database, migrate_database, with_database
from ops.postgres import start_postgres
from schemas import ServiceSettings

_COPY = "COPY outbox (record_id, topic, key, headers, payload) FROM STDIN"


def _commit_batch(conn: psycopg.Connection[tuple[object, ...]], rows: int) -> float:
    """Commit one batch of outbox rows; return when the transaction started (monotonic):
    a notification can arrive before the commit call returns, never before it starts."""
    started = time.monotonic()
    with conn.transaction(), conn.cursor() as cur, cur.copy(_COPY) as copy:
        for _ in range(rows):
            rid = uuid.uuid4().hex
            copy.write_row((rid, "recovery.audit", f"op-{rid[:3]}", "{}", '{"x": 1}'))
    return started


def throughput(url: str, writers: int, rows: int, seconds: float) -> float:
    """Commits per second of `writers` threads for `seconds`."""
    stop = threading.Event()
    counts = [0] * writers

    def write(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                _commit_batch(conn, rows)
                counts[index] += 1

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def latency(url: str, notice: Callable[[], float], seconds: float, gap: float) -> list[float]:
    """Commit one row at a time, at jittered intervals of about `gap` seconds, for
    `seconds`; a watcher thread calls `notice()` (blocks until it sees an unpublished
    row, returns when) and marks the row published. Returns the commit-to-notice
    latencies in milliseconds. The watcher runs its own cycle, so a poller's phase is
    independent of the commits, as in production."""
    noticed = threading.Event()
    done = threading.Event()
    seen_at: list[float] = []

    def watch() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not done.is_set():
                seen_at.append(notice())
                conn.execute("UPDATE outbox SET published_at = now() WHERE published_at IS NULL")
                noticed.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    found: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(random.uniform(0, 2 * gap))
            noticed.clear()
            committed = _commit_batch(conn, 1)
            noticed.wait(10)
            found.append((seen_at[-1] - committed) * 1000)
        done.set()
        _commit_batch(conn, 1)  # release a watcher blocked in notice()
    watcher.join(10)
    return found


def poller(url: str, interval: float, queries: list[int]) -> Callable[[], float]:
    """A `notice` that polls for unpublished rows every `interval` seconds."""
    conn = psycopg.connect(url, autocommit=True)

    def notice() -> float:
        while True:
            queries[0] += 1
            row = conn.execute("SELECT 1 FROM outbox WHERE published_at IS NULL LIMIT 1").fetchone()
            if row is not None:
                return time.monotonic()
            time.sleep(interval)

    return notice


def listener(url: str) -> Callable[[], float]:
    """A `notice` that waits for the outbox NOTIFY."""
    watch = OutboxWatch(url)

    def notice() -> float:
        while not watch.wait(5.0):
            pass
        return time.monotonic()

    return notice


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2),
        "samples": len(ordered),
    }


def _set_trigger(url: str, enabled: bool, notify: str) -> None:
    verb = "ENABLE" if enabled else "DISABLE"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE outbox {verb} TRIGGER outbox_notify")  # bench only
        name = conn.execute("SELECT current_database()").fetchone()
        assert name is not None
        conn.execute(f"ALTER DATABASE \"{name[0]}\" SET recovery.outbox_notify = '{notify}'")


def bench(admin_url: str, args: argparse.Namespace) -> dict[str, object]:
    """Run both measurements on a new database of `admin_url`'s server."""
    name = f"bench_relay_{uuid.uuid4().hex[:8]}"
    create_database(admin_url, name)
    url = with_database(admin_url, name)
    try:
        migrate_database(url)
        result: dict[str, object] = {"writers": args.writers, "rows_per_commit": args.rows}
        for label, trigger, notify in (
            ("no_trigger", False, "on"),
            ("notify_trigger", True, "on"),
            ("trigger_switched_off", True, "off"),
        ):
            _set_trigger(url, trigger, notify)
            rates = [
                throughput(url, args.writers, args.rows, args.seconds) for _ in range(args.repeat)
            ]
            result[f"commits_per_s_{label}"] = round(statistics.median(rates), 1)
        _set_trigger(url, True, "on")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE outbox")  # the latency runs start from an empty outbox
        gap = args.poll_ms / 1000
        queries = [0]
        started = time.monotonic()
        polled = latency(url, poller(url, args.poll_ms / 1000, queries), args.seconds, gap)
        result["poll"] = {
            **_summary(polled),
            "interval_ms": args.poll_ms,
            "queries_per_s": round(queries[0] / (time.monotonic() - started), 1),
        }
        result["notify"] = _summary(latency(url, listener(url), args.seconds, gap))
        return result
    finally:
        drop_database(admin_url, name)


def main() -> None:
    """Parse arguments, find or start a server, run, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--poll-ms", type=float, default=50.0)
    args = parser.parse_args()
    external = ServiceSettings.load().database_url
    if external:
        print(json.dumps(bench(external, args), indent=2))
        return
    root = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    root.chmod(0o755)
    server = start_postgres(root / "postgres")
    try:
        print(json.dumps(bench(server.url, args), indent=2))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
