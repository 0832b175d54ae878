"""The benchmark's phases, against one broker and one PostgreSQL server.

1. **Setup**: a scratch database (migrated ledger schema) and topics of the run's own
   (`bench-<run>.recovery.*`, `--partitions` each), so nothing else on the services is
   read or disturbed; both are dropped at the end.
2. **Baseline**: a backlog of `events` records is loaded, then drained by the bare
   pipeline (`ops.bench.baseline_pipeline.run_baseline`) into the same database, three
   times into emptied tables; the median drain is the baseline.
3. **Saturation**: the same backlog is drained by one controller and one relay (child
   processes). Throughput = records / (last command readable on the commands topic, or
   the last offset stored, whichever is later, minus the controller's first assignment).
4. **Latency**: at each offered rate, fresh operations are produced at that pace for
   `latency_seconds`; per event that causes commands, the time from its produce call to
   the moment its last command is readable. Each rate starts with this host's page
   cache written back (`os.sync`): what the drain before it wrote, hundreds of
   megabytes, the kernel would otherwise write back in one burst about 30 s later, in
   the middle of a phase, and every commit would wait behind it (docs/operations.md,
   "The ledger's disk"). That stall belongs to the drain, not to the rate measured.
5. **Memory**: for each backlog size, the controller and relay are stopped, the backlog
   is loaded, fresh processes drain it; their peak RSS (VmHWM) is recorded per size.
6. **Scaling** (`members`): for each number of controllers, that many controller
   processes of the run's group (each a static member) and one relay join, then a
   fresh backlog of `events` records is produced and drained (`_scaling`).
7. **Timer storm** (`timers`): that many timers due at once (`ops.bench.timers`) and a
   fresh backlog of `events` records, drained together by one controller and one
   relay: how long the timers took to fire and be decided, and the live backlog's
   throughput meanwhile next to the saturation phase's (`_timer_storm`).

Every drain (2, 5, 6) also reports the CPU each process kind used per record
(`ops.bench.cpu`); with `profile`, the saturation drain is profiled
(`ops.bench.profile`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo

from ledger import (
    OutboxWatch,
    PostgresLedger,
    create_database,
    drop_database,
    migrate_database,
    with_database,
)
from ops.bench.baseline_pipeline import TopicTail, create_topic, delete_topics, run_baseline
from ops.bench.baseline_sink import BaselineSink
from ops.bench.cpu import CpuWatch, cpu_figures
from ops.bench.profile import PySpy, StatementStats, py_spy_path
from ops.bench.roles import BenchError, RoleProcess
from ops.bench.timers import seed_due_timers, timers_fired, wait_fired
from ops.bench.workload import (
    BENCH_POLICY,
    BenchRecord,
    WorkloadSpec,
    WorkloadStats,
    bench_roster,
    bench_roster_names,
    bench_signer,
    generate,
)
from ops.keys import stack_key
from producers import EventPublisher, provision
from schemas import ENV_CONTROLLER_SIGNING_KEY_FILE, IdentitySettings, TopicNames

__all__ = ["LATENCY_STAGES", "BenchConfig", "BenchResult", "run_bench"]

T = TypeVar("T")
# Seconds between counts of the outbox backlog while the controller is still deciding.
_BACKLOG_EVERY: Final = 1.0
# Drains of the bare pipeline per run; the median is the baseline (`_baseline`).
_BASELINE_DRAINS: Final = 3


class Progress(Protocol):
    """Where the runner reports: `keep` marks a result line that must stay visible
    (a progress display may overwrite or skip the others)."""

    def __call__(self, text: str, *, keep: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to run."""

    bootstrap: str
    database_url: str
    events: int = 20_000
    partitions: int = 6
    rates: tuple[int, ...] = (200, 500, 1000)
    latency_seconds: float = 15.0
    memory_backlogs: tuple[int, ...] = (10_000, 50_000)
    batch_max_records: int = 500
    phase_timeout: float = 900.0
    log_dir: Path = Path(tempfile.gettempdir()) / "recovery-bench"
    interleave: int = 64
    keep_on_failure: bool = False
    settle_seconds: float = 30.0
    # Controller processes of each scaling phase (`--members`); none: no scaling phase.
    members: tuple[int, ...] = ()
    # py-spy and pg_stat_statements over the saturation phase (`--profile`), py-spy
    # taking `profile_rate` samples a second.
    profile: bool = False
    profile_rate: int = 100
    # With `profile`: py-spy unwinds native frames too (`--native`).
    profile_native: bool = False
    # Timers due at once in the timer-storm phase (`--timers`); 0: no such phase.
    timers: int = 0


