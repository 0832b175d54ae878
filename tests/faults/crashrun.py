"""The crash run: a long stream under every fault at once, then the history checker.

    python -m tests.faults.crashrun --events 100000 --kills 50 [--seed N] [--json]

starts a Kafka broker and a PostgreSQL failover pair of its own (`ops.postgres_ha`:
pg_auto_failover's monitor, a primary and its synchronous standby; `--single-server`:
one server instead; in a folder under the stack's `tests/`, removed afterwards; the
session's shared services are never touched), the run's topics and ledger, one
controller and one relay, and a `NetProxy` per database node between the controller and
the database (the controller's multi-host URL names the proxies' ports; the relay
connects directly). A feeder produces the benchmark workload at a steady rate while, at
random moments drawn from a seeded RNG:

- the controller and the relay are SIGKILLed (`--kills` in all: each roll takes the
  relay, the controller or both) and restarted at once, as a supervisor would; a roll
  that takes the controller waits until its current one has been assigned partitions;
- the broker is killed with SIGKILL and started again on the same folder and ports;
- PostgreSQL is shut down immediately (SIGQUIT to the primary's postmaster: no
  checkpoint, crash recovery at the next start) and started again on the same port (on
  the pair, by its keeper);
- on the pair, the primary is killed with SIGKILL, keeper, server and backends at once;
  the standby is promoted, and the killed node is started again to rejoin as the
  standby;
- the proxy delays every chunk between controller and database for a while, then
  black-holes the link for a while (bytes held, new connections parked), then refuses
  it (open connections reset, new ones reset on accept).

The controllers run under `TIMERS_POLICY`: every operation left waiting stalls after
8 s and reaches its deadline after 30 s, so timers fall due, fire and are decided
throughout, across every fault; the drain waits until none is owed a decision, and the
checker finds each fired once and none lost (`checker.check_timers`).

The five other faults happen once each, one after another, each in its own slice of
the feeding time; kills land anywhere, during them too. A role that exits by itself is
an anomaly (and is restarted), except a start that gave up on an unreachable database,
which is counted. Then the stream is drained, the roles are stopped, and `checker.check_run`
checks the history; the command prints the fault counts, the checker's counts and every
anomaly, and exits 0 only when there is none. `tests/faults/test_crashrun.py` runs a
CI-sized version; docs/faults.md has the full run's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

import psycopg

from ledger import ensure_database, migrate_database
from ops.kafka import KafkaBroker, KafkaServiceError, start_kafka
from ops.postgres import PostgresServer, start_postgres
from ops.postgres_ha import HaPostgres, start_postgres_ha
from ops.process import pid_alive
from tests.faults.checker import CheckReport, check_run
from tests.faults.netproxy import NetProxy, ProxyStats
from tests.faults.processes import FaultError, RoleProcess, log_tail, wait_until
from tests.faults.stream import TIMERS_POLICY, FaultRun, Feeder, drain, workload
from tests.faults.verify import progress
from tests.support.db import ensure_login_roles
from tests.support.kafka import TopicFactory
from tests.support.keys import ensure_controller_key
from tests.support.services import name_admin, service_root

__all__ = ["CrashPlan", "CrashResult", "crash_run", "main"]

_DATABASE: Final = "recovery"
_PRODUCER: Final = {"delivery.timeout.ms": 600_000}  # rides out the broker's restart
# What a role's start prints when it gives up on an unreachable ledger.
_UNREACHABLE: Final = "cannot reach the server"
# Seconds a fault on the failover pair waits for it to name one primary with its
# synchronous standby before striking (a failover the last fault began ends first).
_PAIR_SETTLES: Final = 120.0
Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CrashPlan:
    """What one crash run does (module docstring); seconds are wall clock."""

    events: int = 100_000
    kills: int = 50
    seed: int = 1
    rate: float = 300.0  # records/s produced
    partitions: int = 4
    broker_down: float = 3.0
    database_down: float = 4.0
    delay: float = 0.05  # seconds added to every chunk during the delay period
    delay_period: float = 15.0
    blackhole_period: float = 8.0
    refuse_period: float = 6.0
    drain_timeout: float = 1800.0
    # The ledger on a failover pair, whose primary is killed once (else one server).
    primary_kill: bool = True

    @property
    def feeding(self) -> float:
        """How long the input flows: the span the faults are spread over."""
        return self.events / self.rate


@dataclass(slots=True)
class Faults:
    """What was done to the run, counted."""

    kills: dict[str, int] = field(default_factory=lambda: {"controller": 0, "relay": 0})
    starts: dict[str, int] = field(default_factory=lambda: {"controller": 0, "relay": 0})
    broker_kills: int = 0
    broker_restarts: int = 0
    database_restarts: int = 0
    primary_kills: int = 0
    rejoins: int = 0
    # Each fault's name -> seconds from its start to the start of its end (a restart).
    lasted: dict[str, float] = field(default_factory=dict)
    proxy_connections: int = 0
    proxy_resets: int = 0
    start_failures: dict[str, int] = field(default_factory=lambda: {"controller": 0, "relay": 0})
    exited_by_themselves: list[str] = field(default_factory=list)


@dataclass(slots=True)
class CrashResult:
    """A finished crash run: its plan, what was done, and the checker's report."""

    plan: CrashPlan
    faults: Faults
    report: CheckReport
    seconds: float
    log_dir: Path

    @property
    def ok(self) -> bool:
        """Whether the checker found no anomaly and no role exited by itself."""
        return self.report.ok and not self.faults.exited_by_themselves

    def to_json(self) -> dict[str, Any]:
        """Everything as JSON-ready data."""
        return {
            "ok": self.ok,
            "plan": asdict(self.plan),
            "faults": asdict(self.faults),
            "counts": self.report.counts,
            "anomalies": [
                {"kind": a.kind, "operation": a.operation, "detail": a.detail}
                for a in self.report.anomalies
            ],
            "seconds": round(self.seconds, 1),
            "log_dir": str(self.log_dir),
        }

    def summary(self) -> str:
        """A readable table of the faults, the counts and every anomaly."""
        f = self.faults
        rows = [
            ("SIGKILLs of the controller", f.kills["controller"]),
            ("SIGKILLs of the relay", f.kills["relay"]),
            ("controller starts", f.starts["controller"]),
            ("relay starts", f.starts["relay"]),
            ("broker kill -9 / restarts", f"{f.broker_kills} / {f.broker_restarts}"),
            ("PostgreSQL restarts", f.database_restarts),
            ("primary kill -9 / rejoins", f"{f.primary_kills} / {f.rejoins}"),
            *((f"{name} (s)", f"{seconds:.1f}") for name, seconds in f.lasted.items()),
            ("proxy delay per chunk (ms)", f"{self.plan.delay * 1000:.0f}"),
            ("proxy connections / resets", f"{f.proxy_connections} / {f.proxy_resets}"),
            ("starts refused, database down", sum(f.start_failures.values())),
            ("roles that exited by themselves", len(f.exited_by_themselves)),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"crash run, seed {self.plan.seed}: {self.seconds:.0f} s"]
        lines += [f"  {k:<{width}}  {v!s:>10}" for k, v in rows]
        lines += [f"    {x}" for x in f.exited_by_themselves]
        lines += ["checker:", self.report.summary()]
        lines.append("OK: no anomaly" if self.ok else "FAILED: anomalies above")
        return "\n".join(lines)


