"""A capability worker survives a crash: the example of docs/capability-worker.md.

A worker reads `recovery.commands` in its own consumer group, executes each command of
the capabilities it serves at most once by command id (its execution store claims the
id on disk before the handler runs), and reports the result as an event whose
causation is the command id. This example shows what that buys when the worker dies:

1. A procurement tool reports TOOL_TIMEOUT, declaring its idempotency key.
2. Worker 1 answers the verify command "not applied"; the controller commands a retry.
3. Worker 1 claims the retry in its store, creates the request, then crashes before
   recording or reporting it. Its consumer never commits the offset of that command.
4. Worker 2 starts in the same group, on the same store (the restarted process), and
   gets the command again. The store says it was in flight: worker 2 does not create
   the request a second time and reports the retry's outcome as unknown
   (`RETRY_FAILED`, `outcome-unknown:<command id>`). The machine does not retry on an
   unknown outcome: it verifies again; worker 2 finds the request and the controller
   completes the operation.

The procurement system is an in-memory stand-in; the worker's store is the real one
(`producers.ExecutionStore`, SQLite in a temporary folder); the crash is simulated by
raising an exception that is not an `Exception` out of the handler, which leaves
`CapabilityWorker.run` without committing, as a kill would. Everything else is the real
system: Kafka, the controller and relay started by `recoveryctl run`, PostgreSQL.

What the controller made of each event comes from its signed verdicts on the audit
topic (`RecoveryClient.verdicts`): neither the tool nor the worker reads the database.

Run it against the local stack (docs/capability-worker.md, "Run the example"), as the
stack's worker principal:

    eval "$(recoveryctl stack env worker)"
    python docs/examples/capability_worker.py

The broker comes from `--bootstrap`, else RECOVERY_KAFKA_BOOTSTRAP, the keys from
`--keys` (default: the stack's keys folder), the roster from RECOVERY_ROSTER_FILE. Exit
status 0 only if every step above happened; 1 otherwise, 2 when no broker is named.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from example_keys import AGENT, TOOL, WORKER, default_keys, signer

from machines import DeclaredFacts, Event, EvidencePayload, Lineage, Scope
from producers import (
    ActionResult,
    CapabilityWorker,
    EventPublisher,
    EventVerdict,
    ExecutionStore,
    Handler,
    ProducersError,
    RecoveryClient,
    VerdictReader,
)
from schemas import ENV_KAFKA_BOOTSTRAP, CapabilityCommand, ServiceSettings

# The workers' own consumer group: a worker principal may use groups recovery-worker*.
GROUP: Final = "recovery-worker-guide-coupa"
MACHINE_NAME: Final = "procurement-request"
MACHINE_VERSION: Final = "1.0.0"
VERIFY: Final = "procurement.verify-request"
CREATE: Final = "procurement.create-request"
EXPECTED_PATH: Final = ("failure-reported", "verifying", "retrying", "verifying", "completed")


def say(text: str) -> None:
    """One step of the story on stdout (worker threads print too)."""
    print(text, flush=True)


class SimulatedCrash(BaseException):
    """Raised by a handler to stand for the process dying: not an `Exception`, so the
    worker neither reports a failure nor commits; `run` unwinds and closes its consumer."""


class Procurement:
    """The downstream system: requests by idempotency key, and a status lookup."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, str] = {}
        self.created = 0

    def create(self, key: str) -> str:
        """Create the request under `key`, or return the one already there."""
        with self._lock:
            if key not in self.requests:
                self.created += 1
                self.requests[key] = f"REQ-{self.created:05d}"
            return self.requests[key]

    def lookup(self, key: str) -> str | None:
        """The request created under `key`, if any."""
        with self._lock:
            return self.requests.get(key)


