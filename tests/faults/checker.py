"""A history checker in the style of Jepsen's for a fault run: what went in, what the
ledger decided, what came out, checked per operation, every anomaly listed.

The history is read after the run from the real topics and database (`gather`):

- the input: every record id the feeder produced (and how often), and the events topic
  read back in partition and offset order;
- the ledger: each operation's decisions in sequence order and the source coordinates
  (partition, offset) stored with each decided event;
- the outputs: the commands topic and the dead-letter topic, every copy of every record.

The expected results come from the decision core, never from the ledger: each input
record goes through the controller's intake and each accepted event through
`machines.Simulation` (which opens operations as the controller does), at the
`decided_at` of its stored decision when there is one (the controller decides at
wall-clock time; the clock is the only thing taken from the ledger). Then, per operation
(`check`):

- **input**: each produced record is on the events topic as often as it was produced;
- **decided exactly once, in offset order**: the stored decisions' event ids are exactly
  the accepted, non-duplicate events of the operation in offset order; sequences are
  1..n; no event id is decided twice; stored source offsets increase with the sequence;
  every stored decision equals the replayed one field for field;
- **commands**: after dedupe by record id, the commands topic holds exactly the commands
  the replayed decisions invoke, each once, keyed by its operation; no other command; a
  record id seen twice carries the same bytes;
- **dead letters**: every record refused at intake, every event-id conflict and every
  decision refused as a forged approval or a foreign correlation id (decided *and*
  dead-lettered, `consumer.batch`) has a dead letter at its coordinates; no other;
- **chains**: every audit chain verifies (`Ledger.verify_audit`), and the other output
  topics match the outbox (`verify.outputs_complete`);
- **timers** (issue #29; the controller's own events on the events topic are its
  timers' firings, not input): no timer fired twice (decided more than once, or two
  copies of its event with different bytes, which a second firing would write), none
  lost (every timer armed and not disarmed before it was decided, due longer than
  `grace` before the history was read, was decided), none forged (a timer event
  decided whose id no decision armed), and one decided stale only after its timer was
  disarmed (its state left).

A failed check does not stop the checker: each becomes an `Anomaly` (kind, operation,
detail), and `CheckReport` holds the counts and every anomaly.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import psycopg

from consumer.batch import FORGED_REFUSALS
from consumer.intake import Accepted, Intake, Rejected
from ledger import PostgresLedger
from machines import CORRELATION_MISMATCH, Outcome, Simulation, is_timer_event
from ops.bench.workload import BENCH_POLICY
from schemas import DEFAULT_CONTROLLER_ID, HEADER_PRODUCER, HEADER_RECORD_ID, TopicNames
from tests.faults.processes import FaultError
from tests.faults.verify import (
    Consumed,
    as_stored,
    first_difference,
    outputs_complete,
    read_topic,
    replayer,
    stored_decisions,
)

# A decision refused for one of these is recorded *and* dead-lettered (consumer.batch).
_DEAD_LETTERED: Final = FORGED_REFUSALS | {CORRELATION_MISMATCH}

__all__ = [
    "Anomaly",
    "CheckReport",
    "History",
    "Replayed",
    "check",
    "check_timers",
    "gather",
    "replay",
]

# How long before the history was read a timer must have fallen due to be owed a
# decision (the firing poll, the relay and the batch that decides it take a moment).
TIMER_GRACE: Final = timedelta(seconds=20)


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One thing the history shows that must not happen."""

    kind: str
    operation: str | None
    detail: str

    def __str__(self) -> str:
        where = f"operation {self.operation}: " if self.operation else ""
        return f"[{self.kind}] {where}{self.detail}"


@dataclass(frozen=True, slots=True)
class History:
    """What a run left behind, as plain values (module docstring)."""

    events_topic: str
    produced: Mapping[str, int]  # record id -> times produced
    inputs: Sequence[Consumed]  # the events topic in partition, offset order
    decisions: Mapping[str, Sequence[Mapping[str, Any]]]  # per operation, by sequence
    sources: Mapping[str, tuple[int | None, int | None]]  # event id -> partition, offset
    commands: Sequence[Consumed]
    dead_letters: Sequence[Consumed]
    chain_breaks: Sequence[str] = ()
    chains: int = 0
    output_problems: Sequence[str] = ()
    read_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def own(self, record: Consumed) -> bool:
        """Whether `record` is one the controller emitted (a timer's or a cascade's
        event, signed by it), not input."""
        return record.header(HEADER_PRODUCER) == DEFAULT_CONTROLLER_ID


