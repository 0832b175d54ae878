"""Benchmark of the decision core alone: `python -m ops.bench.core`.

Replays realistic recovery sequences of every catalogue machine (timeouts, trusted
verifications, retries, duplicates, rejected events, escalations) once to capture each
(view, event) pair, then times `decide` over those pairs on one core: no I/O, no
ledger, no Kafka. It prints decisions per second for `decide` alone and for
`decide` + `apply`. A figure, not a test: the target is at least 50,000 decisions/s.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

from machines import (
    CATALOGUE,
    Event,
    EvidencePayload,
    Lineage,
    LineageStatus,
    Machine,
    OperationView,
    Policy,
    Registry,
    ToolFacts,
    apply,
    decide,
    load_catalogue,
    load_registry,
    new_view,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

# Event type, producer, verification outcome (None: no evidence block).
SEQUENCES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "retry": (
        ("TOOL_TIMEOUT", None),
        ("VERIFICATION_NOT_FOUND", "not_applied"),
        ("RETRY_SUCCEEDED", None),
    ),
    "applied": (("TOOL_TIMEOUT", None), ("VERIFICATION_FOUND", "applied")),
    "unknown": (
        ("TOOL_FAILED", None),
        ("VERIFICATION_UNAVAILABLE", "unknown"),
        ("RETRY_SUCCEEDED", None),
    ),
    "step": (("STEP_FAILED", None), ("VERIFICATION_FOUND", "applied"), ("STEP_COMPLETED", None)),
}


def bench_event(
    machine: Machine, op: str, index: int, kind: str, outcome: str | None, task: str = "task-1"
) -> Event:
    """Event `index` of operation `op`'s benchmark story: `kind` from the tool
    integration, or, with a verification `outcome`, from the trusted verifier-1. Shared
    with `ops.bench.ledger`, so both benchmarks replay the same events."""
    evidence = (
        EvidencePayload(outcome=outcome, verifier="verifier-1", reference=f"ref://{op}/{index}")  # type: ignore[arg-type]
        if outcome is not None
        else None
    )
    return Event(
        event_type=kind,
        event_id=f"{op}-e{index}",
        operation_id=op,
        correlation_id=f"corr-{op}",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=T0 + timedelta(seconds=index),
        evidence_ref=f"evidence://{op}/{index}",
        producer="verifier-1" if outcome is not None else "tool-integration",
        lineage=Lineage(
            agent="agent-1", task=task, initiating_principal="alice", runtime="bench-runtime"
        ),
        evidence=evidence,
    )


def _view(machine: Machine, policy: Policy, op: str) -> OperationView:
    return new_view(
        operation_id=op,
        machine_name=machine.name,
        machine_digest=machine.digest,
        policy_digest=policy.digest,
        initial_state=machine.initial,
        lineage=LineageStatus(agent="agent-1"),
        facts=ToolFacts(idempotency_key=f"key-{op}", status_api=True, compensation_supported=True),
        budget_limit=10,
        deadline=T0 + timedelta(hours=1),
    )


def workload(
    machines: dict[str, Machine], policy: Policy, registry: Registry
) -> list[tuple[Machine, OperationView, Event]]:
    """Every (machine, view before, event) pair of the sequences, duplicates included."""
    pairs: list[tuple[Machine, OperationView, Event]] = []
    for machine in machines.values():
        for name, sequence in SEQUENCES.items():
            op = f"{machine.name}-{name}"
            view = _view(machine, policy, op)
            for index, (kind, outcome) in enumerate(sequence):
                event = bench_event(machine, op, index, kind, outcome)
                pairs.append((machine, view, event))
                view = apply(view, decide(machine, view, event, policy, registry, event.event_time))
            pairs.append((machine, view, event))  # a redelivery: decided as duplicate
    return pairs


def _rate(
    pairs: list[tuple[Machine, OperationView, Event]],
    policy: Policy,
    registry: Registry,
    seconds: float,
    fold: bool,
) -> float:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for machine, view, event in pairs:
            decision = decide(machine, view, event, policy, registry, event.event_time)
            if fold:
                apply(view, decision)
        count += len(pairs)
    return count / (time.perf_counter() - start)


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m ops.bench.core", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as specified
    registry = load_registry()
    machines = load_catalogue(registry, CATALOGUE)
    policy = Policy(id="bench", trusted_verifiers=("verifier-1",))
    pairs = workload(machines, policy, registry)
    _rate(pairs, policy, registry, 0.3, fold=False)  # warm caches (compiled plans, digests)
    decide_only = _rate(pairs, policy, registry, args.seconds, fold=False)
    with_apply = _rate(pairs, policy, registry, args.seconds, fold=True)
    print(f"machines: {len(machines)}  distinct (view, event) pairs: {len(pairs)}")
    print(f"decide:          {decide_only:,.0f} decisions/s on one core")
    print(f"decide + apply:  {with_apply:,.0f} decisions/s on one core")


if __name__ == "__main__":
    main()
