"""What a fault run must leave behind, checked against the real topics and database.

- `replay_matches_ledger`: the input topic read back in partition order, each record
  through the controller's intake and the accepted events of each operation through the
  decision core (`machines.Simulation`, which opens operations as the controller does),
  each at the `decided_at` of its stored decision (the controller decides at wall-clock
  time), gives exactly the stored decisions (every field of `Decision.to_dict`) and the
  stored views.
- `applied_once`: no transition applied twice: decision sequences of an operation are
  1..n without a gap or repeat, an event id is decided at most once, and the ledger holds
  one event row per decision.
- `outputs_complete`: every outbox row is marked published and its record id is on its
  topic; a record id seen twice (a relay that died between the broker's acknowledgement
  and marking the row) carries identical bytes; nothing is on an output topic that the
  outbox does not hold.

Bulk reads use SQL on the test's own database (one query instead of one per operation);
the per-operation interface (`Ledger.decisions`, `Ledger.load_views`,
`Ledger.verify_audit`) is used where it is one call.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from consumer import ControllerSettings, load_rules
from consumer.intake import Accepted, Intake, RawRecord, Rejected
from ledger import PostgresLedger, view_to_json
from ledger.queries import QUERIES
from machines import Outcome, Simulation
from ops.bench.workload import BENCH_POLICY
from schemas import HEADER_RECORD_ID, TopicNames, kafka_config
from tests.faults.processes import FaultError
from tests.support.producers import roster as producer_roster

__all__ = [
    "Consumed",
    "OutputReport",
    "Progress",
    "ReplayReport",
    "RunReport",
    "activity",
    "applied_once",
    "as_stored",
    "audit_chains_verify",
    "dead_letter_reasons",
    "end_offsets",
    "first_difference",
    "high_watermarks",
    "outputs_complete",
    "progress",
    "read_topic",
    "replay_matches_ledger",
    "replayer",
    "stored_decisions",
    "verify_run",
]

_SHOW: Final = 5  # mismatches quoted in a failure message
# Seconds ahead in which a drained run has no timer left to fire: more than it takes to
# stop its roles, so no timer's event reaches the topic undecided after the drain.
TIMER_HORIZON: Final = 120.0


@dataclass(frozen=True, slots=True)
class Consumed:
    """One record read back from a topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> str | None:
        """A header's value as text (the last one of that name), or None."""
        found = [v for k, v in self.headers if k == name]
        return None if not found or found[-1] is None else found[-1].decode("utf-8")

    def raw(self, topic: str) -> RawRecord:
        """The record as the controller's intake sees it."""
        return RawRecord(topic, self.partition, self.offset, self.key, self.value, self.headers)


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition of `topic` with its high watermark: the offset after its last
    record now."""
    admin = AdminClient(kafka_config(bootstrap))
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    )
    return {tp.partition: f.result(timeout=30).offset for tp, f in futures.items()}


def end_offsets(bootstrap: str, topic: str) -> int:
    """The sum of `topic`'s high watermarks: the offset a group has consumed to when it
    has read everything there now, duplicates included (a record count is not)."""
    return sum(high_watermarks(bootstrap, topic).values())


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> list[Consumed]:
    """Every record of `topic` up to its current high watermarks, in partition order."""
    consumer = Consumer(
        {
            **kafka_config(bootstrap),
            "group.id": f"faults-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        highs = high_watermarks(bootstrap, topic)
        partitions = sorted(highs)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: dict[int, list[Consumed]] = {p: [] for p in partitions}
        remaining = {p for p in partitions if highs[p] > 0}
        deadline = time.monotonic() + timeout
        while remaining:
            if time.monotonic() > deadline:
                got = {p: len(out[p]) for p in partitions}
                raise FaultError(
                    f"reading {topic} back: {got} records after {timeout:.0f}s, "
                    f"expected up to the high watermarks {highs}"
                )
            for message in consumer.consume(1000, 0.5):
                if message.error() is not None:
                    raise FaultError(f"reading {topic} back: {message.error()}")
                p, offset = message.partition(), message.offset()
                assert p is not None
                assert offset is not None
                if offset >= highs[p]:
                    continue
                headers = message.headers() or []
                pairs = headers.items() if isinstance(headers, dict) else headers
                out[p].append(
                    Consumed(
                        p,
                        offset,
                        message.key(),
                        message.value(),
                        tuple(
                            (k, v if isinstance(v, bytes | None) else v.encode()) for k, v in pairs
                        ),
                    )
                )
                if offset == highs[p] - 1:
                    remaining.discard(p)
        return [record for p in partitions for record in out[p]]
    finally:
        consumer.close()


# -- progress ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    """How far the runtime got: records consumed (stored offsets), decisions stored,
    outbox rows and how many of them are still unpublished, the controller's own events
    written for the events topic (timers' firings, cascades: records it consumes beyond
    the input), the timers owed a decision (due over 5 s ago, not decided) and the
    timers about to fire (not fired, due within `TIMER_HORIZON`)."""

    consumed: int
    decided: int
    outbox: int
    unpublished: int
    own_events: int = 0
    timers_owed: int = 0
    timers_soon: int = 0

    def __str__(self) -> str:
        timers = f", {self.timers_owed:,} timers owed" if self.timers_owed else ""
        return (
            f"{self.consumed:,} records consumed, {self.decided:,} decisions, "
            f"{self.outbox - self.unpublished:,}/{self.outbox:,} outbox rows published"
            f"{timers}"
        )


def progress(database_url: str, group: str, topic: str) -> Progress:
    """The run's progress, read from the database in one round trip."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            """
            SELECT
                (SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets
                 WHERE consumer_group = %s AND topic = %s),
                (SELECT count(*) FROM decisions),
                (SELECT count(*) FROM outbox),
                (SELECT count(*) FROM outbox WHERE published_at IS NULL),
                (SELECT count(*) FROM outbox WHERE topic = %s),
                (SELECT count(*) FROM timers
                 WHERE spent_at IS NULL AND due_at < now() - interval '5 seconds'),
                (SELECT count(*) FROM timers
                 WHERE fired_at IS NULL AND due_at < now() + make_interval(secs => %s))
            """,
            (group, topic, topic, TIMER_HORIZON),
        ).fetchone()
    assert row is not None
    return Progress(*(int(v) for v in row))


def activity(database_url: str) -> str:
    """The database's busy sessions (state, wait, age, query), for stall diagnostics."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            """
            SELECT pid, application_name, state, wait_event_type, wait_event,
                   round(extract(epoch FROM now() - query_start)::numeric, 1),
                   left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
            FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
              AND state <> 'idle'
            ORDER BY query_start
            """
        ).fetchall()
        lines = [" | ".join(str(c) for c in row) for row in rows] or ["(no busy session)"]
        if any("FROM outbox" in str(row[-1]) for row in rows):
            # A relay's lease is what stalls: show the plan the server picks right now.
            heads = QUERIES["lease_outbox_heads"].replace("%(limit)s", "200")
            lines += ["plan of lease_outbox_heads now:"]
            lines += [str(r[0]) for r in conn.execute("EXPLAIN " + heads)]
    return "\n".join(lines)


# -- the ledger equals a replay ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What the replay covered."""

    records: int
    refused: int
    operations: int
    decisions: int
    duplicates: int


