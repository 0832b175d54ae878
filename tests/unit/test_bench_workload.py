"""The benchmark's workload: realistic, dirty on purpose, and predictable, because the
runner matches commands to events by the ids the decision core will give them."""

from __future__ import annotations

from collections import Counter, defaultdict

from ops.bench.workload import BenchRecord, WorkloadSpec, WorkloadStats, generate
from schemas import EVENT_ENVELOPE, WireDecoder


def _records(events: int = 600, **extra: float) -> tuple[list[BenchRecord], WorkloadStats]:
    stats = WorkloadStats()
    spec = WorkloadSpec("t1", "unit", events, interleave=8, **extra)  # type: ignore[arg-type]
    return list(generate(spec, stats)), stats


def test_every_operation_tells_a_story_of_three_to_eight_decided_events() -> None:
    records, stats = _records()
    per_op: defaultdict[str, int] = defaultdict(int)
    for r in records:
        if r.kind in ("event", "forged"):
            per_op[r.key] += 1
    assert len(per_op) == stats.operations
    assert min(per_op.values()) >= 3
    assert max(per_op.values()) <= 8
    assert len(stats.machines) == 5


def test_the_workload_holds_duplicates_forged_approvals_and_bad_records() -> None:
    records, stats = _records(1200, duplicate_rate=0.2, forged_rate=0.2, bad_rate=0.05)
    kinds = Counter(r.kind for r in records)
    assert kinds["duplicate"] > 0
    assert kinds["forged"] > 0
    assert {"bad-bytes", "bad-key", "bad-machine"} <= set(kinds)
    assert stats.dead_letters == sum(
        n for k, n in kinds.items() if k != "event" and k != "duplicate"
    )
    assert sum(kinds.values()) == stats.records == len(records)


def test_commands_are_predicted_with_the_core_s_deterministic_ids() -> None:
    records, stats = _records()
    commands = [c for r in records for c in r.commands]
    assert len(commands) == len(set(commands)) == stats.commands > 0
    for r in records:
        for command in r.commands:
            operation, sequence, index = command.rsplit(":", 2)
            assert operation == r.key
            assert int(sequence) >= 1
            assert int(index) >= 0
    # A redelivery or a bad record causes nothing.
    assert all(
        not r.commands for r in records if r.kind.startswith("bad-") or r.kind == "duplicate"
    )


def test_the_same_spec_generates_the_same_stories() -> None:
    first, _ = _records()
    second, _ = _records()
    assert [(r.key, r.kind, r.commands) for r in first] == [
        (r.key, r.kind, r.commands) for r in second
    ]


def test_records_are_encoded_envelopes_keyed_by_operation() -> None:
    records, _ = _records(200)
    decoder = WireDecoder()
    for r in records:
        if r.kind != "event":
            continue
        name, envelope = decoder.decode(r.value, r.content_type)
        assert name == EVENT_ENVELOPE
        assert envelope["operation_id"] == r.key
