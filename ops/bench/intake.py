"""Benchmark of the controller's per-record Python work: `python -m ops.bench.intake`.

Generates the `recoveryctl bench` workload (`ops.bench.workload`: Avro records of every
pinned machine, signed approvals, duplicates, forged approvals, bad records), wraps
each record as the controller's `consumer.intake.RawRecord` with the headers a real
producer sends (content type, schema fingerprint, record id, a W3C `traceparent`), and
pushes it through what the controller runs per batch, without Kafka or PostgreSQL:

- `intake`: `Intake.examine` (size check, Avro decode, envelope validation, `Event`);
- `plan`: `consumer.batch.decide_batch` with the controller's tracer and metrics on
  the no-op providers of the default `none` exporter (decide, apply, spans);
- `ledger rows`: `ledger.records.batch_rows`, the pure part of a ledger commit (rows,
  envelope JSON, audit bodies), which reads the events the intake built.

Views carry over between batches through a `ledger.MemoryLedger` (its commit is not
timed). Each stage is timed with `time.process_time` (CPU of this process, so a busy
machine inflates the figures less than wall time would) and printed as CPU
microseconds per record, best and median of `--repeats` runs over the same records.
A figure, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from opentelemetry import metrics, trace

from consumer import (
    BatchTracer,
    ControllerMetrics,
    Intake,
    RawRecord,
    claim_keys,
    decide_batch,
    openings,
    operation_ids,
)
from ledger import MemoryLedger, batch_rows
from machines import Rules, load_policy
from ops.bench.workload import (
    BENCH_POLICY,
    WorkloadSpec,
    bench_roster,
    generate,
    pinned_machines,
)
from schemas import TRACEPARENT

STAGES = ("intake", "plan", "ledger rows")
_TOPIC = "bench.recovery.events"
_GROUP = "bench-intake"
_MAX_RECORD_BYTES = 1024 * 1024


def raw_records(events: int, partitions: int = 6) -> list[RawRecord]:
    """The benchmark workload as consumed records, in stream order, spread over
    `partitions` by a stable hash of the key (as a keyed producer would)."""
    out: list[RawRecord] = []
    offsets = [0] * partitions
    spec = WorkloadSpec(run_id="intake", phase="cpu", events=events)
    for index, r in enumerate(generate(spec)):
        partition = sum(r.key.encode()) % partitions
        headers = r.headers(_TOPIC)
        # A tool that traces its calls sends its span context with each event.
        headers.append((TRACEPARENT, f"00-{index + 1:032x}-{index + 1:016x}-01".encode()))
        out.append(
            RawRecord(
                topic=_TOPIC,
                partition=partition,
                offset=offsets[partition],
                key=r.key.encode(),
                value=r.value,
                headers=tuple(headers),
                timestamp_ms=None,
            )
        )
        offsets[partition] += 1
    return out


def run_once(records: Sequence[RawRecord], batch: int) -> dict[str, float]:
    """CPU seconds spent in each stage over `records`, in batches of `batch`."""
    by_name, registry = pinned_machines()
    machines = {f"{m.name}@{m.version}": m for m in by_name.values()}
    rules = Rules(policy=load_policy(BENCH_POLICY), registry=registry)
    intake = Intake(machines, roster=bench_roster(), max_record_bytes=_MAX_RECORD_BYTES)
    ledger = MemoryLedger()
    tracer = BatchTracer(trace.NoOpTracerProvider())
    meters = ControllerMetrics(metrics.NoOpMeterProvider(), _GROUP)
    spent = dict.fromkeys(STAGES, 0.0)
    now = datetime.now(UTC)
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        t0 = time.process_time()
        outcomes = [intake.examine(r) for r in chunk]
        t1 = time.process_time()
        views = ledger.load_views(operation_ids(outcomes))
        arrivals = ledger.arrival_lineage(openings(outcomes, views))
        claims = ledger.key_claims(claim_keys(outcomes, views))
        t2 = time.process_time()
        with tracer.batch(len(outcomes), [(_TOPIC, 0)]) as span:
            planned = decide_batch(
                outcomes,
                views,
                rules,
                group=_GROUP,
                controller="bench-controller",
                positions=(),
                now=now,
                observe=tracer.observer(span, meters.decision_latency),
                arrivals=arrivals,
                claims=claims,
            )
        t3 = time.process_time()
        batch_rows(planned.batch)
        t4 = time.process_time()
        ledger.commit(planned.batch)
        spent["intake"] += t1 - t0
        spent["plan"] += t3 - t2
        spent["ledger rows"] += t4 - t3
    return spent


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m ops.bench.intake", description=__doc__)
    parser.add_argument("--events", type=int, default=6000, help="records in the workload")
    parser.add_argument("--batch", type=int, default=500, help="records per batch")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs")
    args = parser.parse_args()
    records = raw_records(args.events)
    run_once(records[: args.batch], args.batch)  # warm caches (compiled plans, adapters)
    runs = [run_once(records, args.batch) for _ in range(args.repeats)]
    print(f"records: {len(records):,}  batch: {args.batch}  runs: {args.repeats}")
    print(f"{'stage':<12} {'best us/rec':>12} {'median us/rec':>14}")
    totals = [sum(r.values()) for r in runs]
    for stage in (*STAGES, "total"):
        values = totals if stage == "total" else [r[stage] for r in runs]
        per = [v / len(records) * 1e6 for v in values]
        print(f"{stage:<12} {min(per):>12.1f} {statistics.median(per):>14.1f}")


if __name__ == "__main__":
    main()
