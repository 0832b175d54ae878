"""A capability worker as a process of its own, for tests that kill it with SIGKILL.

`python -m tests.support.worker_process --group G --commands T --events T --store PATH
--effects PATH` (or, for the group's shared store, `RECOVERY_WORKER_STORE_URL` set and
no `--store`) runs `producers.CapabilityWorker` with one handler, for
`procurement.create-request` (kind `retry`), that stands for a side effect: it appends
the command id to `--effects` and fsyncs the file before it returns, then sleeps
`--pause` seconds, so a kill lands between effects. The worker signs as
`capability-worker` with the tests' key and verifies commands against the session's
controller key (inherited through `RECOVERY_CONTROLLER_SIGNING_KEY_FILE`). It prints
`assigned` once it has its partitions and runs until SIGTERM or SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from producers import (
    ActionResult,
    CapabilityWorker,
    EventPublisher,
    ExecutionStore,
    RecoveryClient,
    open_execution_store,
)
from schemas import ENV_KAFKA_BOOTSTRAP, CapabilityCommand, TopicNames
from tests.support.commands import worker_roster
from tests.support.producers import signers

PRODUCER = "capability-worker"
CAPABILITY = "procurement.create-request"


def _effect(effects: Path, pause: float) -> Callable[[CapabilityCommand], ActionResult]:
    def create(command: CapabilityCommand) -> ActionResult:
        with effects.open("a", encoding="utf-8") as out:
            out.write(command.command_id + "\n")
            out.flush()
            os.fsync(out.fileno())
        time.sleep(pause)
        return ActionResult(succeeded=True, evidence_ref=f"effect:{command.command_id}")

    return create


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--commands", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--store", type=Path)
    parser.add_argument("--effects", type=Path, required=True)
    parser.add_argument("--start", default="earliest")
    parser.add_argument("--pause", type=float, default=0.05)
    args = parser.parse_args()
    bootstrap = os.environ[ENV_KAFKA_BOOTSTRAP]
    topics = TopicNames(events=args.events, commands=args.commands)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with (
        EventPublisher(bootstrap, signer=signers(), topics=topics) as publisher,
        closing(ExecutionStore(args.store) if args.store else open_execution_store()) as store,
    ):
        worker = CapabilityWorker(
            bootstrap,
            args.group,
            RecoveryClient(publisher, producer=PRODUCER),
            {CAPABILITY: _effect(args.effects, args.pause)},
            topics=topics,
            batch_size=5,
            poll_timeout=0.2,
            roster=worker_roster(),
            store=store,
            start=args.start,
            # A killed member leaves the group after 6 s, not librdkafka's 45.
            consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        )
        threading.Thread(
            target=lambda: worker.assigned.wait() and print("assigned", flush=True), daemon=True
        ).start()
        worker.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