class Handlers:
    """The worker's handlers; `deliveries` counts each command id the retry handler was
    called with (the worker's store must keep it at one)."""

    def __init__(self, system: Procurement, operation_id: str) -> None:
        self.system = system
        self.operation_id = operation_id
        self.deliveries: Counter[str] = Counter()
        self.handled: list[str] = []  # command ids, in the order first handled
        self.failures: list[str] = []  # why a worker stopped other than by crashing
        self.crash_after_effect = True
        self.name = "worker-1"

    def table(self) -> Mapping[str, Handler]:
        """Capability -> handler, for `CapabilityWorker`."""
        return {VERIFY: self.verify, CREATE: self.create}

    def verify(self, command: CapabilityCommand) -> ActionResult | None:
        """A read: safe to repeat, so it needs no store."""
        if command.operation_id != self.operation_id:
            return None  # the stand-in system knows only this run's request
        self.handled.append(command.command_id)
        key = command.idempotency_key or ""
        outcome: Literal["applied", "not_applied"] = (
            "applied" if self.system.lookup(key) else "not_applied"
        )
        say(f"{self.name}: verify {command.command_id}: {outcome}")
        return ActionResult(
            succeeded=True,
            evidence=EvidencePayload(
                # No verifier named: the client library names the reporting (signing)
                # worker, the verifier the roster grants for procurement.
                outcome=outcome,
                reference=f"coupa-status:{key}",
            ),
        )

    def create(self, command: CapabilityCommand) -> ActionResult | None:
        """An effect: the worker calls it at most once per command id, whatever the
        deliveries (its store claimed the id before this call)."""
        if command.operation_id != self.operation_id:
            return None
        self.handled.append(command.command_id)
        self.deliveries[command.command_id] += 1
        if command.idempotency_key is None:
            return ActionResult(succeeded=False, evidence_ref="coupa:no-idempotency-key")
        request = self.system.create(command.idempotency_key)
        result = ActionResult(succeeded=True, evidence_ref=f"coupa:request:{request}")
        say(
            f"{self.name}: executed {command.command_id}: created {request} "
            f"with key {command.idempotency_key}"
        )
        if self.crash_after_effect:
            self.crash_after_effect = False
            say(f"{self.name}: crashing before reporting the result")
            raise SimulatedCrash
        return result


def start_worker(
    bootstrap: str, handlers: Handlers, stop: threading.Event, keys: Path, store: Path
) -> threading.Thread:
    """One worker process, as a thread: its own publisher, consumer and dedupe window,
    on the execution store at `store` (a restarted process opens the same file). Returns
    once the worker has its partitions (a new group starts at the end of the topic)."""
    publisher = EventPublisher(bootstrap, signer=signer(keys, WORKER))
    executions = ExecutionStore(store)
    worker = CapabilityWorker(
        bootstrap,
        GROUP,
        RecoveryClient(publisher, WORKER),
        handlers.table(),
        poll_timeout=0.2,
        store=executions,
    )

    def run() -> None:
        try:
            stats = worker.run(stop)
        except SimulatedCrash:
            say(f"{handlers.name}: gone; the offset of its last command is not committed")
            return
        except Exception as exc:  # a worker that cannot run (an ACL, say) ends the story
            handlers.failures.append(f"{handlers.name} stopped: {exc}")
            return
        finally:
            publisher.close()
            executions.close()
        say(
            f"{handlers.name}: stopped after {stats.executed} command(s) executed, "
            f"{stats.outcome_unknown} in flight before, {stats.reported} result(s) reported"
        )

    thread = threading.Thread(target=run, name=handlers.name)
    thread.start()
    deadline = time.monotonic() + 60
    while thread.is_alive() and not worker.assigned.wait(0.2) and time.monotonic() < deadline:
        pass
    if handlers.failures:
        raise ProducersError(handlers.failures[0])
    return thread


def report_timeout(tool: RecoveryClient, operation_id: str, key: str) -> Event:
    """The tool: the call with `key` timed out; report it, declaring the key."""
    event = tool.publish_event(
        "TOOL_TIMEOUT",
        operation_id=operation_id,
        correlation_id=f"corr-{operation_id}",
        machine_name=MACHINE_NAME,
        machine_version=MACHINE_VERSION,
        lineage=Lineage(
            agent=AGENT, task=f"restock-{operation_id}", initiating_principal="alice@example.com"
        ),
        evidence_ref=f"coupa:call:{key}",
        facts=DeclaredFacts(idempotency_key=key, status_api=True),
        scope=Scope(capability=CREATE, tool="coupa", environment="production"),
    )
    tool.flush()
    say(f"tool: reported TOOL_TIMEOUT for {operation_id} (idempotency key {key})")
    return event


def verdicts_of(
    reader: VerdictReader, event: Event, handlers: Handlers, timeout: float
) -> list[EventVerdict]:
    """The controller's verdicts on the tool's event and on the result of each command
    the workers handled (`result:<command id>`), in that order."""
    results = [f"result:{command_id}" for command_id in dict.fromkeys(handlers.handled)]
    return [reader.wait(event.operation_id, e, timeout=timeout) for e in (event.event_id, *results)]