# -- services ----------------------------------------------------------------------------


@dataclass(slots=True)
class Services:
    """The run's own broker and server (or failover pair): the handles of their current
    starts."""

    broker: KafkaBroker
    postgres: PostgresServer | HaPostgres


class Proxies:
    """One `NetProxy` per database node, faulted together: the controller's multi-host
    URL goes through all of them."""

    def __init__(self, proxies: list[NetProxy]) -> None:
        self.proxies = proxies

    @property
    def ports(self) -> list[int]:
        """The proxies' listening ports, in the nodes' order."""
        return [proxy.port for proxy in self.proxies]

    @property
    def mode(self) -> str:
        """What the proxies do now (all do the same)."""
        return self.proxies[0].mode

    def delay(self, seconds: float) -> None:
        """Delay every chunk through every proxy."""
        for proxy in self.proxies:
            proxy.delay(seconds)

    def partition(self, mode: Literal["blackhole", "refuse"]) -> None:
        """Partition every proxy's link."""
        for proxy in self.proxies:
            proxy.partition(mode)

    def heal(self) -> None:
        """Heal every proxy's link."""
        for proxy in self.proxies:
            proxy.heal()

    def stats(self) -> ProxyStats:
        """The proxies' counts, summed."""
        all_stats = [proxy.stats() for proxy in self.proxies]
        return ProxyStats(
            sum(x.accepted for x in all_stats),
            sum(x.reset for x in all_stats),
            sum(x.bytes_forwarded for x in all_stats),
        )