@dataclass(slots=True)
class Replayed:
    """The decision core's answer to the input: per operation, the decisions (as
    stored) in offset order with each event's coordinates, and the commands expected."""

    decisions: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    offsets: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    commands: dict[str, str] = field(default_factory=dict)  # command id -> operation
    # Coordinates that must be dead-lettered: refused at intake, or decided as a forged
    # approval or a foreign correlation id (recorded and dead-lettered).
    refused: set[str] = field(default_factory=set)
    conflicts: set[str] = field(default_factory=set)  # coordinates of event-id conflicts
    duplicates: int = 0  # redelivered events, decided before


@dataclass(slots=True)
class CheckReport:
    """The counts of a checked history and every anomaly found."""

    counts: dict[str, int] = field(default_factory=dict)
    anomalies: list[Anomaly] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no anomaly was found."""
        return not self.anomalies

    def add(self, kind: str, operation: str | None, detail: str) -> None:
        """Record one anomaly."""
        self.anomalies.append(Anomaly(kind, operation, detail))

    def summary(self) -> str:
        """Counts and anomalies as lines for a terminal."""
        width = max(len(k) for k in self.counts) if self.counts else 0
        lines = [f"  {k:<{width}}  {v:>10,}" for k, v in self.counts.items()]
        lines.append(f"  {'anomalies':<{width}}  {len(self.anomalies):>10,}")
        lines += [f"    {a}" for a in self.anomalies]
        return "\n".join(lines)


def coordinates(topic: str, record: Consumed) -> str:
    """`topic[partition]@offset`, the form dead letters name their source with."""
    return f"{topic}[{record.partition}]@{record.offset}"


# -- the expected results ----------------------------------------------------------------


def replay(
    history: History, intake: Intake, sims: Mapping[str, Simulation]
) -> tuple[Replayed, dict[str, Simulation]]:
    """Feed the input through intake and the decision core (module docstring); the
    expected results and the simulation that holds each operation's view."""
    decided_at = {
        d["event"]["id"]: datetime.fromisoformat(d["decided_at"])
        for decisions in history.decisions.values()
        for d in decisions
    }
    out = Replayed()
    sim_of: dict[str, Simulation] = {}
    for record in history.inputs:
        outcome = intake.examine(record.raw(history.events_topic))
        if isinstance(outcome, Rejected):
            out.refused.add(coordinates(history.events_topic, record))
            continue
        assert isinstance(outcome, Accepted)
        event = outcome.event
        key = f"{outcome.machine.name}@{outcome.machine.version}"
        sim = sim_of.setdefault(event.operation_id, sims[key])
        decision = sim.feed(event, decided_at.get(event.event_id, event.event_time))
        if decision.outcome is Outcome.DUPLICATE:
            out.duplicates += 1
            continue
        if decision.outcome is Outcome.CONFLICT:
            out.conflicts.add(coordinates(history.events_topic, record))
            continue
        op = event.operation_id
        if any(n.code in _DEAD_LETTERED for n in decision.refusals):
            out.refused.add(coordinates(history.events_topic, record))  # and decided
        out.decisions[op].append(as_stored(decision.to_dict()))
        out.offsets[op].append((record.partition, record.offset))
        for invocation in decision.invocations:
            out.commands[invocation.command_id] = op
    return out, sim_of


# -- the checks ------------------------------------------------------------------------


def check(history: History, expected: Replayed) -> CheckReport:
    """Every check of the module docstring; never raises on an anomaly."""
    report = CheckReport()
    _check_input(history, report)
    for op in sorted(set(expected.decisions) | set(history.decisions)):
        _check_operation(op, expected, history, report)
    _check_commands(history, expected, report)
    _check_dead_letters(history, expected, report)
    for problem in history.chain_breaks:
        report.add("chain-broken", None, problem)
    for problem in history.output_problems:
        report.add("outputs", None, problem)
    timers = check_timers(history.decisions, history.read_at, report)
    _check_timer_copies(history, report)
    report.counts = {
        "records produced": sum(history.produced.values()),
        "records on the events topic": sum(not history.own(r) for r in history.inputs),
        "controller events on the topic": sum(history.own(r) for r in history.inputs),
        "refused (dead-lettered)": len(expected.refused),
        "redelivered duplicates": expected.duplicates,
        "event-id conflicts": len(expected.conflicts),
        "operations": len(expected.decisions),
        "decisions expected": sum(len(v) for v in expected.decisions.values()),
        "decisions in the ledger": sum(len(v) for v in history.decisions.values()),
        "commands expected": len(expected.commands),
        **report.counts,
        **timers,
        "audit chains verified": history.chains,
    }
    return report


