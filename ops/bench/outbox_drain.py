"""Benchmark of the relay's statements on the server: `python -m ops.bench.outbox_drain`.

Commits the batches of `ops.bench.ledger` (`--operations` operations on a catalogue
machine, every outbox row signed as the controller signs it) into a fresh database, then
drains the outbox as the relay does, without Kafka: `PostgresLedger.lease_outbox` of
`--lease-keys` keys at a time, every leased row marked published. Prints, per row
drained, the CPU of the drain's server backend (read from /proc, so the server must run
on this host) and of this process, and the shared buffers the lease's row query and the
mark touch (`EXPLAIN (ANALYZE, BUFFERS)` of the first lease, rolled back). CPU figures
survive a busy machine. To compare two versions of the ledger, copy this file out of
the tree and run the copy by path with each version's root on PYTHONPATH, alternately
(run by path from `ops/bench/`, `ops/bench/ledger.py` would shadow the `ledger`
package). The server is the one RECOVERY_DATABASE_URL (or --database-url) names, as an
administrative connection. A figure, not a test.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from importlib import resources
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from ledger import PostgresLedger, create_database, drop_database, with_database
from ops.bench.ledger import _backend_cpu, _backend_pid, fill_signed_ledger
from schemas import ServiceSettings

__all__ = ["main"]


def _queries() -> dict[str, str]:
    """The ledger's named queries as the ledger on the path has them (so either version
    of the ledger explains its own statements); ledger.queries is the ledger's own."""
    text = resources.files("ledger").joinpath("sql/queries.sql").read_text(encoding="utf-8")
    queries: dict[str, str] = {}
    for block in text.split("-- name:")[1:]:
        name, _, body = block.partition("\n")
        lines = [ln for ln in body.splitlines() if not ln.startswith("--")]
        queries[name.strip()] = "\n".join(lines).strip().rstrip(";")
    return queries


QUERIES = _queries()


def _buffers(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> int:
    """Shared buffers (hit + read) of one run of query `name`, rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute(QUERIES["lease_settings"])
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name], params
        ).fetchone()
    assert plan is not None
    top = plan[0][0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def _explain(url: str, lease_keys: int) -> tuple[int, int, int]:
    """(rows, buffers of lease_outbox_rows, buffers of mark_published) of one lease."""
    with psycopg.connect(url) as conn:
        conn.execute("SET jit = off")
        heads = conn.execute(QUERIES["lease_outbox_heads"], {"limit": lease_keys}).fetchall()
        keys = [str(r[0]) for r in heads]
        rows = conn.execute(
            QUERIES["lease_outbox_rows"], {"keys": keys, "payloads": False}
        ).fetchall()
        conn.rollback()
        read = _buffers(conn, "lease_outbox_rows", {"keys": keys, "payloads": False})
        # Either version of the mark: by record id and key, or by primary key.
        by_id = "%(keys)s" not in QUERIES["mark_published"]
        ids = [r[0] for r in rows] if by_id else [r[1] for r in rows]
        params: dict[str, Any] = {"ids": ids} if by_id else {"ids": ids, "keys": keys}
        mark = _buffers(conn, "mark_published", params)
    return len(rows), read, mark


def run(admin_url: str, operations: int, lease_keys: int) -> None:
    """Fill a scratch database, drain it, print the figures, drop it."""
    name = f"bench_drain_{uuid.uuid4().hex[:10]}"
    create_database(admin_url, name)
    url = with_database(admin_url, name)
    try:
        fill_signed_ledger(url, operations)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE outbox")
        leased, read, mark = _explain(url, lease_keys)
        application_name = f"bench-drain-{os.getpid()}"
        relay = PostgresLedger(
            make_conninfo(url, application_name=application_name), min_size=1, max_size=1
        )
        try:
            with relay.lease_outbox(1) as lease:  # warm the connection; mark nothing
                pass
            backend = _backend_pid(url, application_name)
            server, cpu, start = _backend_cpu(backend), time.process_time(), time.perf_counter()
            drained = 0
            while True:
                with relay.lease_outbox(lease_keys, payloads=False) as lease:
                    lease.mark_published([r.record_id for r in lease.records])
                    drained += len(lease.records)
                if not lease.records:
                    break
            wall, client = time.perf_counter() - start, time.process_time() - cpu
            after = _backend_cpu(backend)
        finally:
            relay.close()
        per = 1e6 / max(drained, 1)
        backend_us = (
            "not readable" if server is None or after is None else f"{(after - server) * per:.1f}"
        )
        print(
            f"{drained:,} rows drained ({operations:,} operations, leases of {lease_keys} keys) "
            f"in {wall:.2f} s, load average {os.getloadavg()[0]:.2f}"
        )
        print(f"CPU per row: server backend {backend_us} us, relay process {client * per:.1f} us")
        print(
            f"first lease: {leased:,} rows; shared buffers per row: rows query "
            f"{read / max(leased, 1):.2f}, mark {mark / max(leased, 1):.2f}"
        )
    finally:
        drop_database(admin_url, name)


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(prog="python -m ops.bench.outbox_drain", description=__doc__)
    parser.add_argument("--database-url", default=ServiceSettings.load().database_url)
    parser.add_argument("--operations", type=int, default=4000)
    parser.add_argument("--lease-keys", type=int, default=200)
    args = parser.parse_args()
    if not args.database_url:
        parser.error("name a server: --database-url or RECOVERY_DATABASE_URL")
    run(args.database_url, args.operations, args.lease_keys)


if __name__ == "__main__":
    main()