@contextmanager
def _as_admin_of(broker: KafkaBroker) -> Iterator[None]:
    """Every client of this process and its children connects as `broker`'s admin."""
    assert broker.security is not None
    restore = name_admin(broker.security)
    try:
        yield
    finally:
        restore()


def _restart_broker(data_dir: Path, say: Say) -> KafkaBroker:
    """Start the broker on its folder again, on the ports it had (retrying while the
    killed process's port is not yet free)."""
    ports = json.loads((data_dir / "ports.json").read_text())
    deadline = time.monotonic() + 60
    while True:
        try:
            return start_kafka(
                data_dir, bootstrap_port=ports["bootstrap"], controller_port=ports["controller"]
            )
        except KafkaServiceError as exc:  # a port still bound by the dying JVM: try again
            if time.monotonic() > deadline:
                raise
            say(f"broker restart failed ({str(exc).splitlines()[0]}); retrying")
            time.sleep(2)


def _crash_postgres(server: PostgresServer | HaPostgres) -> None:
    """Immediate shutdown: SIGQUIT to the (primary's) postmaster (no checkpoint; the next
    start runs crash recovery), and wait until it is gone."""
    if isinstance(server, HaPostgres):
        primary = server.wait_synchronous(_PAIR_SETTLES)
        pidfile = server.folder(primary) / "data" / "postmaster.pid"
        postmaster = int(pidfile.read_text().split()[0])
        os.kill(postmaster, signal.SIGQUIT)
        wait_until(lambda: not pid_alive(postmaster), 30, f"PostgreSQL pid {postmaster} to exit")
        return
    pid = server.pid
    if pid is not None:
        os.kill(pid, signal.SIGQUIT)
    wait_until(lambda: not server.is_running(), 30, f"PostgreSQL pid {pid} to exit")


# -- the run -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fault:
    """A fault planned `at` seconds after feeding starts: `on`, then `off` `duration`
    seconds after `on` actually happened."""

    at: float
    name: str
    on: Callable[[], None]
    duration: float
    off_name: str
    off: Callable[[], None]


class _Sequence:
    """Runs faults one after another, never two at once: each starts at its planned time
    or 2 s after the previous one ended, whichever is later, and lasts its full
    duration; an `off` (a restart that takes a while) runs on a thread, so the kills go
    on meanwhile. `done` once the last has ended; a failed `off` is raised by `step`."""

    def __init__(self, faults: list[_Fault], say: Say) -> None:
        self.pending = sorted(faults, key=lambda f: f.at)
        self.say = say
        self.active: tuple[_Fault, float, float] | None = None  # fault, on at, off at
        self.ending: threading.Thread | None = None
        self.error: BaseException | None = None
        self.free_at = 0.0
        self.lasted: dict[str, float] = {}  # fault name -> seconds it actually lasted

    @property
    def done(self) -> bool:
        """Whether every fault has started and ended."""
        return not self.pending and self.active is None and not self._ending()

    def _ending(self) -> bool:
        return self.ending is not None and self.ending.is_alive()

    def step(self, elapsed: float) -> None:
        """Start or end what is due `elapsed` seconds after feeding started."""
        if self.error is not None:
            raise self.error
        if self._ending():
            return
        if self.active is not None:
            fault, on_at, off_at = self.active
            if elapsed >= off_at:
                self.active = None
                self.say(f"fault: {fault.off_name}")
                self.ending = threading.Thread(target=self._end, args=(fault, on_at, elapsed))
                self.ending.start()
            return
        if self.pending and elapsed >= max(self.pending[0].at, self.free_at):
            fault = self.pending.pop(0)
            self.say(f"fault: {fault.name}")
            fault.on()
            self.active = (fault, elapsed, elapsed + fault.duration)

    def _end(self, fault: _Fault, on_at: float, off_at: float) -> None:
        try:
            fault.off()
        except BaseException as exc:
            self.error = exc
        self.lasted[fault.name] = off_at - on_at
        self.free_at = off_at + 2.0


