"""A procurement tool reports a timeout, end to end: the example of docs/tool-integration.md.

What a CONFORMANCE Level 2 tool integration does, step by step:

1. It declares an idempotency key *before* it calls the procurement API and sends the
   key with the call (a key minted after a timeout protects nothing).
2. The call times out. The tool cannot know whether the request landed, so it reports
   TOOL_TIMEOUT for the operation and declares its facts once, on that first event: the
   key, a side effect possible but not confirmed, a status API, cancellation supported.
3. The controller commands `procurement.verify-request`. The tool's verifier looks the
   key up in the status API, finds nothing and answers "not applied", signed with the
   worker's key: the roster (`recoveryctl keys generate --role verifier`, see
   `example_keys.py`) grants it `verifier` for procurement.
4. With authoritative not-applied evidence and a declared key, the controller commands
   the retry `procurement.create-request`, carrying the same key; the worker resubmits
   with it and reports success, and the controller completes the operation.

The procurement API is an in-memory stand-in (`ProcurementApi`); everything else is the
real system: Kafka, the controller and relay started by `recoveryctl run`, PostgreSQL.
The tool and its worker are two components that would be two processes; here they are
two threads of one, each with its own `EventPublisher` (a publisher is not thread-safe).
The tool learns what the controller made of each event from the controller's signed
verdicts on the audit topic (`RecoveryClient.verdicts`): a tool never reads the database.

Run it against the local stack (docs/tool-integration.md, "Run the example"), as the
stack's worker principal, which may report results and read verdicts:

    eval "$(recoveryctl stack env worker)"
    python docs/examples/tool_timeout.py

The broker comes from `--bootstrap`, else RECOVERY_KAFKA_BOOTSTRAP, the keys from
`--keys` (default: the stack's keys folder), the roster from RECOVERY_ROSTER_FILE. Exit
status 0 only if every step above happened; 1 otherwise (with what went wrong), 2 when
no broker is named.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

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

# A worker principal may consume in groups named recovery-worker* only (docs/operations.md).
WORKER_GROUP: Final = "recovery-worker-guide-tool-timeout"
MACHINE_NAME: Final = "procurement-request"
MACHINE_VERSION: Final = "1.0.0"
CAPABILITY: Final = "procurement.create-request"
EXPECTED_PATH: Final = ("failure-reported", "verifying", "retrying", "completed")


def say(text: str) -> None:
    """One step of the story on stdout (the worker thread prints too)."""
    print(text, flush=True)


class ProcurementApi:
    """An in-memory procurement system: requests by idempotency key, a status lookup."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, str] = {}  # idempotency key -> request id
        self.landed = 0  # create calls that reached the system

    def create(self, key: str, item: str, *, lose_it: bool = False) -> str:
        """Create a request under `key`, or return the one already created under it.
        With `lose_it` the call times out before it reaches the system."""
        if lose_it:
            raise TimeoutError(f"procurement API: no response for {key} within 30 s")
        with self._lock:
            self.landed += 1
            return self.requests.setdefault(key, f"REQ-{len(self.requests) + 1:05d} ({item})")

    def lookup(self, key: str) -> str | None:
        """The status API: the request created under `key`, if any."""
        with self._lock:
            return self.requests.get(key)


class Worker:
    """The handlers of the two capabilities the procurement machine commands."""

    def __init__(self, api: ProcurementApi, operation_id: str) -> None:
        self.api = api
        self.operation_id = operation_id
        self.commands: list[CapabilityCommand] = []

    def handlers(self) -> Mapping[str, Handler]:
        """Capability -> handler, for `CapabilityWorker`."""
        return {"procurement.verify-request": self.verify, CAPABILITY: self.retry}

    def verify(self, command: CapabilityCommand) -> ActionResult | None:
        """Ask the status API by the command's idempotency key; report what it says."""
        if command.operation_id != self.operation_id:
            return None  # this stand-in API knows only this run's request (see the guide)
        self.commands.append(command)
        key = command.idempotency_key
        if key is None:  # nothing to look up by: the verification is unavailable
            return ActionResult(succeeded=False, evidence_ref=f"coupa-status:{command.command_id}")
        found = self.api.lookup(key)
        outcome: Literal["applied", "not_applied"] = "applied" if found else "not_applied"
        seen = f"found {found}" if found else f"no request under {key}"
        say(f"worker: verify {command.command_id}: status API has {seen}: {outcome}")
        return ActionResult(
            succeeded=True,
            evidence=EvidencePayload(
                # No verifier named: the client library names the reporting (signing)
                # worker, the verifier the roster grants for procurement.
                outcome=outcome,
                reference=f"coupa-status:{key}",
            ),
        )

    def retry(self, command: CapabilityCommand) -> ActionResult | None:
        """Resubmit the request with the command's idempotency key (never a new one)."""
        if command.operation_id != self.operation_id:
            return None
        self.commands.append(command)
        key = command.idempotency_key
        if key is None:
            return ActionResult(succeeded=False, evidence_ref="coupa:no-idempotency-key")
        request = self.api.create(key, "12 laptops")
        say(f"worker: retry {command.command_id} with idempotency key {key}: created {request}")
        return ActionResult(succeeded=True, evidence_ref=f"coupa:request:{request}")