def wait_until(what: str, condition: Any, timeout: float) -> bool:
    """Poll `condition()` until true or `timeout` seconds; say so when it never was."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    say(f"timed out after {timeout:.0f}s waiting for {what}")
    return False


def check(verdicts: Sequence[EventVerdict], handlers: Handlers) -> list[str]:
    """What went other than the guide says (empty when all is well); prints each
    verdict of the controller."""
    path: list[str] = []
    for v in verdicts:
        say(f"controller: {v.event_type} (event {v.event_id}): {v.describe()}")
        path.extend([str(v.state_before)] if not path else [])
        if v.state_after is not None and v.state_after != path[-1]:
            path.append(v.state_after)
    problems = []
    if tuple(path) != EXPECTED_PATH:
        problems.append(f"path {' -> '.join(path) or '(none)'}, expected {EXPECTED_PATH}")
    retries = list(handlers.deliveries)
    if list(handlers.deliveries.values()) != [1]:
        problems.append(f"retry handler calls {dict(handlers.deliveries)}, expected one, once")
    # The results of the retry command (RETRY_DUE, the controller's timer that commanded
    # it, paced, is no result: docs/decision-core.md, "Timers").
    results = [(v.event_type, v.event_id) for v in verdicts if v.event_id.startswith("result:")]
    if retries and ("RETRY_FAILED", f"result:{retries[0]}") not in results:
        problems.append(f"retry results {results}, expected one unknown outcome of {retries[0]}")
    if handlers.system.created != 1:
        problems.append(f"{handlers.system.created} requests created, expected 1")
    return problems


def play(bootstrap: str, timeout: float, keys: Path) -> int:
    """Run the scenario; 0 when it went as the guide says."""
    operation_id = f"op-worker-{uuid.uuid4().hex[:8]}"
    handlers = Handlers(Procurement(), operation_id)
    stop = threading.Event()
    store = Path(tempfile.mkdtemp(prefix="guide-worker-")) / "executions.sqlite"
    with EventPublisher(bootstrap, signer=signer(keys, TOOL)) as publisher:
        tool = RecoveryClient(publisher, TOOL)
        try:
            with tool.verdicts(since=datetime.now(UTC)) as reader:
                first = start_worker(bootstrap, handlers, stop, keys, store)
                event = report_timeout(tool, operation_id, f"req-{operation_id}")
                if wait_until("worker 1 to crash", lambda: not first.is_alive(), timeout):
                    handlers.name = "worker-2"
                    say("worker-2: starting in the same group")
                    second = start_worker(bootstrap, handlers, stop, keys, store)
                    if wait_until(
                        "a second verification", lambda: len(handlers.handled) >= 3, timeout
                    ):
                        # The last result decided (or not in time: `wait` says so) first.
                        last = f"result:{handlers.handled[-1]}"
                        reader.wait(operation_id, last, timeout=timeout)
                    stop.set()
                    second.join(timeout=30)
                stop.set()
                first.join(timeout=30)
                problems = check(verdicts_of(reader, event, handlers, timeout), handlers)
        except ProducersError as exc:  # no verdict in time, or no roster to believe one
            problems = [str(exc)]
        finally:
            stop.set()
    for problem in problems:
        say(f"FAILED: {problem}")
    if problems:
        return 1
    say("OK: the retry ran once across the crash, its unknown outcome was verified, completed")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, then play the scenario."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    services = ServiceSettings.load()  # RECOVERY_KAFKA_BOOTSTRAP
    parser.add_argument("--bootstrap", default=services.kafka_bootstrap)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument(
        "--keys",
        type=Path,
        default=default_keys(),
        help="the producers' key files, <id>.pem (default: the local stack's keys folder)",
    )
    args = parser.parse_args(argv)
    if not args.bootstrap:
        print(
            f"pass --bootstrap, or set {ENV_KAFKA_BOOTSTRAP}: on the local stack, "
            '`eval "$(recoveryctl stack env worker)"` sets it with the rest',
            file=sys.stderr,
        )
        return 2
    return play(args.bootstrap, args.timeout, args.keys)


if __name__ == "__main__":
    sys.exit(main())