def stored_decisions(database_url: str) -> dict[str, list[dict[str, Any]]]:
    """Every stored decision record (`Decision.to_dict` as jsonb), per operation in
    sequence order."""
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for op, decision in conn.execute(
            "SELECT operation_id, decision FROM decisions ORDER BY operation_id, sequence"
        ):
            by_op[op].append(decision)
    return dict(by_op)


def as_stored(data: Mapping[str, Any]) -> Any:
    """`data` as it reads back from a jsonb column, to compare like with like."""
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def replayer(
    bootstrap: str, database_url: str, policy: Path = BENCH_POLICY
) -> tuple[Intake, dict[str, Simulation]]:
    """The controller's intake and one decision core per catalogue machine
    (`name@version`), loaded as a fault run's controller loads them (under `policy`)."""
    settings = ControllerSettings(
        bootstrap=bootstrap, database_url=database_url, policy_path=policy, demo_mode=True
    )
    machines, rules = load_rules(settings)
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=settings.max_record_bytes)
    sims = {
        key: Simulation(m, rules.registry, rules.policy, guard_table=rules.guard_table)
        for key, m in machines.items()
    }
    return intake, sims


def replay_matches_ledger(bootstrap: str, database_url: str, topics: TopicNames) -> ReplayReport:
    """Replay the input through the core and compare with the ledger (module
    docstring); raises `FaultError` quoting the first mismatches."""
    intake, sims = replayer(bootstrap, database_url)
    stored = stored_decisions(database_url)
    decided_at = {
        d["event"]["id"]: datetime.fromisoformat(d["decided_at"])
        for decisions in stored.values()
        for d in decisions
    }
    replayed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    sim_of: dict[str, Simulation] = {}
    records = refused = duplicates = 0
    problems: list[str] = []
    for consumed in read_topic(bootstrap, topics.events):
        records += 1
        outcome = intake.examine(consumed.raw(topics.events))
        if isinstance(outcome, Rejected):
            refused += 1
            continue
        assert isinstance(outcome, Accepted)
        event = outcome.event
        sim = sim_of.setdefault(
            event.operation_id, sims[f"{outcome.machine.name}@{outcome.machine.version}"]
        )
        # A redelivered duplicate has no decision of its own; its `now` changes nothing.
        now = decided_at.get(event.event_id, event.event_time)
        decision = sim.feed(event, now)
        if decision.outcome in (Outcome.DUPLICATE, Outcome.CONFLICT):
            duplicates += 1
            continue
        replayed[event.operation_id].append(as_stored(decision.to_dict()))
    for op in sorted(set(replayed) | set(stored)):
        want, got = replayed.get(op, []), [as_stored(d) for d in stored.get(op, [])]
        if want != got:
            problems.append(first_difference(op, want, got))
    ledger = PostgresLedger(database_url, max_size=1)
    try:
        views = ledger.load_views(sorted(replayed))
    finally:
        ledger.close()
    for op in sorted(replayed):
        # How the opening proved the agent is the controller's authentication, which a
        # replay of the decisions does not redo (the simulation trusts every producer).
        stored_op = None if op not in views else replace(views[op], agent_proof="")
        if stored_op is None:
            problems.append(f"operation {op}: replayed but not in the ledger")
        elif stored_op != sim_of[op].views[op]:
            # Compared as objects: the JSON form lists a set in hash order, which differs
            # between processes; sorted here only to name what differs.
            stored_view = _sorted_lists(view_to_json(stored_op))
            replayed_view = _sorted_lists(view_to_json(sim_of[op].views[op]))
            keys = sorted(
                k
                for k in set(stored_view) | set(replayed_view)
                if stored_view.get(k) != replayed_view.get(k)
            )
            problems.append(
                f"operation {op}: stored view differs from the replayed view in {keys}: "
                f"ledger {[stored_view.get(k) for k in keys]}, "
                f"replay {[replayed_view.get(k) for k in keys]}"
            )
    if problems:
        raise FaultError(
            f"the ledger is not a replay of the input: {len(problems)} operations differ; "
            f"first ones:\n" + "\n".join(problems[:_SHOW])
        )
    return ReplayReport(
        records=records,
        refused=refused,
        operations=len(replayed),
        decisions=sum(len(v) for v in replayed.values()),
        duplicates=duplicates,
    )


