"""One fault run's services, topics, role processes and input stream.

`FaultRun` names the run's own topics (created through the test's `topic_factory`, so
they are deleted afterwards) and the environment every role process gets: the test's
broker and database, the run's topic names, the benchmark policy (which trusts the
catalogue verifiers and the test approver the workload signs with; a run that fires
timers passes `TIMERS_POLICY`, the same with time made short), a consumer group of the
run's own, and short timeouts so that a killed member leaves the group quickly (6 s,
the broker's minimum session timeout).

The workload is `ops.bench.workload`'s: realistic operations of every catalogue machine,
played through the decision core so that every result answers a command the controller
really issues, with duplicates, forged approvals and a few bad records mixed in.
`Feeder` produces such a stream from a thread at a steady pace, so that faults happen
while records flow.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from ops.bench.workload import BENCH_POLICY, BenchRecord, WorkloadSpec, WorkloadStats, generate
from producers import EventPublisher
from schemas import TopicNames
from tests.faults.processes import RoleProcess, log_tail, wait_until
from tests.faults.verify import Progress, activity, end_offsets, progress
from tests.support.kafka import TopicFactory
from tests.support.producers import signers, write_roster

__all__ = ["SESSION_TIMEOUT_MS", "TIMERS_POLICY", "FaultRun", "Feeder", "workload"]

# The broker's default group.min.session.timeout.ms: the fastest a SIGKILLed member's
# partitions can move to another member.
SESSION_TIMEOUT_MS: Final = 6000
# The bench policy with stall bounds, deadlines and a timeout that fire during a run.
TIMERS_POLICY: Final = Path(__file__).resolve().parent / "timers_policy.yaml"
_STREAMS: Final = ("events", "commands", "evidence", "audit", "dlq")


def workload(
    events: int, seed: int, *, interleave: int = 64, bad_rate: float = 0.01
) -> tuple[list[BenchRecord], WorkloadStats]:
    """About `events` records of the benchmark workload (`ops.bench.workload`), generated
    deterministically from `seed`, and what they hold."""
    stats = WorkloadStats()
    spec = WorkloadSpec(
        run_id=f"f{seed}", phase="x", events=events, seed=seed, interleave=interleave,
        bad_rate=bad_rate,
    )  # fmt: skip
    return list(generate(spec, stats)), stats


class FaultRun:
    """The topics, environment and processes of one fault test (module docstring)."""

    def __init__(
        self,
        bootstrap: str,
        database_url: str,
        topic_factory: TopicFactory,
        log_dir: Path,
        *,
        partitions: int = 4,
        extra_env: Mapping[str, str] | None = None,
        policy: Path = BENCH_POLICY,
    ) -> None:
        self.bootstrap = bootstrap
        self.policy = policy
        self.database_url = database_url
        self.log_dir = log_dir
        self.partitions = partitions
        self.group = f"faults-{uuid.uuid4().hex[:8]}"
        self.topics = TopicNames(**{s: topic_factory(partitions) for s in _STREAMS})
        self.extra_env = dict(extra_env or {})
        self.processes: list[RoleProcess] = []
        self._members = 0

    def env(self) -> dict[str, str]:
        """The environment of every role process of this run."""
        env = {
            "RECOVERY_KAFKA_BOOTSTRAP": self.bootstrap,
            "RECOVERY_DATABASE_URL": self.database_url,
            "RECOVERY_CONTROLLER_GROUP_ID": self.group,
            "RECOVERY_CONTROLLER_POLICY_PATH": str(self.policy),
            # The bench policy is the demo's, with a public-name approver key.
            "RECOVERY_DEMO_MODE": "1",
            "RECOVERY_CONTROLLER_ROSTER_PATH": str(write_roster(self.log_dir)),
            "RECOVERY_CONTROLLER_BATCH_MAX_RECORDS": "500",
            "RECOVERY_CONTROLLER_BATCH_MAX_WAIT_MS": "100",
            "RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
            "RECOVERY_CONTROLLER_MAX_POLL_INTERVAL_MS": "60000",
            "RECOVERY_CONTROLLER_BACKOFF_INITIAL_MS": "50",
            "RECOVERY_CONTROLLER_BACKOFF_MAX_MS": "1000",
        }
        for stream in _STREAMS:
            env[f"RECOVERY_TOPIC_{stream.upper()}"] = getattr(self.topics, stream)
        return {**env, **self.extra_env}

    def start(
        self,
        role: str,
        *,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RoleProcess:
        """Start a controller or relay process of this run (a new member each time);
        `argv` and `env` replace its command line and add to its environment."""
        self._members += 1
        child = {**self.env(), **(env or {})}
        if role == "controller":
            child["RECOVERY_CONTROLLER_INSTANCE_ID"] = f"{self.group}-c{self._members}"
        log_path = self.log_dir / f"{role}-{self._members}.log"
        process = RoleProcess(role, child, log_path, argv=argv)
        self.processes.append(process)
        return process

    def check_alive(self, *processes: RoleProcess) -> None:
        """Raise if any of `processes` exited on its own (nobody signalled it)."""
        for process in processes:
            status = process.exit_code()
            if status is not None:
                raise AssertionError(
                    f"{process} exited by itself with status {status}:\n"
                    f"{log_tail(process.log_path)}"
                )

    def close(self) -> None:
        """Kill every process this run started that still runs."""
        for process in self.processes:
            process.ensure_gone()


class Feeder:
    """Produces `records` to the events topic from a thread, about `rate` per second,
    with the client library's idempotent producer (so a key's records keep their order)."""

    def __init__(
        self,
        run: FaultRun,
        records: Sequence[BenchRecord],
        rate: float,
        say: Callable[[str], None] = print,
        *,
        producer_config: Mapping[str, Any] | None = None,
    ) -> None:
        # `producer_config`: client settings over the publisher's defaults (a run that
        # kills its broker waits longer for a delivery than the default 30 s).
        self.records = records
        self.rate = rate
        self.producer_config = dict(producer_config or {})
        self.sent = 0
        self.error: BaseException | None = None
        self._run = run
        self._say = say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="feeder", daemon=True)

    def start(self) -> Feeder:
        """Begin producing; returns self."""
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        """Whether every record was produced (and flushed)."""
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Produce no record after the one under way (`join` then waits for the
        deliveries): a run whose faults are over needs no more input."""
        self._stop.set()

    def join(self, timeout: float) -> int:
        """Wait for the last record's delivery; the number produced. Raises if producing
        failed or took longer than `timeout` seconds."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(
                f"producing {len(self.records)} records took over {timeout:.0f}s ({self.sent} sent)"
            )
        if self.error is not None:
            raise AssertionError(f"producing the input failed: {self.error!r}")
        return self.sent

    def _produce(self) -> None:
        topic = self._run.topics.events
        started = time.monotonic()
        try:
            with EventPublisher(
                self._run.bootstrap,
                signer=signers(),
                topics=self._run.topics,
                producer_config=self.producer_config,
            ) as publisher:
                for n, record in enumerate(self.records, start=1):
                    delay = started + n / self.rate - time.monotonic()
                    if self._stop.wait(max(delay, 0.0)):
                        break
                    publisher.send(
                        topic,
                        key=record.key,
                        value=record.value,
                        record_id=record.record_id,
                        content_type=record.content_type,
                        fingerprint=record.fingerprint,
                        producer=record.producer,
                    )
                    self.sent = n
                    if n % 5000 == 0:
                        self._say(f"feeder: {n:,}/{len(self.records):,} records produced")
        except BaseException as exc:  # reported by join()
            self.error = exc


def drain(
    run: FaultRun,
    produced: int,
    running: Sequence[RoleProcess],
    timeout: float,
    say: Callable[[str], None] = print,
) -> None:
    """Wait until the run is drained, printing progress every 5 s (and the database's
    busy sessions when nothing moved for 10 s): every outbox row is published, no timer
    fires within `verify.TIMER_HORIZON` or is owed a decision, and the stored offsets
    reach the events topic's end, read after a look at the ledger that found nothing
    unpublished and confirmed by a second that found no new row. So every record on the
    topic, rows a killed relay published again included, was consumed, and none comes
    after. Raises if a process of `running` exits by itself."""
    last_print = 0.0
    moved_at = time.monotonic()
    before = progress(run.database_url, run.group, run.topics.events)

    def settled(p: Progress) -> bool:
        return (
            p.consumed >= produced + p.own_events
            and p.unpublished == 0
            and p.timers_owed == 0
            and p.timers_soon == 0
        )

    def done() -> bool:
        nonlocal last_print, moved_at, before
        run.check_alive(*running)
        now = progress(run.database_url, run.group, run.topics.events)
        if now != before:
            moved_at, before = time.monotonic(), now
        if time.monotonic() - last_print > 5:
            last_print = time.monotonic()
            say(f"draining: {now}")
            if time.monotonic() - moved_at > 10:
                say(f"no progress for 10s; busy sessions:\n{activity(run.database_url)}")
        if not settled(now):
            return False
        # Offsets count relayed duplicates, which a record count does not.
        end = end_offsets(run.bootstrap, run.topics.events)
        again = progress(run.database_url, run.group, run.topics.events)
        if not (settled(again) and again.outbox == now.outbox and again.consumed >= end):
            return False
        relayed = end - produced - again.own_events
        say(f"drained: {again}; {relayed:,} records on the events topic relayed again")
        return True

    wait_until(
        done,
        timeout,
        f"all {produced:,} records consumed and every outbox row published",
        every=0.5,
        detail=lambda: str(progress(run.database_url, run.group, run.topics.events)),
    )