def check_timers(
    decisions: Mapping[str, Sequence[Mapping[str, Any]]],
    read_at: datetime,
    report: CheckReport,
    grace: timedelta = TIMER_GRACE,
) -> dict[str, int]:
    """The timer checks of the module docstring over the stored decisions (per
    operation, by sequence), read at `read_at`; adds an anomaly per problem and returns
    the counts (armed, fired, stale, cancelled, not due yet)."""
    counts = Counter[str]()
    for op, stored in decisions.items():
        armed, disarmed, decided = _timer_history(op, stored, report, counts)
        counts["timers armed"] += len(armed)
        for eid, n in decided.items():
            if n > 1:
                report.add("timer-fired-twice", op, f"timer {eid} decided {n} times")
        for tid, timer in armed.items():
            if tid in decided:
                continue
            if tid in disarmed:
                counts["timers cancelled"] += 1
            elif datetime.fromisoformat(str(timer["due_at"])) <= read_at - grace:
                report.add("timer-lost", op, f"timer {tid} due {timer['due_at']} never decided")
            else:
                counts["timers not due yet"] += 1
    return dict(counts)


def _timer_history(
    op: str, stored: Sequence[Mapping[str, Any]], report: CheckReport, counts: Counter[str]
) -> tuple[dict[str, Mapping[str, Any]], set[str], Counter[str]]:
    """One operation's timers as its decisions armed, disarmed and decided them, in
    sequence order; a timer event decided out of turn is an anomaly."""
    armed: dict[str, Mapping[str, Any]] = {}
    disarmed: set[str] = set()
    decided = Counter[str]()
    for d in stored:
        eid, outcome = str(d["event"]["id"]), d["outcome"]
        if is_timer_event(eid) and outcome != "duplicate":
            decided[eid] += 1
            if eid not in armed:
                report.add("timer-forged", op, f"timer event {eid} decided, never armed")
            elif outcome == "stale" and eid not in disarmed:
                report.add("timer-stale-armed", op, f"{eid} decided stale while armed")
            elif outcome != "stale" and eid in disarmed:
                report.add("timer-after-disarm", op, f"{eid} acted on after it was disarmed")
            counts["timers stale" if outcome == "stale" else "timers fired"] += 1
        change = d.get("timers") or {}
        for timer in change.get("armed", ()):
            armed[str(timer["id"])] = timer
        disarmed.update(str(t) for t in change.get("disarmed", ()))
    return armed, disarmed, decided


def _check_timer_copies(history: History, report: CheckReport) -> None:
    """Two copies of one timer's event with different bytes: it was fired twice."""
    seen: dict[str, bytes] = {}
    for record in history.inputs:
        rid = record.header(HEADER_RECORD_ID)
        if not history.own(record) or rid is None:
            continue
        first = seen.setdefault(rid, record.value)
        if first != record.value:
            op = None if record.key is None else record.key.decode(errors="replace")
            report.add("timer-fired-twice", op, f"{rid} on the events topic with other bytes")


def _check_input(history: History, report: CheckReport) -> None:
    on_topic = Counter(r.header(HEADER_RECORD_ID) for r in history.inputs if not history.own(r))
    for rid, n in history.produced.items():
        if on_topic.get(rid, 0) < n:
            report.add(
                "input-lost",
                None,
                f"record {rid} produced {n}x, on the topic {on_topic.get(rid, 0)}x",
            )
        elif on_topic[rid] > n:
            report.add(
                "input-duplicated",
                None,
                f"record {rid} produced {n}x, on the topic {on_topic[rid]}x",
            )
    for rid in sorted(set(on_topic) - set(history.produced), key=str):
        report.add("input-unexpected", None, f"record {rid} on the events topic was never produced")


def _check_operation(op: str, expected: Replayed, history: History, report: CheckReport) -> None:
    want = expected.decisions.get(op, [])
    got = [as_stored(d) for d in history.decisions.get(op, [])]
    want_ids = [d["event"]["id"] for d in want]
    got_ids = [d["event"]["id"] for d in got]
    sequences = [d["sequence"] for d in got]
    if sequences != list(range(1, len(got) + 1)):
        report.add("sequence-gap", op, f"decision sequences {sequences}, not 1..{len(got)}")
    for eid, n in Counter(got_ids).items():
        if n > 1:
            report.add("decided-twice", op, f"event {eid} decided {n} times")
    for eid in [e for e in want_ids if e not in set(got_ids)]:
        report.add("decision-missing", op, f"event {eid} was accepted but never decided")
    for eid in [e for e in got_ids if e not in set(want_ids)]:
        report.add("decision-unexpected", op, f"event {eid} decided but no input accepts it")
    offsets = [history.sources.get(e, (None, None)) for e in got_ids]
    if any(o[1] is None for o in offsets) or offsets != sorted(offsets):
        report.add("decision-order", op, f"decided at source offsets {offsets} (by sequence)")
    if sorted(want_ids) == sorted(got_ids) and want_ids != got_ids:
        report.add("decision-order", op, f"decided {got_ids}, offset order is {want_ids}")
    elif want_ids == got_ids and want != got:
        report.add("decision-differs", op, first_difference(op, want, got))