def _sorted_lists(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: sorted(v, key=str) if isinstance(v, list) else v for k, v in data.items()}


def first_difference(op: str, want: Sequence[Any], got: Sequence[Any]) -> str:
    """The first way two decision lists of `op` differ, for a message."""
    if len(want) != len(got):
        return (
            f"operation {op}: replay decides {len(want)} events "
            f"{[d['event']['id'] for d in want]}, the ledger holds {len(got)} "
            f"{[d['event']['id'] for d in got]}"
        )
    for a, b in zip(want, got, strict=True):
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            return (
                f"operation {op}: decision {a['sequence']} differs in {keys}: "
                f"replay {[a.get(k) for k in keys]}, ledger {[b.get(k) for k in keys]}"
            )
    return f"operation {op}: differs"


# -- applied once ----------------------------------------------------------------------


def applied_once(database_url: str) -> int:
    """Check that no transition was applied twice (module docstring); the number of
    decisions. Raises `FaultError` naming the operations or event ids."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT operation_id, sequence, event_id FROM decisions ORDER BY operation_id, sequence"
        ).fetchall()
        (events,) = conn.execute("SELECT count(*) FROM events").fetchone() or (0,)
    sequences: dict[str, list[int]] = defaultdict(list)
    for op, sequence, _ in rows:
        sequences[op].append(sequence)
    gaps = [op for op, seqs in sequences.items() if seqs != list(range(1, len(seqs) + 1))]
    twice = [eid for eid, n in Counter(eid for _, _, eid in rows).items() if n > 1]
    if gaps or twice or events != len(rows):
        raise FaultError(
            f"transitions applied twice or lost: operations with sequences other than "
            f"1..n: {gaps[:_SHOW]}; event ids decided more than once: {twice[:_SHOW]}; "
            f"{events} event rows for {len(rows)} decisions"
        )
    return len(rows)


# -- output topics ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputReport:
    """What the output topics hold."""

    rows: Mapping[str, int]  # outbox rows per stream
    records: Mapping[str, int]  # records on each stream's topic
    duplicates: int  # records published more than once (same id)
    restamped: int  # of those, audit copies differing only in the relay's publish time


def outputs_complete(bootstrap: str, database_url: str, topics: TopicNames) -> OutputReport:
    """Check the output topics against the outbox (module docstring). The events topic
    is one too, for the controller's own events (timers' firings, cascades): each of its
    outbox rows must be on it, beside the input, which no outbox row holds."""
    outputs = ("commands", "evidence", "audit", "dlq", "events")
    streams = {getattr(topics, s): s for s in outputs}
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT record_id, topic, published_at IS NOT NULL FROM outbox"
        ).fetchall()
    expected: dict[str, set[str]] = {topic: set() for topic in streams}
    problems: list[str] = []
    unpublished = [rid for rid, _, published in rows if not published]
    if unpublished:
        problems.append(
            f"{len(unpublished)} outbox rows never marked published: {unpublished[:_SHOW]}"
        )
    for rid, topic, _ in rows:
        if topic in expected:
            expected[topic].add(rid)
        else:
            problems.append(f"outbox row {rid} names topic {topic}, not one of this run's")
    counts: dict[str, int] = {}
    duplicates = 0
    restamped = [0]
    for topic, stream in streams.items():
        records = read_topic(bootstrap, topic)
        if stream == "events":  # the input is not the outbox's
            records = [r for r in records if r.header(HEADER_RECORD_ID) in expected[topic]]
        counts[stream] = len(records)
        duplicates += _check_topic(topic, stream, records, expected[topic], problems, restamped)
    if problems:
        raise FaultError("the output topics do not match the outbox:\n" + "\n".join(problems))
    rows_by_stream = Counter(streams[t] for _, t, _ in rows if t in streams)
    return OutputReport(dict(rows_by_stream), counts, duplicates, restamped[0])


# An audit record whose body has no time of its own (operation-opened, dead-letter) is
# published with the relay's publish time as its OCSF time (producers/encoding.py says
# so in `unmapped.recovery.time_source`): a republished copy differs in those two fields
# only. The issue asks for "duplicates only with the same deterministic id", which holds;
# byte-identical copies would need a stored time (reported to the relay's owner).
_PUBLISH_TIME_FIELDS: Final = ("time", "time_dt")


def _restamped(stream: str, first: bytes | None, second: bytes | None) -> bool:
    """Whether two copies of an audit record differ only in the relay's publish time."""
    if stream != "audit" or first is None or second is None:
        return False
    a, b = json.loads(first), json.loads(second)
    stamped = all(
        x.get("unmapped", {}).get("recovery", {}).get("time_source") == "relay-publish-time"
        for x in (a, b)
    )
    for x in (a, b):
        for name in _PUBLISH_TIME_FIELDS:
            x.pop(name, None)
    return stamped and a == b


