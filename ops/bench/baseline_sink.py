"""The PostgreSQL side of the benchmark's bare pipeline (`ops.bench.baseline_pipeline`).

`BaselineSink` writes one row per consumed record and the partitions' next offsets in
one transaction per batch, with `synchronous_commit` on (the server default, never
changed here): the least durable work any Kafka-to-PostgreSQL controller with the
controller's guarantees must do. Its two tables live in their own schema,
`bench_baseline`, created on first use in the benchmark's scratch database: they are
not part of the ledger schema and no migration knows them.

The SQL stays here rather than in `ledger/sql/`: those files are the ledger's named
queries and migrations, and this is a benchmark fixture, not ledger state. It drives
psycopg directly on purpose, like the Kafka side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol

import psycopg

from ledger import LedgerError, LedgerUnavailable

__all__ = ["BaselineSink", "SinkRecord", "server_version"]

_SCHEMA: Final = """
CREATE SCHEMA IF NOT EXISTS bench_baseline;
CREATE TABLE IF NOT EXISTS bench_baseline.records (
    topic text NOT NULL,
    partition integer NOT NULL,
    "offset" bigint NOT NULL,
    key bytea,
    value bytea,
    stored_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);
CREATE TABLE IF NOT EXISTS bench_baseline.offsets (
    topic text NOT NULL,
    partition integer NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (topic, partition)
);
"""
_INSERT_RECORD: Final = (
    'INSERT INTO bench_baseline.records (topic, partition, "offset", key, value) '
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
_UPSERT_OFFSET: Final = (
    "INSERT INTO bench_baseline.offsets (topic, partition, next_offset) VALUES (%s, %s, %s) "
    "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset"
)


class SinkRecord(Protocol):
    """What the sink stores of a consumed record (`ops.bench.baseline_pipeline.SinkRow`)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


class BaselineSink:
    """One connection writing the baseline's batches; `close` when done."""

    def __init__(self, database_url: str) -> None:
        try:
            self._conn = psycopg.connect(database_url, connect_timeout=10)
            with self._conn.transaction():
                self._conn.execute(_SCHEMA)
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"bench baseline: cannot reach the database: {exc}") from exc

    def write(self, rows: Sequence[SinkRecord], offsets: Mapping[tuple[str, int], int]) -> None:
        """Insert `rows` and upsert `offsets` in one transaction (pipelined by psycopg's
        `executemany`). Raises `LedgerError` when the server refuses."""
        try:
            with self._conn.transaction(), self._conn.cursor() as cur:
                cur.executemany(
                    _INSERT_RECORD, [(r.topic, r.partition, r.offset, r.key, r.value) for r in rows]
                )
                cur.executemany(_UPSERT_OFFSET, [(t, p, o) for (t, p), o in offsets.items()])
        except psycopg.Error as exc:
            raise LedgerError(f"bench baseline: batch of {len(rows)} rows refused: {exc}") from exc

    def reset(self) -> None:
        """Empty both tables, so that the next drain inserts every row again (into an
        existing row, `ON CONFLICT DO NOTHING` would skip the insert)."""
        try:
            with self._conn.transaction():
                self._conn.execute("TRUNCATE bench_baseline.records, bench_baseline.offsets")
        except psycopg.Error as exc:
            raise LedgerError(f"bench baseline: cannot empty the tables: {exc}") from exc

    def stored(self) -> int:
        """Rows stored so far (a check that the baseline really wrote)."""
        row = self._conn.execute("SELECT count(*) FROM bench_baseline.records").fetchone()
        self._conn.commit()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def server_version(database_url: str) -> dict[str, str]:
    """The server's version and its durability settings, for the machine description."""
    try:
        with psycopg.connect(database_url, connect_timeout=10) as conn:
            settings = {
                name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
            }
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"bench: cannot read the server's version: {exc}") from exc
    return {"psycopg": psycopg.__version__, **settings}