def _copies(
    records: Iterable[Consumed], key_of: str, report: CheckReport, kind: str
) -> tuple[dict[str, Consumed], int]:
    """The first copy of each record by `key_of` header, and how many later copies were
    removed; a later copy with other bytes is an anomaly of `kind`."""
    first: dict[str, Consumed] = {}
    removed = 0
    for record in records:
        rid = record.header(key_of)
        if rid is None:
            report.add(
                kind,
                None,
                f"record at [{record.partition}]@{record.offset} has no {key_of} header",
            )
            continue
        if rid in first:
            removed += 1
            if first[rid].value != record.value:
                report.add(kind, None, f"{rid} published twice with different bytes")
            continue
        first[rid] = record
    return first, removed


def _check_commands(history: History, expected: Replayed, report: CheckReport) -> None:
    found, removed = _copies(history.commands, HEADER_RECORD_ID, report, "command-differs")
    for cid, op in sorted(expected.commands.items()):
        record = found.get(cid)
        if record is None:
            report.add("command-missing", op, f"command {cid} was never published")
        elif record.key != op.encode():
            report.add("command-misrouted", op, f"command {cid} keyed {record.key!r}")
    for cid, record in sorted(found.items()):
        if cid not in expected.commands:
            op = None if record.key is None else record.key.decode(errors="replace")
            report.add("command-unexpected", op, f"command {cid} published but never invoked")
    report.counts["command records on the topic"] = len(history.commands)
    report.counts["command duplicates removed"] = removed
    report.counts["commands after dedupe"] = len(found)


def _check_dead_letters(history: History, expected: Replayed, report: CheckReport) -> None:
    found, removed = _copies(
        history.dead_letters, "recovery-coordinates", report, "dead-letter-differs"
    )
    want = expected.refused | expected.conflicts
    for where in sorted(want - set(found)):
        report.add(
            "dead-letter-missing", None, f"record {where} was refused but has no dead letter"
        )
    for where in sorted(set(found) - want):
        report.add(
            "dead-letter-unexpected",
            None,
            f"dead letter for {where}, which intake and the core accept",
        )
    report.counts["dead letters expected"] = len(want)
    report.counts["dead-letter duplicates removed"] = removed


# -- reading the history ------------------------------------------------------------------


def _sources(database_url: str) -> dict[str, tuple[int | None, int | None]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT event_id, source_partition, source_offset FROM events")
        return {eid: (p, o) for eid, p, o in rows}


def _chains(database_url: str) -> tuple[list[str], int]:
    ledger = PostgresLedger(database_url, max_size=1)
    try:
        chains = len(ledger.audit_operation_ids())
        return [str(b) for b in ledger.verify_audit()], chains
    finally:
        ledger.close()


def gather(
    bootstrap: str,
    database_url: str,
    topics: TopicNames,
    produced: Iterable[str],
    stopped_at: datetime | None = None,
) -> History:
    """Read a finished run's history from its topics and database (`database_url`: an
    administrative URL of the run's ledger); `stopped_at`, when the roles were stopped,
    is the moment the timers are owed a decision by (default: now)."""
    try:
        outputs_complete(bootstrap, database_url, topics)
        problems: list[str] = []
    except FaultError as exc:
        problems = str(exc).splitlines()[1:]
    breaks, chains = _chains(database_url)
    return History(
        events_topic=topics.events,
        produced=Counter(produced),
        inputs=read_topic(bootstrap, topics.events, timeout=300),
        decisions=stored_decisions(database_url),
        sources=_sources(database_url),
        commands=read_topic(bootstrap, topics.commands, timeout=300),
        dead_letters=read_topic(bootstrap, topics.dlq, timeout=300),
        chain_breaks=breaks,
        chains=chains,
        output_problems=problems,
        read_at=stopped_at or datetime.now(UTC),
    )


def check_run(
    bootstrap: str,
    database_url: str,
    topics: TopicNames,
    produced: Iterable[str],
    policy: Path = BENCH_POLICY,
    stopped_at: datetime | None = None,
) -> CheckReport:
    """Gather a finished run's history and check it (module docstring), replayed under
    the `policy` its controller ran with."""
    history = gather(bootstrap, database_url, topics, produced, stopped_at)
    intake, sims = replayer(bootstrap, database_url, policy)
    expected, _ = replay(history, intake, sims)
    return check(history, expected)