def _check_topic(
    topic: str,
    stream: str,
    records: Sequence[Consumed],
    expected: set[str],
    problems: list[str],
    restamped: list[int],
) -> int:
    """Compare one output topic with its outbox rows; returns the republished count."""
    seen: dict[str, bytes | None] = {}
    duplicates = 0
    for record in records:
        rid = record.header(HEADER_RECORD_ID)
        if rid is None:
            problems.append(f"{topic}[{record.partition}]@{record.offset} has no record id")
            continue
        if rid in seen:
            duplicates += 1
            if seen[rid] != record.value and _restamped(stream, seen[rid], record.value):
                restamped[0] += 1
            elif seen[rid] != record.value:
                problems.append(
                    f"{stream} record {rid} published twice with different bytes "
                    f"(second at {topic}[{record.partition}]@{record.offset})"
                )
        seen[rid] = record.value
    missing = sorted(expected - set(seen))
    extra = sorted(set(seen) - expected)
    if missing:
        problems.append(f"{len(missing)} {stream} rows not on {topic}: {missing[:_SHOW]}")
    if extra:
        problems.append(f"{len(extra)} records on {topic} no outbox row holds: {extra[:_SHOW]}")
    return duplicates


def audit_chains_verify(database_url: str) -> None:
    """Every audit chain (operations and intake chains) verifies; raises `FaultError`
    naming the first breaks otherwise."""
    ledger = PostgresLedger(database_url, max_size=1)
    try:
        breaks = ledger.verify_audit()
    finally:
        ledger.close()
    if breaks:
        raise FaultError(f"{len(breaks)} audit chains broken; first: {breaks[:_SHOW]}")


