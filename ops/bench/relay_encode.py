"""Benchmark of the relay's encode path: `python -m ops.bench.relay_encode`.

Builds a realistic outbox the way production does: the `recoveryctl bench` workload
(`ops.bench.workload`: five catalogue machines, results of every command, signed and
forged approvals, duplicates, bad records) is played through the controller's own
batch planning (`consumer.Intake`, `consumer.decide_batch`) in batches of 500 and
committed to an in-memory ledger, which writes the same outbox rows (commands, OCSF
audit records, dead letters, evidence, cascade events) as PostgreSQL. Every unpublished
row is then leased once and encoded repeatedly by `producers.encoding.RecordEncoder`,
the relay's encoder, with the relay's lineage cache warmed (the one query per operation
it costs is counted, not timed: it is database time, not encoding).

It prints process CPU microseconds per record (all rows, then per stream), the median
and minimum over `--repeat` runs, and a SHA-256 over every deterministic published
byte (topic, key, value, headers): two code versions that print the same digest for
the same `--events` and `--seed` publish identical records. Audit records of bodies
without a time of their own carry the publish time (`time_source:
relay-publish-time`) and are left out of the digest.

With `--kafka HOST:PORT` it also runs the relay itself (`OutboxRelay.relay_once`, the
default lease of 200 keys) over a freshly built outbox into scratch topics on that
broker (dropped after) and prints process CPU per published record: encoding, the
producer and librdkafka's threads, without PostgreSQL (the ledger is in memory).

The workload's times come from the clock, so two builds differ: to compare two code
versions, build once with `--save FILE` and encode that outbox with each version
(`--load FILE`).

With `--signed` the controller's planning signs every row as the live controller does
(`schemas.OutboxSigner`, a key made for the run), so each row carries the value it
signed (migration 0012) and the relay publishes it as it is; without it, rows are
unsigned and the relay encodes each one from its payload, as it does for rows written
before migration 0012.

Without `--kafka`, no Kafka and no PostgreSQL: a figure, not a test.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry import metrics, trace

from consumer import (
    ControllerSettings,
    Intake,
    RawRecord,
    decide_batch,
    load_rules,
    openings,
    operation_ids,
    positions_for,
)
from ledger import MemoryLedger, OutboxRecord
from machines import Lineage
from ops.bench.baseline_pipeline import delete_topics
from ops.bench.workload import BENCH_POLICY, WorkloadSpec, bench_roster, generate
from producers import (
    EncodedRecord,
    LineageCache,
    OutboxRelay,
    RecordEncoder,
    lineage_from_ledger,
    provision,
)
from schemas import DEFAULT_CONTROLLER_ID, DEFAULT_TOPICS, OutboxSigner, RecordSigner, TopicNames

_TOPIC = "recovery.events"
_GROUP = "bench-relay-encode"
_BATCH = 500
_T0_MS = 1_764_460_800_000  # 2025-11-30T00:00:00Z, the Kafka timestamp of record 0


def build_outbox(
    events: int, seed: int, *, signed: bool = False
) -> tuple[MemoryLedger, tuple[OutboxRecord, ...]]:
    """A ledger holding the outbox of about `events` workload records decided by the
    controller's planning, and every unpublished row of it in insertion order; with
    `signed`, every row signed as the controller signs it (with a key made here)."""
    settings = ControllerSettings(bootstrap="unused", database_url="unused")
    # The bench policy is the demo's, with a public-name approver key: demo mode.
    settings = settings.model_copy(update={"policy_path": BENCH_POLICY, "demo_mode": True})
    machines, rules = load_rules(settings)
    intake = Intake(machines, roster=bench_roster(), max_record_bytes=1024 * 1024)
    ledger = MemoryLedger()
    claims = ledger.claim(_GROUP, _TOPIC, [0], "bench")
    epochs = {(c.topic, c.partition): c.epoch for c in claims}
    sign = None
    if signed:
        key = Ed25519PrivateKey.generate()
        sign = OutboxSigner(RecordSigner(DEFAULT_CONTROLLER_ID, key), DEFAULT_TOPICS)
    spec = WorkloadSpec(run_id="encode", phase="bench", events=events, seed=seed)
    batch: list[RawRecord] = []
    for offset, item in enumerate(generate(spec)):
        batch.append(
            RawRecord(
                _TOPIC,
                0,
                offset,
                item.key.encode(),
                item.value,
                tuple(item.headers(_TOPIC)),
                _T0_MS + offset,
            )
        )
        if len(batch) == _BATCH:
            _commit(ledger, intake, rules, batch, epochs, sign)
            batch = []
    if batch:
        _commit(ledger, intake, rules, batch, epochs, sign)
    with ledger.lease_outbox(10**9) as lease:
        return ledger, lease.records


def _commit(
    ledger: MemoryLedger,
    intake: Intake,
    rules: object,
    records: Sequence[RawRecord],
    epochs: dict[tuple[str, int], int],
    sign: OutboxSigner | None,
) -> None:
    outcomes = [intake.examine(r) for r in records]
    views = ledger.load_views(operation_ids(outcomes))
    planned = decide_batch(
        outcomes,
        views,
        rules,  # type: ignore[arg-type]
        group=_GROUP,
        controller="bench-controller",
        positions=positions_for(records, epochs),
        now=datetime.now(UTC),
        arrivals=ledger.arrival_lineage(openings(outcomes, views)),
        sign=sign,
    )
    ledger.commit(planned.batch)


def save(path: Path, ledger: MemoryLedger, rows: Sequence[OutboxRecord]) -> None:
    """Write `rows` and the lineage of every operation they name to `path` (JSON)."""
    lineage = lineage_from_ledger(ledger)
    operations = sorted({str(r.payload["operation_id"]) for r in rows if "command_id" in r.payload})
    data = {
        "rows": [_saved(r) for r in rows],
        "lineage": {op: asdict(lineage(op)) for op in operations},
    }
    path.write_text(json.dumps(data), encoding="utf-8")


def load(path: Path) -> tuple[Callable[[str], Lineage], tuple[OutboxRecord, ...]]:
    """The rows and the lineage lookup `save` wrote."""
    data = json.loads(path.read_text(encoding="utf-8"))
    lineages: Mapping[str, dict[str, Any]] = data["lineage"]

    def lookup(operation_id: str) -> Lineage:
        raw = lineages[operation_id]
        return Lineage(**{**raw, "delegated_credentials": tuple(raw["delegated_credentials"])})

    return lookup, tuple(_loaded(r) for r in data["rows"])


def _saved(row: OutboxRecord) -> dict[str, Any]:
    out = asdict(row)
    out["value"] = None if row.value is None else base64.b64encode(row.value).decode("ascii")
    return out


def _loaded(raw: dict[str, Any]) -> OutboxRecord:
    value = raw.get("value")
    return OutboxRecord(**{**raw, "value": None if value is None else base64.b64decode(value)})


def _counting(lookup: Callable[[str], Lineage], counter: list[int]) -> Callable[[str], Lineage]:
    def counted(operation_id: str) -> Lineage:
        counter[0] += 1
        return lookup(operation_id)

    return counted


def _digest(encoded: Sequence[EncodedRecord]) -> str:
    sha = hashlib.sha256()
    for r in encoded:
        if b'"time_source":"relay-publish-time"' in r.value:
            continue
        sha.update(repr((r.topic, r.key, r.value, sorted(r.headers.items()))).encode())
    return sha.hexdigest()


def _cpu_per_record(encoder: RecordEncoder, rows: Sequence[OutboxRecord]) -> float:
    encode = encoder.encode
    started = time.process_time()
    for row in rows:
        encode(row)
    return (time.process_time() - started) / max(len(rows), 1) * 1e6


def relay_passes(ledger: MemoryLedger, bootstrap: str) -> tuple[int, float, float, float]:
    """Drain `ledger`'s outbox with one relay into scratch topics (6 partitions each,
    dropped after): records published, process CPU seconds, the CPU seconds of this
    (the relay's) thread alone (the rest is librdkafka's threads) and wall seconds."""
    run = uuid.uuid4().hex[:6]
    topics = TopicNames(
        **{stream: f"bench-relay-{run}.recovery.{stream}" for stream in TopicNames.model_fields}
    )
    provision(bootstrap, partitions=6, names=topics)
    # The providers `recoveryctl run` hands the relay when no exporter is configured.
    relay = OutboxRelay(
        ledger,
        bootstrap,
        topics=topics,
        tracer_provider=trace.NoOpTracerProvider(),
        meter_provider=metrics.NoOpMeterProvider(),
    )
    published = 0
    try:
        relay.relay_once()  # connects, fetches metadata; its rows count, its time not
        cpu, own, wall = time.process_time(), time.thread_time(), time.monotonic()
        while (result := relay.relay_once()).leased:
            published += result.published
        own = time.thread_time() - own
        return published, time.process_time() - cpu, own, time.monotonic() - wall
    finally:
        delete_topics(bootstrap, list(topics.all()))


def main(argv: Sequence[str] | None = None) -> int:
    """Build the outbox, encode it `--repeat` times, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--save", type=Path, help="write the built outbox to this file")
    parser.add_argument("--load", type=Path, help="encode the outbox saved in this file")
    parser.add_argument("--kafka", metavar="HOST:PORT", help="also run relay passes there")
    parser.add_argument(
        "--signed", action="store_true", help="sign the rows as the controller does"
    )
    args = parser.parse_args(argv)

    built = time.monotonic()
    if args.load is not None:
        lineage, rows = load(args.load)
    else:
        ledger, rows = build_outbox(args.events, args.seed, signed=args.signed)
        lineage = lineage_from_ledger(ledger)
        if args.save is not None:
            save(args.save, ledger, rows)
    lookups = [0]
    cache = LineageCache(_counting(lineage, lookups))
    cache.learn(rows, {TopicNames().audit})  # as the relay does with each lease
    encoder = RecordEncoder(TopicNames(), cache)
    encoded = [encoder.encode(row) for row in rows]  # warms the lineage cache
    per_stream: dict[str, list[OutboxRecord]] = defaultdict(list)
    for row in rows:
        per_stream[row.topic].append(row)
    source = (
        f"outbox {args.load}"
        if args.load is not None
        else f"outbox of {args.events:,} workload records (seed {args.seed}"
        + (", signed)" if args.signed else ")")
    )
    print(
        f"{source} ready in {time.monotonic() - built:.1f}s: {len(rows):,} rows, "
        + ", ".join(f"{t} {len(r):,}" for t, r in sorted(per_stream.items()))
        + f"; lineage lookups (queries the relay makes): {lookups[0]:,}"
    )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    totals = [_cpu_per_record(encoder, rows) for _ in range(args.repeat)]
    print(
        f"all rows: {statistics.median(totals):.1f} us CPU/record median, "
        f"{min(totals):.1f} min over {args.repeat} runs"
    )
    for topic, subset in sorted(per_stream.items()):
        figures = [_cpu_per_record(encoder, subset) for _ in range(args.repeat)]
        print(
            f"  {topic}: {statistics.median(figures):.1f} us/record median, {min(figures):.1f} min"
        )
    print(f"published bytes sha256 {_digest(encoded)}")
    if args.kafka is not None:
        ledger, rows = build_outbox(args.events, args.seed, signed=args.signed)
        published, cpu, own, wall = relay_passes(ledger, args.kafka)
        per = 1e6 / max(published, 1)
        print(
            f"relay passes: {published:,} of {len(rows):,} rows published after the first "
            f"pass, {cpu * per:.1f} us process CPU/record ({own * per:.1f} in the relay's "
            f"thread, the rest librdkafka's), {published / max(wall, 1e-9):,.0f} records/s wall"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