@dataclass
class BenchResult:
    """Every figure, JSON-ready (`report.py` prints and writes it)."""

    run_id: str
    config: dict[str, Any]
    workload: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    saturation: dict[str, Any] = field(default_factory=dict)
    latency: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    scaling: list[dict[str, Any]] = field(default_factory=list)
    profile: dict[str, Any] = field(default_factory=dict)
    timers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Run:
    config: BenchConfig
    run_id: str
    url: str
    topics: TopicNames
    group: str
    say: Progress
    produced: int = 0
    controllers: list[RoleProcess] = field(default_factory=list)
    relay: RoleProcess | None = None
    cpu: CpuWatch | None = None
    statements: StatementStats | None = None
    # One publisher for the whole run, as a tool keeps one: a new idempotent producer
    # holds its first records until it has a producer id from the broker (about 0.5 s
    # with librdkafka here), which a latency phase would otherwise count as the first
    # events' latency. The saturation load, which is not timed per event, warms it.
    publisher: EventPublisher | None = None

    def env(self) -> dict[str, str]:
        env = {
            "RECOVERY_KAFKA_BOOTSTRAP": self.config.bootstrap,
            "RECOVERY_DATABASE_URL": self.url,
            "RECOVERY_CONTROLLER_POLICY_PATH": str(BENCH_POLICY),
            # The bench policy is the demo's, with a public-name approver key.
            "RECOVERY_DEMO_MODE": "1",
            # The bench's producers sign every event (keys made for this process); the
            # controller verifies each signature, as in production.
            "RECOVERY_CONTROLLER_ROSTER_PATH": str(_roster_file()),
            "RECOVERY_CONTROLLER_GROUP_ID": self.group,
            "RECOVERY_CONTROLLER_BATCH_MAX_RECORDS": str(self.config.batch_max_records),
        }
        for name in ("events", "commands", "evidence", "audit", "dlq"):
            env[f"RECOVERY_TOPIC_{name.upper()}"] = getattr(self.topics, name)
        return env

    def start_roles(self, label: str, members: int = 1, *, static: bool = False) -> None:
        """Start one relay and `members` controllers in the run's group; `static` gives
        each controller a group.instance.id (`bench-<run>-member-<i>`, the same i in
        every phase, so that a member of an earlier phase is replaced at once rather
        than waited for)."""
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        label = label.replace(" ", "-").replace(",", "")
        self.relay = RoleProcess(
            "relay",
            {**self.env(), "RECOVERY_DATABASE_URL": _named(self.url, "bench-relay")},
            self.config.log_dir / f"{self.run_id}-{label}-relay.log",
        )
        signing_key = str(
            IdentitySettings.load().controller_key_file
            or stack_key(f"bench-{self.run_id}", self.config.log_dir)
        )
        self.controllers = []
        for index in range(1, members + 1):
            name = "controller" if members == 1 else f"controller-{index}"
            env = {
                **self.env(),
                # Each member's sessions are named, to count their server backends' CPU.
                "RECOVERY_DATABASE_URL": _named(self.url, f"bench-{name}"),
                "RECOVERY_CONTROLLER_INSTANCE_ID": f"bench-{self.run_id}-{label}-{index}",
                # The benchmark's scratch database is reached with the URL it was given,
                # usually a superuser's; the controller refuses that unless told to.
                "RECOVERY_CONTROLLER_ALLOW_SUPERUSER": "1",
                # It signs every record it emits, as in production: with the key the
                # environment names, else a scratch key of the run's own.
                ENV_CONTROLLER_SIGNING_KEY_FILE: signing_key,
            }
            if static:
                env["RECOVERY_CONTROLLER_GROUP_INSTANCE_ID"] = f"bench-{self.run_id}-member-{index}"
            self.controllers.append(
                RoleProcess(
                    "controller",
                    env,
                    self.config.log_dir / f"{self.run_id}-{label}-{name}.log",
                    name=name,
                )
            )
        self.relay.start()
        for controller in self.controllers:
            controller.start()

    @property
    def controller(self) -> RoleProcess | None:
        """The first (or only) controller of the running roles."""
        return self.controllers[0] if self.controllers else None

    def roles(self) -> list[RoleProcess]:
        """The running role processes, controllers first."""
        return [*self.controllers, *([self.relay] if self.relay is not None else [])]

    def stop_roles(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for role in self.roles():
            status = role.stop()
            out[role.name] = {
                "peak_rss_mb": _mb(role.peak_rss),
                "exit_status": status,
                "rss_samples_mb": _downsample([_mb(s.rss) for s in role.samples]),
            }
        self.controllers, self.relay = [], None
        return out


def run_bench(config: BenchConfig, say: Progress) -> BenchResult:
    """Run every phase (module docstring) and return the figures. Raises `BenchError`
    when a phase cannot complete."""
    run_id = uuid.uuid4().hex[:6]
    result = BenchResult(run_id, _config_dict(config))
    database = f"bench_{run_id}"
    say(f"setup: database {database}, topics bench-{run_id}.* x{config.partitions} partitions")
    create_database(config.database_url, database)
    url = with_database(config.database_url, database)
    topics = TopicNames(
        **{
            n: f"bench-{run_id}.recovery.{n}"
            for n in ("events", "commands", "evidence", "audit", "dlq")
        }
    )
    run = _Run(config, run_id, url, topics, f"bench-{run_id}", say)
    run.cpu = CpuWatch(url, database, _port(config.bootstrap))
    if config.profile:
        py_spy_path()  # fails now, not after the baseline, when py-spy is missing
    keep = False
    try:
        migrate_database(url)
        provision(config.bootstrap, config.partitions, names=topics)
        create_topic(config.bootstrap, _baseline_topic(topics), config.partitions)
        signers = {name: bench_signer(name) for name in bench_roster_names()}
        with EventPublisher(config.bootstrap, signer=signers, topics=topics) as run.publisher:
            _phases(run, result)
    except BenchError:
        # Leave the evidence for a post-mortem when asked to.
        keep = config.keep_on_failure
        raise
    finally:
        run.stop_roles()
        result.notes += run.cpu.notes
        if keep:
            say(f"kept database {database} and topics bench-{run_id}.* for inspection")
        else:
            drop_database(config.database_url, database)
            _delete_topics(config.bootstrap, topics)
    return result


def _phases(run: _Run, result: BenchResult) -> None:
    config = run.config
    stats = WorkloadStats()
    spec = WorkloadSpec(run.run_id, "sat", config.events, interleave=config.interleave)
    expected = _load(run, generate(spec, stats), "saturation backlog")
    result.workload = _workload_dict(stats)
    result.baseline = _baseline(run, stats.records)
    if config.profile:
        # Before the roles start: tracking applies to the sessions opened afterwards.
        run.statements = StatementStats(run.url, f"bench_{run.run_id}")
        run.statements.enable()
        if run.statements.note:
            result.notes.append(run.statements.note)
    with _tail(run) as tail:
        result.saturation = _drain(
            run,
            tail,
            "saturation",
            stats.records,
            expected,
            profile=result.profile if config.profile else None,
        )
        base = result.baseline["events_per_second"]
        result.saturation["ratio_to_baseline"] = round(
            result.saturation["events_per_second"] / base, 3
        )
        for rate in config.rates:
            result.latency.append(_latency(run, tail, rate))
        result.saturation["roles"] = run.stop_roles()
        for size in config.memory_backlogs:
            result.memory.append(_memory(run, tail, size))
        result.scaling.append(_saturation_row(result.saturation))
        # Ascending, so that each phase's static members replace the last phase's at once
        # (`_Run.start_roles`); a member left over from a larger phase would hold its
        # partitions for a session timeout.
        for members in sorted(set(config.members)):
            result.scaling.append(_scaling(run, tail, members))
        if config.timers:
            result.timers = _timer_storm(run, tail, config.timers, result.saturation)


def _timer_storm(
    run: _Run, tail: TopicTail, count: int, saturation: dict[str, Any]
) -> dict[str, Any]:
    """`count` timers due at once and a fresh live backlog, drained together (module
    docstring, phase 7): when the timers were all decided and when the live backlog's
    commands were all readable, from the controller's first assignment."""
    label = f"timers x{count:,}"
    run.say(f"{label}: seeding {count:,} operations whose timers fall due together")
    seeding = time.monotonic()
    ops = seed_due_timers(run.url, run.run_id, count, run.topics.events, run.config.partitions)
    seed_seconds = time.monotonic() - seeding
    time.sleep(1.5)  # every seeded timer is due now
    stats = WorkloadStats()
    spec = WorkloadSpec(run.run_id, "tim", run.config.events, interleave=run.config.interleave)
    expected = _load(run, generate(spec, stats), f"{label} live backlog")
    run.start_roles(label)
    started = _first_assigned(run, 120.0)
    deadline = time.monotonic() + run.config.phase_timeout
    live_done: float | None = None
    while live_done is None and time.monotonic() < deadline:
        _check_alive(run)
        if not _missing(tail, expected):
            live_done = time.time()
        else:
            run.say(f"{label}: {len(expected) - len(_missing(tail, expected)):,} live commands")
            time.sleep(0.2)
    prefix = ops[0].rsplit("-", 1)[0] + "-"
    fired = wait_fired(run.url, prefix, count, max(1.0, deadline - time.monotonic()))
    if live_done is None or fired is None:
        raise BenchError(
            f"{label}: not done within {run.config.phase_timeout:.0f}s (live backlog "
            f"{'done' if live_done else 'not done'}, {timers_fired(run.url, prefix):,} "
            f"of {count:,} timers decided); see the logs in {run.config.log_dir}"
        )
    roles = run.stop_roles()
    live_seconds, timer_seconds = live_done - started, fired - started
    live_rate = stats.records / max(live_seconds, 1e-9)
    reference = saturation.get("events_per_second") or 0
    run.say(
        f"{label}: all decided in {timer_seconds:.1f}s ({count / timer_seconds:,.0f}/s); "
        f"live backlog meanwhile {live_rate:,.0f} records/s",
        keep=True,
    )
    return {
        "timers": count,
        "seed_seconds": round(seed_seconds, 2),
        "drain_seconds": round(timer_seconds, 3),
        "timers_per_second": round(count / timer_seconds, 1),
        "live_records": stats.records,
        "live_seconds": round(live_seconds, 3),
        "live_events_per_second": round(live_rate, 1),
        "saturation_events_per_second": reference,
        "live_ratio_to_saturation": round(live_rate / reference, 3) if reference else None,
        "peak_rss_mb": {name: role["peak_rss_mb"] for name, role in roles.items()},
    }


class _tail:
    def __init__(self, run: _Run) -> None:
        self._run = run
        self._tail: TopicTail | None = None

    def __enter__(self) -> TopicTail:
        topics = self._run.topics
        self._tail = TopicTail(
            self._run.config.bootstrap,
            [topics.commands, topics.dlq],
            topics.commands,
            from_start=True,
        )
        return self._tail

    def __exit__(self, *_exc: object) -> None:
        if self._tail is not None:
            self._tail.close()


def _load(
    run: _Run,
    records: Iterable[BenchRecord],
    label: str,
    *,
    rate: float | None = None,
    sent_at: dict[str, float] | None = None,
) -> dict[str, str]:
    """Produce `records` (paced at `rate` per second when given); returns command id →
    causing record id, and fills `sent_at` (record id → produce time) for records that
    cause commands."""
    expected: dict[str, str] = {}
    publisher = run.publisher
    assert publisher is not None, "the run's publisher is opened before its phases"
    started = time.monotonic()
    count = 0
    for count, record in enumerate(records, start=1):
        if rate is not None:
            delay = started + count / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if sent_at is not None and record.commands:
            sent_at[record.record_id] = time.time()
        publisher.send(
            run.topics.events,
            key=record.key,
            value=record.value,
            record_id=record.record_id,
            content_type=record.content_type,
            fingerprint=record.fingerprint,
            producer=record.producer,
        )
        for command in record.commands:
            expected[command] = record.record_id
        if count % 2000 == 0:
            run.say(f"{label}: {count:,} records produced")
    # Every record is on the broker before the phase is timed or waited on.
    publisher.flush()
    run.produced += count
    run.say(f"{label}: {count:,} records produced in {time.monotonic() - started:.1f}s", keep=True)
    return expected


def _baseline(run: _Run, records: int) -> dict[str, Any]:
    """Drain the backlog through the bare pipeline `_BASELINE_DRAINS` times, each into
    emptied tables with a fresh consumer group, and report the median drain: one drain
    of a second or two moves by 2-3x when a checkpoint or another process lands in it,
    and the ratio divides by this figure."""
    drains: list[dict[str, Any]] = []
    sink = BaselineSink(run.url)
    try:
        for number in range(1, _BASELINE_DRAINS + 1):
            run.say(
                f"baseline {number}/{_BASELINE_DRAINS}: draining {records:,} records "
                "(row + offsets per batch, acks=all)"
            )
            sink.reset()
            outcome = run_baseline(
                run.config.bootstrap,
                run.topics.events,
                _baseline_topic(run.topics),
                sink,
                records,
                batch_max=run.config.batch_max_records,
                timeout=run.config.phase_timeout,
            )
            drains.append(
                {
                    "records": outcome.records,
                    "rows_stored": sink.stored(),
                    "batches": outcome.batches,
                    "seconds": round(outcome.seconds, 3),
                    "events_per_second": round(outcome.rate, 1),
                }
            )
            run.say(
                f"baseline {number}/{_BASELINE_DRAINS}: {outcome.rate:,.0f} records/s "
                f"({outcome.seconds:.2f}s)"
            )
    finally:
        sink.close()
    median = sorted(drains, key=lambda d: d["events_per_second"])[len(drains) // 2]
    run.say(
        f"baseline: {median['events_per_second']:,.0f} records/s (median of "
        f"{', '.join(format(d['events_per_second'], ',.0f') for d in drains)})",
        keep=True,
    )
    return {
        **median,
        "rows_stored": min(d["rows_stored"] for d in drains),
        "drains": drains,
    }


def _drain(
    run: _Run,
    tail: TopicTail,
    label: str,
    records: int,
    expected: dict[str, str],
    *,
    profile: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Start the roles on a loaded backlog and time it until it is decided and every
    expected command is readable; the CPU every process kind used meanwhile
    (`ops.bench.cpu`). With `profile` (a dict to fill), py-spy records the controller
    and the relay and pg_stat_statements counts the statements over the same window."""
    run.say(f"{label}: starting controller and relay on a backlog of {records:,} records")
    # The tail reads the dead-letter topic for the whole run: count this phase's only.
    _settle_tail(tail, run.topics.dlq)
    letters_before = tail.count(run.topics.dlq)
    if profile is not None and run.statements is not None:
        run.statements.mark()  # before the roles can run a statement
    run.start_roles(label)
    assert run.cpu is not None
    # py-spy samples from before the first poll, so that a short drain is all in it.
    spy = _start_profile(run, label) if profile is not None else None
    started = _first_assigned(run, 120.0)
    cpu_start = run.cpu.snapshot(_pids(run), at=time.time())
    done = _wait_done(run, tail, label, expected, started)
    cpu_end = run.cpu.snapshot(_pids(run), at=time.time())
    if spy is not None and profile is not None:
        _stop_profile(run, spy, profile, records)
    _settle_tail(tail, run.topics.dlq)
    seen = tail.commands()
    missing = _missing(tail, expected)
    if missing:
        run.say(f"{label}: {len(missing)} command(s) never readable, e.g. {missing[0]}", keep=True)
    last_command = max((seen[c] for c in expected if c in seen), default=started)
    end = max(last_command, done)
    seconds = max(end - started, 1e-9)
    # The controller's CPU counts from its first assignment: start-up is not work per
    # record.
    role_starts = {
        c.name: c.cpu_at_assigned for c in run.controllers if c.cpu_at_assigned is not None
    }
    run.say(f"{label}: {records / seconds:,.0f} records/s ({seconds:.2f}s)", keep=True)
    return {
        "records": records,
        "commands_expected": len(expected),
        "commands_seen": len(expected) - len(missing),
        "commands_missing": len(missing),
        "commands_missing_examples": missing[:5],
        "seconds": round(seconds, 3),
        "events_per_second": round(records / seconds, 1),
        "dead_letters_seen": tail.count(run.topics.dlq) - letters_before,
        "cpu": cpu_figures(cpu_start, cpu_end, records, role_starts=role_starts),
    }


def _wait_for(run: _Run, found: Callable[[], T | None], timeout: float, failure: str) -> T:
    """Poll `found` until it gives a value; raises `BenchError` with `failure` after
    `timeout` seconds, or when a role exited."""
    deadline = time.monotonic() + timeout
    while (value := found()) is None:
        _check_alive(run)
        if time.monotonic() > deadline:
            raise BenchError(failure)
        time.sleep(0.02)
    return value


def _first_assigned(run: _Run, timeout: float) -> float:
    """When the controller first got partitions; raises `BenchError` when it did not
    within `timeout` seconds or a role exited."""

    def first() -> float | None:
        times = [c.assigned_at for c in run.controllers if c.assigned_at is not None]
        return min(times) if times else None

    failure = (
        f"no controller was assigned partitions within {timeout:.0f}s; see "
        f"{run.controllers[0].log_path}"
    )
    return _wait_for(run, first, timeout, failure)


def _pids(run: _Run) -> dict[str, int]:
    return {role.name: role.pid for role in run.roles()}


def _start_profile(run: _Run, label: str) -> PySpy:
    """py-spy on the controller and the relay once each has started (imports and
    set-up are not the phase's work), recording before either polls."""
    spy = PySpy(
        run.config.log_dir / f"{run.run_id}-{label}-profile",
        run.config.profile_rate,
        run.config.profile_native,
    )
    controller, relay = run.controller, run.relay
    assert controller is not None
    assert relay is not None
    _wait_for(
        run,
        lambda: True if None not in (controller.started_at, relay.started_at) else None,
        120.0,
        f"{label}: the controller or the relay did not start within 120s",
    )
    spy.start("controller", controller.pid)
    spy.start("relay", relay.pid)
    run.say(f"{label}: py-spy recording the controller and the relay")
    return spy


def _stop_profile(run: _Run, spy: PySpy, profile: dict[str, Any], records: int) -> None:
    run.say("profile: writing the py-spy recordings")
    profile["py_spy"] = spy.stop()
    if run.statements is not None:
        profile["statements"] = run.statements.top(records)
        profile["statements_note"] = run.statements.note
    profile["records"] = records


def _scaling(run: _Run, tail: TopicTail, members: int) -> dict[str, Any]:
    """`members` controller processes of one group (each a static member) and one
    relay drain `events` fresh records: throughput and CPU per record by number of
    members. The members join first and the group settles (`_settled`), then the
    backlog is produced at full speed; the phase is timed from the first record
    produced, so no rebalance falls inside it. `load_seconds` says how long producing
    took: a phase not much longer than that was bounded by the producer."""
    label = f"scaling x{members}"
    who = "1 controller" if members == 1 else f"{members} controllers"
    run.say(f"{label}: starting {who} and relay")
    _settle_tail(tail, run.topics.dlq)
    run.start_roles(label, members, static=True)
    assert run.cpu is not None
    joined = _settled(run, 120.0)
    stats = WorkloadStats()
    spec = WorkloadSpec(
        run.run_id, f"m{members}", run.config.events, interleave=run.config.interleave
    )
    records = list(generate(spec, stats))
    cpu_start = run.cpu.snapshot(_pids(run), at=time.time())
    started = time.time()
    expected = _load(run, records, f"{label} backlog")
    loaded = time.time()
    done = _wait_done(run, tail, label, expected, started)
    cpu_end = run.cpu.snapshot(_pids(run), at=time.time())
    _settle_tail(tail, run.topics.dlq)
    seen = tail.commands()
    missing = _missing(tail, expected)
    end = max(max((seen[c] for c in expected if c in seen), default=started), done)
    seconds = max(end - started, 1e-9)
    run.say(f"{label}: {stats.records / seconds:,.0f} records/s ({seconds:.2f}s)", keep=True)
    roles = run.stop_roles()
    return {
        "members": members,
        "phase": label,
        "records": stats.records,
        "seconds": round(seconds, 3),
        "events_per_second": round(stats.records / seconds, 1),
        "load_seconds": round(loaded - started, 3),
        "join_seconds": round(joined, 3),
        "commands_missing": len(missing),
        "commands_missing_examples": missing[:5],
        "cpu": cpu_figures(cpu_start, cpu_end, stats.records),
        "peak_rss_mb": {name: role["peak_rss_mb"] for name, role in roles.items()},
        "exit_status": {name: role["exit_status"] for name, role in roles.items()},
    }


def _settled(run: _Run, timeout: float, quiet: float = 1.5) -> float:
    """Wait until every controller has been assigned partitions and none has logged a
    new assignment for `quiet` seconds; returns how long that took."""
    began = time.monotonic()

    def quiet_since() -> float | None:
        latest = [c.last_assigned_at for c in run.controllers]
        if (
            all(t is not None for t in latest)
            and time.time() - max(t for t in latest if t is not None) >= quiet
        ):
            return time.monotonic() - began
        return None

    failure = (
        f"the {len(run.controllers)} controllers did not all get partitions within "
        f"{timeout:.0f}s; see {run.config.log_dir}"
    )
    return _wait_for(run, quiet_since, timeout, failure)


def _saturation_row(drained: dict[str, Any]) -> dict[str, Any]:
    """The saturation drain as the scaling table's reference row (one controller, the
    backlog loaded before it started, timed from its first assignment)."""
    keys = ("records", "seconds", "events_per_second", "commands_missing", "cpu")
    return {"members": 1, "phase": "saturation", **{k: drained[k] for k in keys}}


def _wait_done(
    run: _Run,
    tail: TopicTail,
    label: str,
    expected: dict[str, str],
    started: float,
) -> float:
    """Wait until the ledger's stored offsets account for every produced record and
    every expected command is readable. A command that never comes ends the wait once
    the offsets are complete and the outbox is empty, or its backlog (rows held back by
    an unpublishable one) has not moved for `settle_seconds`; it is reported missing.
    Returns when the offsets got there (`time.time()`)."""
    ledger = PostgresLedger(run.url, max_size=1)
    watch = OutboxWatch(run.url)
    deadline = time.monotonic() + run.config.phase_timeout
    offsets_done: float | None = None
    found, backlog, changed = -1, -1, time.monotonic()
    counted = 0.0
    try:
        while time.monotonic() < deadline:
            if offsets_done is None:
                stored = sum(ledger.offsets(run.group, run.topics.events).values())
                if stored >= run.produced:
                    offsets_done = time.time()
            seen = tail.commands()
            now_found = sum(1 for c in expected if c in seen)
            # Counting the unpublished rows scans the outbox's backlog (a few ms of the
            # server's time on the cores the measured roles share): once a second while
            # the controller is still deciding, every poll once only the relay is left.
            now_backlog = backlog
            if offsets_done is not None or time.monotonic() - counted >= _BACKLOG_EVERY:
                now_backlog, counted = watch.backlog(), time.monotonic()
            if (now_found, now_backlog) != (found, backlog):
                found, backlog, changed = now_found, now_backlog, time.monotonic()
            run.say(
                f"{label}: {found:,}/{len(expected):,} commands readable, outbox backlog "
                f"{backlog:,}, {time.time() - started:.1f}s"
            )
            quiet = time.monotonic() - changed
            # Done once everything the records caused is out (dead letters and audit
            # records too, not only the commands), or nothing has moved for a while.
            if offsets_done is not None and (
                (found >= len(expected) and backlog == 0)
                or (backlog == 0 and quiet > 1.0)
                or quiet > run.config.settle_seconds
            ):
                return offsets_done
            _check_alive(run)
            time.sleep(0.05)
    finally:
        watch.close()
        ledger.close()
    seen = tail.commands()
    missing = sorted(c for c in expected if c not in seen)
    raise BenchError(
        f"{label}: not done within {run.config.phase_timeout:.0f}s (offsets complete: "
        f"{offsets_done is not None}; {len(missing)} expected command(s) not readable, "
        f"e.g. {', '.join(missing[:4]) or '-'}); see the logs in {run.config.log_dir}"
    )


def _settle_tail(tail: TopicTail, topic: str, quiet: float = 0.5, limit: float = 5.0) -> None:
    """Let the tail read what was just published: until `topic`'s count has not changed
    for `quiet` seconds (at most `limit`)."""
    deadline = time.monotonic() + limit
    count, since = tail.count(topic), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet:
        time.sleep(0.05)
        now = tail.count(topic)
        if now != count:
            count, since = now, time.monotonic()


def _missing(tail: TopicTail, expected: dict[str, str]) -> list[str]:
    seen = tail.commands()
    return sorted(c for c in expected if c not in seen)


def _check_alive(run: _Run) -> None:
    for role in run.roles():
        if role.exit_code() is not None:
            raise BenchError(
                f"{role.name} exited with status {role.exit_code()} mid-phase; see {role.log_path}"
            )


def _latency(run: _Run, tail: TopicTail, rate: int) -> dict[str, Any]:
    config = run.config
    total = max(int(rate * config.latency_seconds), 50)
    spec = WorkloadSpec(run.run_id, f"lat{rate}", total, interleave=min(config.interleave, 16))
    records = list(generate(spec))
    run.say(f"latency @ {rate} ev/s: producing {len(records):,} records")
    sent_at: dict[str, float] = {}
    # The CPU every process kind spends per offered event at this rate: at a steady
    # rate a batch holds a few events, so the per-batch and per-request costs weigh far
    # more than in a backlog drain (docs/PERFORMANCE.md, seventh round).
    assert run.cpu is not None
    began = time.monotonic()
    os.sync()  # the previous phases' writes leave now, not mid-phase (module docstring)
    synced = time.monotonic() - began
    cpu_start = run.cpu.snapshot(_pids(run), at=time.time())
    expected = _load(run, records, f"latency @ {rate} ev/s", rate=rate, sent_at=sent_at)
    _wait_done(run, tail, f"latency @ {rate} ev/s", expected, time.time())
    cpu_end = run.cpu.snapshot(_pids(run), at=time.time())
    seen = tail.commands()
    readable: dict[str, float] = {}
    last: dict[str, str] = {}
    incomplete: set[str] = set()
    for command, record in expected.items():
        if command not in seen:
            incomplete.add(record)
            continue
        if seen[command] >= readable.get(record, 0.0):
            readable[record], last[record] = seen[command], command
    measured = [r for r in readable if r not in incomplete]
    latencies = sorted((readable[r] - sent_at[r]) * 1000 for r in measured)
    figures = _percentiles(latencies)
    window = _slowest_window(measured, readable, sent_at)
    stages = _stages(run, tail, {r: last[r] for r in measured}, sent_at)
    run.say(
        f"latency @ {rate} ev/s: p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms",
        keep=True,
    )
    return {
        "offered_rate": rate,
        "records": len(records),
        "page_cache_sync_s": round(synced, 3),
        "events_measured": len(latencies),
        "events_with_missing_commands": len(incomplete),
        **figures,
        "slowest_1pct_sent_s": window,
        "stages": stages,
        "cpu": cpu_figures(cpu_start, cpu_end, len(records)),
    }


def _slowest_window(
    measured: Sequence[str], readable: Mapping[str, float], sent_at: Mapping[str, float]
) -> list[float] | None:
    """When the slowest 1% of the measured events were sent, in seconds from the
    phase's first send: a narrow window in a long phase is one stall (a commit waiting
    behind the kernel's writeback, docs/PERFORMANCE.md, eighth round), a wide one a
    steady tail."""
    if not measured:
        return None
    first = min(sent_at[r] for r in measured)
    ranked = sorted(measured, key=lambda r: readable[r] - sent_at[r])
    slowest = [sent_at[r] - first for r in ranked[len(ranked) - max(1, len(ranked) // 100) :]]
    return [round(min(slowest), 2), round(max(slowest), 2)]


def _stages(
    run: _Run, tail: TopicTail, last: dict[str, str], sent_at: dict[str, float]
) -> dict[str, Any]:
    """Where each measured event's latency went, from the timestamps the run already
    has: produce call → the controller's transaction began (`outbox.created_at` of the
    event's last command: intake, batching, planning) → the relay produced the command
    (its record's CreateTime: the commit, the relay's wake-up, lease and encoding) → the
    tail read it (the broker's append and acks=all, the fetch). Per stage: p50 and p99
    over all events, and the mean over the slowest 1% of events."""
    with psycopg.connect(run.url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT record_id, extract(epoch FROM created_at)::float8 FROM outbox"
            " WHERE record_id = ANY(%s)",
            (list(last.values()),),
        ).fetchall()
    began: dict[str, float] = {str(row[0]): float(row[1]) for row in rows}
    produced, seen = tail.produced(), tail.commands()
    spans: list[tuple[float, float, float, float]] = []
    for record, command in last.items():
        if command not in began or command not in produced:
            continue
        sent, start, out, read = sent_at[record], began[command], produced[command], seen[command]
        spans.append((read - sent, start - sent, out - start, read - out))
    if not spans:
        return {}
    spans.sort()
    slowest = spans[len(spans) - max(1, len(spans) // 100) :]
    figures: dict[str, Any] = {}
    for index, name in enumerate(LATENCY_STAGES, start=1):
        points = _percentiles(sorted(span[index] * 1000 for span in spans))
        figures[name] = {
            "p50_ms": points["p50_ms"],
            "p99_ms": points["p99_ms"],
            "slowest_1pct_mean_ms": round(
                sum(span[index] for span in slowest) * 1000 / len(slowest), 1
            ),
        }
    return figures


# The stages `_stages` splits an event's latency into, in order, with the readable
# table's label of each.
LATENCY_STAGES: Final = {
    "to_controller_commit": "to the controller's commit",
    "commit_to_relay_produce": "commit to the relay's produce",
    "produce_to_readable": "produce to readable",
}


def _memory(run: _Run, tail: TopicTail, size: int) -> dict[str, Any]:
    stats = WorkloadStats()
    spec = WorkloadSpec(run.run_id, f"mem{size}", size, interleave=run.config.interleave)
    expected = _load(run, generate(spec, stats), f"memory backlog {size:,}")
    drained = _drain(run, tail, f"memory backlog {size:,}", stats.records, expected)
    drained["roles"] = run.stop_roles()
    drained["backlog"] = size
    drained["dead_letters_expected"] = stats.dead_letters
    return drained


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 1)

    return {
        "p50_ms": at(0.50),
        "p95_ms": at(0.95),
        "p99_ms": at(0.99),
        "max_ms": round(values[-1], 1),
    }


def _workload_dict(stats: WorkloadStats) -> dict[str, Any]:
    return {
        "operations": stats.operations,
        "records": stats.records,
        "commands": stats.commands,
        "dead_letters_expected": stats.dead_letters,
        "kinds": dict(stats.kinds),
        "machines": dict(stats.machines),
        "event_types": dict(stats.event_types),
        "outcomes": dict(stats.outcomes),
    }


def _config_dict(config: BenchConfig) -> dict[str, Any]:
    return {
        "events": config.events,
        "partitions": config.partitions,
        "rates": list(config.rates),
        "latency_seconds": config.latency_seconds,
        "memory_backlogs": list(config.memory_backlogs),
        "batch_max_records": config.batch_max_records,
        "members": sorted(set(config.members)),
        "profile": config.profile,
        "profile_native": config.profile_native,
    }


def _mb(value: int) -> float:
    return round(value / (1024 * 1024), 1)


def _downsample(values: list[float], points: int = 60) -> list[float]:
    if len(values) <= points:
        return values
    step = len(values) / points
    return [values[int(i * step)] for i in range(points)]


def _named(url: str, application_name: str) -> str:
    """`url` with its sessions named `application_name` (`pg_stat_activity`)."""
    if url.startswith(("postgresql://", "postgres://")):
        return f"{url}{'&' if '?' in url else '?'}application_name={application_name}"
    return make_conninfo(url, application_name=application_name)


def _port(bootstrap: str) -> int | None:
    """The port of the first bootstrap server, for finding the broker's process."""
    try:
        return int(bootstrap.split(",", 1)[0].rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def _delete_topics(bootstrap: str, topics: TopicNames) -> None:
    delete_topics(bootstrap, [*topics.all(), _baseline_topic(topics)])


def _baseline_topic(topics: TopicNames) -> str:
    return f"{topics.events}.baseline-out"


@cache
def _roster_file() -> Path:
    """The bench producers' roster (`ops.bench.workload.bench_roster`) in a file of this
    process's own, for the controller's `RECOVERY_CONTROLLER_ROSTER_PATH`."""
    folder = Path(tempfile.mkdtemp(prefix="recovery-bench-roster-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "roster.json"
    path.write_text(bench_roster().model_dump_json(), encoding="utf-8")
    return path