@dataclass(frozen=True, slots=True)
class RunReport:
    """Everything the checks found, for the test's progress output."""

    replay: ReplayReport
    outputs: OutputReport

    def __str__(self) -> str:
        r, o = self.replay, self.outputs
        return (
            f"replay: {r.records:,} input records ({r.refused} refused at intake, "
            f"{r.duplicates} redelivered duplicates), {r.operations:,} operations, "
            f"{r.decisions:,} decisions equal to the ledger's, each applied once; outputs: "
            f"outbox rows {dict(o.rows)}, records on topics {dict(o.records)}, "
            f"{o.duplicates} republished with the same id ({o.restamped} of them audit "
            f"records differing only in the relay's publish time, the rest byte-identical); "
            f"audit chains verify"
        )


def verify_run(bootstrap: str, database_url: str, topics: TopicNames) -> RunReport:
    """Every check of this module on a finished run; raises `FaultError` on the first
    that fails."""
    replay = replay_matches_ledger(bootstrap, database_url, topics)
    decided = applied_once(database_url)
    if decided != replay.decisions:
        raise FaultError(f"the ledger holds {decided} decisions, the replay {replay.decisions}")
    outputs = outputs_complete(bootstrap, database_url, topics)
    audit_chains_verify(database_url)
    return RunReport(replay, outputs)


def dead_letter_reasons(bootstrap: str, topics: TopicNames) -> dict[str, str]:
    """Coordinates of each dead-lettered input record (`topic[partition]@offset`) → its
    reason code, from the dead-letter topic's `recovery-coordinates` and
    `recovery-reason` headers."""
    out: dict[str, str] = {}
    for record in read_topic(bootstrap, topics.dlq):
        coordinates = record.header("recovery-coordinates")
        reason = record.header("recovery-reason")
        if coordinates is None or reason is None:
            raise FaultError(
                f"dead letter {topics.dlq}[{record.partition}]@{record.offset} lacks its "
                f"coordinates or reason header: {record.headers}"
            )
        out[coordinates] = reason
    return out
