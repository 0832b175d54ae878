"""Benchmark of the controller's record signing: `python -m ops.bench.signing`.

Builds the realistic outbox of `ops.bench.relay_encode` (the `recoveryctl bench`
workload decided by the controller's own planning into an in-memory ledger), then signs
every row the way the commit does (`schemas.OutboxSigner`: encode the row exactly as
the relay will, then Ed25519 over the signed message) and prints process CPU
microseconds per row, overall and per stream, with the bare Ed25519 signature's cost
beside it for scale, by libsodium (what the signer uses) and by cryptography's OpenSSL
(median and minimum over `--repeat` runs). It also prints the rows per decided event,
so a per-row figure converts to the commit path's cost per event.
No Kafka and no PostgreSQL: a figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import OutboxRecord
from machines import ed25519_sign
from ops.bench.relay_encode import build_outbox
from schemas import DEFAULT_CONTROLLER_ID, DEFAULT_TOPICS, OutboxSigner, RecordSigner, outbox_stream

__all__ = ["main"]


def _cpu_per_row(
    signer: OutboxSigner, rows: Sequence[tuple[str, str, str, dict[str, str], str]]
) -> float:
    start = time.process_time()
    for topic, key, rid, headers, payload in rows:
        signer(topic, key, rid, headers, payload)
    return (time.process_time() - start) * 1e6 / max(1, len(rows))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; prints one line per figure."""
    parser = argparse.ArgumentParser(prog="python -m ops.bench.signing", description=__doc__)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    ledger, records = build_outbox(args.events, args.seed)
    key = Ed25519PrivateKey.generate()
    signer = OutboxSigner(RecordSigner(DEFAULT_CONTROLLER_ID, key), DEFAULT_TOPICS)
    rows = [_row(r) for r in records]
    decided = sum(len(ledger.decisions(op)) for op in ledger.audit_operation_ids())
    runs = [_cpu_per_row(signer, rows) for _ in range(args.repeat)]
    print(
        f"rows {len(rows)}, decided events {decided}, "
        f"rows per event {len(rows) / max(1, decided):.2f}"
    )
    print(f"sign all rows: median {statistics.median(runs):.1f} us/row, min {min(runs):.1f}")
    for stream in ("commands", "audit", "evidence", "dlq", "events"):
        mine = [r for r in rows if outbox_stream(DEFAULT_TOPICS, r[0]) == stream]
        if mine:
            figures = [_cpu_per_row(signer, mine) for _ in range(args.repeat)]
            print(f"  {stream}: {len(mine)} rows, median {statistics.median(figures):.1f} us/row")
    message = b"x" * 320
    for name, sign in (("libsodium", ed25519_sign), ("cryptography", _openssl_sign)):
        bare = []
        for _ in range(args.repeat):
            start = time.process_time()
            for _ in range(2000):
                sign(key, message)
            bare.append((time.process_time() - start) * 1e6 / 2000)
        print(f"bare Ed25519 sign, {name} (320 bytes): median {statistics.median(bare):.1f} us")
    return 0


def _openssl_sign(key: Ed25519PrivateKey, message: bytes) -> bytes:
    return key.sign(message)


def _row(row: OutboxRecord) -> tuple[str, str, str, dict[str, str], str]:
    return (
        row.topic,
        row.key,
        row.record_id,
        dict(row.headers),
        json.dumps(row.payload, sort_keys=True, separators=(",", ":")),
    )


if __name__ == "__main__":
    raise SystemExit(main())