class _Run:
    """The running roles, services and proxy of one crash run, and its fault schedule."""

    def __init__(
        self,
        plan: CrashPlan,
        run: FaultRun,
        services: Services,
        proxy: Proxies,
        say: Say,
    ) -> None:
        self.plan, self.run, self.services = plan, run, services
        self.proxy, self.say = proxy, say
        self.rng = random.Random(plan.seed)
        self.faults = Faults()
        # The server's URL (its password file and, on a pair, its
        # target_session_attrs included), through the proxies' ports.
        direct = urlsplit(services.postgres.url_for(_DATABASE))
        hosts = ",".join(f"127.0.0.1:{port}" for port in proxy.ports)
        self.controller_url = urlunsplit(
            direct._replace(netloc=f"{services.postgres.user}@{hosts}")
        )
        self._killed: str | None = None  # the pair's node killed last
        self._targets: list[str] | None = None  # a kill roll waiting for its moment
        self.roles: dict[str, RoleProcess] = {}
        for role in ("controller", "relay"):
            self.roles[role] = self._start(role)
        self.schedule = self._schedule()

    def _start(self, role: str) -> RoleProcess:
        self.faults.starts[role] += 1
        env = {"RECOVERY_DATABASE_URL": self.controller_url} if role == "controller" else {}
        return self.run.start(role, env=env)

    def _schedule(self) -> _Sequence:
        """The faults, each planned in its own slice of the feeding time."""
        t, plan, proxy = self.plan.feeding, self.plan, self.proxy

        def at(low: float, high: float) -> float:
            return self.rng.uniform(low * t, high * t)

        pair: list[_Fault] = []
        if isinstance(self.services.postgres, HaPostgres):
            pair.append(
                _Fault(at(0.42, 0.48), "PostgreSQL primary kill -9", self._kill_primary,
                       plan.database_down, "killed node restart (rejoins as the standby)",
                       self._rejoin)
            )  # fmt: skip
        return _Sequence(
            [
                *pair,
                _Fault(at(0.08, 0.2), "broker kill -9", self._kill_broker,
                       plan.broker_down, "broker restart", self._restart_broker),
                _Fault(at(0.3, 0.4), "PostgreSQL immediate shutdown", self._stop_database,
                       plan.database_down, "PostgreSQL start", self._start_database),
                _Fault(at(0.5, 0.55), "proxy delay on", lambda: proxy.delay(plan.delay),
                       plan.delay_period, "proxy delay off", proxy.heal),
                _Fault(at(0.65, 0.7), "proxy black hole", lambda: proxy.partition("blackhole"),
                       plan.blackhole_period, "proxy heal", proxy.heal),
                _Fault(at(0.8, 0.85), "proxy refuses", lambda: proxy.partition("refuse"),
                       plan.refuse_period, "proxy heal", proxy.heal),
            ],
            self.say,
        )  # fmt: skip

    def _kill_broker(self) -> None:
        broker = self.services.broker
        os.kill(broker.pid, signal.SIGKILL)
        if broker.process is not None:
            broker.process.wait(30)
        self.faults.broker_kills += 1

    def _restart_broker(self) -> None:
        self.services.broker = _restart_broker(self.services.broker.data_dir, self.say)
        self.faults.broker_restarts += 1

    def _stop_database(self) -> None:
        _crash_postgres(self.services.postgres)

    def _start_database(self) -> None:
        old = self.services.postgres
        if isinstance(old, HaPostgres):
            # Its keeper starts it again (or, if the monitor gave up on it first, the
            # standby took over and it rejoins): wait for the pair to be whole.
            old.wait_synchronous(180)
        else:
            self.services.postgres = start_postgres(old.root, port=old.port)
        self.faults.database_restarts += 1

    def _kill_primary(self) -> None:
        pair = self.services.postgres
        assert isinstance(pair, HaPostgres)
        # The monitor may still be failing over after the last fault (it can mark a
        # restarted primary unhealthy after the pair looked whole): kill the primary
        # it settles on.
        self._killed = pair.wait_synchronous(_PAIR_SETTLES)
        pair.kill(self._killed)
        self.faults.primary_kills += 1

    def _rejoin(self) -> None:
        pair = self.services.postgres
        assert isinstance(pair, HaPostgres)
        assert self._killed is not None
        pair.start(self._killed)
        self.say(f"primary now {pair.wait_synchronous(180)}, {self._killed} its standby")
        self.faults.rejoins += 1

    # -- kills ---------------------------------------------------------------------------

    def kill_interval(self) -> float:
        """Seconds until the next kill roll: spread so the kills end near the end of
        the feeding time (a roll kills 1.2 roles on average)."""
        mean = 0.9 * self.plan.feeding / max(1.0, self.plan.kills / 1.2)
        return self.rng.uniform(0.2 * mean, 1.8 * mean)

    def kill_roll(self) -> str | None:
        """SIGKILL the relay (50 %), the controller (30 %) or both (20 %), restarting
        each at once. A roll that takes a controller not yet assigned partitions waits
        (None: nothing killed; the same targets next call), so that kills land across a
        member's whole life rather than all before it joins."""
        if self._targets is None:
            roll = self.rng.random()
            self._targets = (
                ["relay"]
                if roll < 0.5
                else ["controller"]
                if roll < 0.8
                else ["controller", "relay"]
            )
        targets = self._targets
        if "controller" in targets and not self.roles["controller"].assigned:
            return None
        self._targets = None
        for role in targets:
            self.roles[role].kill()
            self.faults.kills[role] += 1
            self.roles[role] = self._start(role)
        return "+".join(targets)

    @property
    def kills(self) -> int:
        """SIGKILLs of roles so far."""
        return sum(self.faults.kills.values())

    def supervise(self) -> None:
        """Restart a role that exited by itself, a second later, as a supervisor would.
        A start that gave up because the database was unreachable is what the roles
        document (docs/controller.md: exit 1 when it could not start) and is counted;
        any other exit is an anomaly."""
        for role, process in self.roles.items():
            status = process.exit_code()
            if status is None:
                continue
            tail = log_tail(process.log_path, 8)
            if _UNREACHABLE in tail and not process.assigned:
                self.faults.start_failures[role] += 1
                self.say(f"{process} could not start (database unreachable); restarting")
            else:
                note = f"{process} exited with status {status}:\n{tail}"
                self.say(f"ANOMALY: {note}")
                self.faults.exited_by_themselves.append(note)
            time.sleep(1)
            self.roles[role] = self._start(role)

    def close(self) -> None:
        """Note the proxy's counts."""
        self.faults.lasted = dict(self.schedule.lasted)
        stats = self.proxy.stats()
        self.faults.proxy_connections, self.faults.proxy_resets = stats.accepted, stats.reset