def report_timeout(tool: RecoveryClient, api: ProcurementApi, operation_id: str, key: str) -> Event:
    """The tool's side: call with a declared key; on a timeout, report TOOL_TIMEOUT."""
    lineage = Lineage(
        agent=AGENT,
        task=f"restock-{operation_id}",
        initiating_principal="alice@example.com",
    )
    say(f"tool: calling {CAPABILITY} with idempotency key {key}")
    try:
        api.create(key, "12 laptops", lose_it=True)
    except TimeoutError as exc:
        say(f"tool: {exc}; the effect is unknown")
    event = tool.publish_event(
        "TOOL_TIMEOUT",
        operation_id=operation_id,
        correlation_id=f"corr-{operation_id}",
        machine_name=MACHINE_NAME,
        machine_version=MACHINE_VERSION,
        lineage=lineage,
        evidence_ref=f"coupa:call:{key}",
        facts=DeclaredFacts(
            idempotency_key=key,
            side_effect_possible=True,
            side_effect_confirmed=False,
            compensation_supported=True,
            status_api=True,
        ),
        scope=Scope(capability=CAPABILITY, tool="coupa", environment="production"),
    )
    tool.flush()  # raises DeliveryFailed unless the broker acknowledged it
    say(f"tool: reported TOOL_TIMEOUT {event.event_id} for operation {operation_id}")
    return event


def run_worker(
    runner: CapabilityWorker, stop: threading.Event, failed: list[BaseException]
) -> None:
    """The worker's thread: run until `stop`; what stops it early is kept in `failed`."""
    try:
        runner.run(stop)
    except Exception as exc:
        failed.append(exc)


def wait_assigned(
    runner: CapabilityWorker, thread: threading.Thread, failed: list[BaseException]
) -> bool:
    """Whether the worker got its partitions within 60 s (False at once if it died)."""
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        if runner.assigned.wait(timeout=0.2):
            return True
    return runner.assigned.is_set() and not failed


def follow(
    reader: VerdictReader, worker: Worker, event: Event, timeout: float
) -> list[EventVerdict]:
    """The controller's verdicts on the tool's event and on each result the worker
    reported (`result:<command id>`), in order, until the operation is final; raises
    `VerdictTimeout` when one does not come in time."""
    deadline = time.monotonic() + timeout
    verdicts = [reader.wait(event.operation_id, event.event_id, timeout=timeout)]
    while verdicts[-1].state_after not in (None, EXPECTED_PATH[-1]) and verdicts[-1].moved:
        answered = len(verdicts) - 1  # results decided so far, one per command
        while len(worker.commands) <= answered and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(worker.commands) <= answered:
            break  # no further command came: the path check below says so
        result = f"result:{worker.commands[answered].command_id}"
        left = max(1.0, deadline - time.monotonic())
        verdicts.append(reader.wait(event.operation_id, result, timeout=left))
    return verdicts


def recorded_path(verdicts: Sequence[EventVerdict]) -> tuple[str, ...]:
    """The states the controller's decisions went through; prints each verdict."""
    path: list[str] = []
    for v in verdicts:
        say(f"controller: {v.event_type} {v.describe()}")
        if not path and v.state_before is not None:
            path.append(v.state_before)
        if v.state_after is not None and (not path or v.state_after != path[-1]):
            path.append(v.state_after)
    return tuple(path)


def check(path: tuple[str, ...], worker: Worker, api: ProcurementApi, key: str) -> list[str]:
    """What went other than the guide says (empty when all is well)."""
    problems = []
    if path != EXPECTED_PATH:
        problems.append(f"path {' -> '.join(path) or '(none)'}, expected {EXPECTED_PATH}")
    kinds = [(c.capability, c.idempotency_key) for c in worker.commands]
    if kinds != [("procurement.verify-request", key), (CAPABILITY, key)]:
        problems.append(f"commands executed: {kinds}")
    if api.requests != {key: api.requests.get(key)} or api.landed != 1:
        problems.append(f"procurement requests {api.requests} after {api.landed} create(s)")
    return problems


def play(bootstrap: str, timeout: float, keys: Path) -> int:
    """Run the scenario; 0 when it went as the guide says."""
    operation_id = f"op-procurement-{uuid.uuid4().hex[:8]}"
    key = f"req-{operation_id}"  # declared before the call, kept for every retry
    api = ProcurementApi()
    worker = Worker(api, operation_id)
    stop = threading.Event()
    problems: list[str] = []
    with (
        EventPublisher(bootstrap, signer=signer(keys, TOOL)) as tool_publisher,
        EventPublisher(bootstrap, signer=signer(keys, WORKER)) as worker_publisher,
        # The worker's record of what it executed (a file it owns in a real deployment).
        ExecutionStore(Path(tempfile.mkdtemp()) / "executions.sqlite") as store,
    ):
        runner = CapabilityWorker(
            bootstrap,
            WORKER_GROUP,
            RecoveryClient(worker_publisher, WORKER),
            worker.handlers(),
            poll_timeout=0.2,
            store=store,
        )
        failed: list[BaseException] = []
        thread = threading.Thread(target=run_worker, args=(runner, stop, failed), name="worker")
        thread.start()
        tool = RecoveryClient(tool_publisher, TOOL)
        try:
            # A new group starts at the end of the topic: report once it has its partitions.
            if not wait_assigned(runner, thread, failed):
                raise ProducersError(
                    f"the worker stopped: {failed[0] if failed else 'no partitions'}"
                )
            with tool.verdicts(since=datetime.now(UTC)) as reader:
                event = report_timeout(tool, api, operation_id, key)
                verdicts = follow(reader, worker, event, timeout)
        except ProducersError as exc:  # no verdict in time, or no roster to believe one
            verdicts, problems = [], [str(exc)]
        finally:
            stop.set()
            thread.join(timeout=30)
    problems = problems or check(recorded_path(verdicts), worker, api, key)
    for problem in problems:
        say(f"FAILED: {problem}")
    if problems:
        return 1
    say(f"OK: verified not applied, retried once with {key}, completed")
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
