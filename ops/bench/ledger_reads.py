"""Benchmark of the ledger's reads on the event path: `python -m ops.bench.ledger_reads`.

Commits the batches of `ops.bench.ledger` (`--operations` operations on a catalogue
machine, their rows signed as the controller signs them) into a fresh database, then
times, in process CPU, what the controller and the relay read back every batch:
`PostgresLedger.load_views` of every operation in chunks of `--chunk` (the controller,
per batch) and one `lease_outbox` of every unpublished row (the relay). Prints CPU
microseconds per operation and per row for each of `--repeat` rounds. The server is the
one RECOVERY_DATABASE_URL (or --database-url) names. A figure, not a test.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from ledger import PostgresLedger, create_database, drop_database, with_database
from ops.bench.ledger import fill_signed_ledger
from schemas import ENV_DATABASE_URL, ServiceSettings

__all__ = ["main"]


def run(admin_url: str, operations: int, chunk: int, repeat: int) -> None:
    """Fill a scratch database, time the reads, print the figures, drop it."""
    name = f"bench_reads_{uuid.uuid4().hex[:10]}"
    create_database(admin_url, name)
    url = with_database(admin_url, name)
    try:
        fill_signed_ledger(url, operations)
        ledger = PostgresLedger(url, max_size=1)
        try:
            ids = [f"op-0-{n:07d}" for n in range(operations)]
            ledger.load_views(ids[:10])  # warm the connection and the prepared statement
            print(f"{operations:,} operations, load average {os.getloadavg()[0]:.2f}")
            for _ in range(repeat):
                start = time.process_time()
                for i in range(0, len(ids), chunk):
                    ledger.load_views(ids[i : i + chunk])
                views = (time.process_time() - start) / len(ids) * 1e6
                start = time.process_time()
                with ledger.lease_outbox(10**6) as lease:
                    rows = len(lease.records)
                leased = (time.process_time() - start) / max(rows, 1) * 1e6
                print(
                    f"load_views {views:.1f} us CPU/operation (chunks of {chunk}); "
                    f"lease {leased:.1f} us CPU/row ({rows:,} rows)"
                )
        finally:
            ledger.close()
    finally:
        drop_database(admin_url, name)


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(prog="python -m ops.bench.ledger_reads", description=__doc__)
    parser.add_argument("--database-url", default=ServiceSettings.load().database_url)
    parser.add_argument("--operations", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not args.database_url:
        parser.error(f"set {ENV_DATABASE_URL} or pass --database-url")
    run(args.database_url, args.operations, args.chunk, args.repeat)


if __name__ == "__main__":
    main()