def _progress(state: _Run) -> str:
    try:
        return str(progress(state.run.database_url, state.run.group, state.run.topics.events))
    except psycopg.OperationalError as exc:  # the server is down right now
        return f"database unreachable ({str(exc).strip().splitlines()[-1]})"


def _inject(state: _Run, feeder: Feeder) -> None:
    """Run the schedule and the kill rolls until the input is produced, every kill is
    done and every scheduled fault happened; print progress every 5 s."""
    plan, say = state.plan, state.say
    started = time.monotonic()
    next_kill = started + state.kill_interval()
    last_print = 0.0
    faults = state.schedule
    give_up = started + 3 * plan.feeding + 600
    while not feeder.done or state.kills < plan.kills or not faults.done:
        now = time.monotonic()
        if now > give_up:
            raise FaultError(
                f"after {now - started:.0f}s: {state.kills}/{plan.kills} kills, faults "
                f"{'done' if faults.done else 'pending'}, {feeder.sent:,} produced"
            )
        faults.step(now - started)
        if state.kills < plan.kills and now >= next_kill:
            what = state.kill_roll()
            if what is not None:
                say(f"kill {state.kills}/{plan.kills} ({what})")
                next_kill = now + state.kill_interval()
        state.supervise()
        if now - last_print > 5:
            last_print = now
            say(
                f"{now - started:5.0f}s {feeder.sent:,}/{len(feeder.records):,} produced; "
                f"{_progress(state)}; kills {state.kills}; proxy {state.proxy.mode}"
            )
        time.sleep(0.1)


def _prepare_database(server: PostgresServer | HaPostgres) -> str:
    ensure_database(server.url, _DATABASE)  # a pair made it already (pg_autoctl --dbname)
    url = server.url_for(_DATABASE)
    migrate_database(url)
    ensure_login_roles(server, url)
    return url


def crash_run(plan: CrashPlan, log_dir: Path, say: Say = print) -> CrashResult:
    """One crash run (module docstring) with its role logs in `log_dir`."""
    ensure_controller_key()
    started = time.monotonic()
    root = service_root("crashrun")
    database = (
        start_postgres_ha(root / "postgres")
        if plan.primary_kill
        else start_postgres(root / "postgres")
    )
    services = Services(start_kafka(root / "kafka"), database)
    ports = database.node_ports if isinstance(database, HaPostgres) else (database.port,)
    proxies = Proxies([NetProxy("127.0.0.1", port) for port in ports])
    try:
        with _as_admin_of(services.broker), contextlib.ExitStack() as stack:
            for one in proxies.proxies:
                stack.enter_context(one)
            return _crash_run(plan, log_dir, say, services, proxies, started)
    finally:
        services.broker.stop()  # the start that runs now (a restart has a new pid)
        services.postgres.stop()
        shutil.rmtree(root, ignore_errors=True)


def _crash_run(
    plan: CrashPlan,
    log_dir: Path,
    say: Say,
    services: Services,
    proxy: Proxies,
    started: float,
) -> CrashResult:
    url = _prepare_database(services.postgres)
    records, stats = workload(plan.events, plan.seed)
    say(
        f"seed {plan.seed}: {stats.records:,} records, {stats.operations:,} operations, "
        f"{stats.commands:,} commands expected; {plan.kills} kills over {plan.feeding:.0f}s"
    )
    bootstrap = services.broker.bootstrap
    topics = TopicFactory(bootstrap, "crashrun")
    run = FaultRun(
        bootstrap, url, topics, log_dir, partitions=plan.partitions, policy=TIMERS_POLICY
    )
    del topics  # its admin client would log every broker disconnect; the folder goes
    state = _Run(plan, run, services, proxy, say)
    try:
        state.roles["controller"].wait_assigned(120)
        feeder = Feeder(run, records, plan.rate, say, producer_config=_PRODUCER).start()
        _inject(state, feeder)
        produced = feeder.join(600)
        say(f"{produced:,} records produced; draining")
        drain(run, produced, list(state.roles.values()), plan.drain_timeout, say)
        for process in state.roles.values():
            process.terminate()
        stopped = datetime.now(UTC)
        state.close()
    finally:
        run.close()
    say("checking the history")
    report = check_run(
        bootstrap,
        url,
        run.topics,
        (r.record_id for r in records),
        policy=TIMERS_POLICY,
        stopped_at=stopped,
    )
    return CrashResult(plan, state.faults, report, time.monotonic() - started, log_dir)


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring); exit 0 only when the checker found no anomaly."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.crashrun", description=__doc__.splitlines()[0]
    )
    default = CrashPlan()
    parser.add_argument("--events", type=int, default=default.events)
    parser.add_argument("--kills", type=int, default=default.kills)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--rate", type=float, default=default.rate, help="records/s produced")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="role logs (default: a new folder)"
    )
    parser.add_argument(
        "--single-server",
        action="store_true",
        help="one PostgreSQL server instead of a failover pair (no primary kill)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    # The feeder's client logs every failed connect while the broker is down (as
    # ERROR): the faults are meant, and the progress lines say what happens.
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("librdkafka").setLevel(logging.CRITICAL)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    plan = CrashPlan(
        events=args.events,
        kills=args.kills,
        seed=seed,
        rate=args.rate,
        primary_kill=not args.single_server,
    )
    log_dir = args.log_dir or Path(service_root("crashrun-logs"))
    log_dir.mkdir(parents=True, exist_ok=True)

    def say(message: str) -> None:
        print(f"[crashrun {time.strftime('%X')}] {message}", file=sys.stderr, flush=True)

    say(f"role logs in {log_dir}; rerun with --seed {seed}")
    result = crash_run(plan, log_dir, say)
    print(json.dumps(result.to_json(), indent=2) if args.json else result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
