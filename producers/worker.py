"""An example capability worker: consumes commands, runs a handler, reports the result.

It shows the contract a real worker keeps (DESIGN "Action results are events"):

- it reads `recovery.commands` in a consumer group with auto-commit off, and commits a
  batch's offsets only after every result event of the batch is acknowledged by the
  broker, so a crash re-executes a command rather than losing its result;
- it verifies every command before anything else: the record must be signed
  (`schemas.verify_record`) by a key of a roster producer holding the `controller` role
  (the roster comes from `RECOVERY_ROSTER_FILE`, a policy or `producers:`-only file, or
  is passed in), and its decoded command id must be the signed `recovery-command-id`.
  An unsigned, unknown-key, revoked, expired or badly signed record, or one signed by a
  producer that is not a controller, is refused: not executed, logged at WARNING with its
  reason code and coordinates, and counted (`WorkerStats.refused`, by code). The worker
  writes nothing for it: its principal only writes `recovery.events`, and a forger must
  not be able to make it publish (docs/capability-worker.md, "Verification");
- it dedupes on the authenticated command id only, in memory (bounded) and durably in
  its execution store (`producers.ExecutionStore`, SQLite at `RECOVERY_WORKER_STORE`,
  one per process; or `producers.PostgresExecutionStore` at `RECOVERY_WORKER_STORE_URL`,
  shared by the group across hosts): the id is claimed durably before the handler runs and the
  handler's answer recorded before it is reported, so a command is executed at most
  once across crashes and restarts. A redelivered command that was done is answered
  again from the store (the same result event: event id `result:<command id>`, event
  time the command's `issued_at` unless the handler said when the effect completed,
  which the controller dedupes); one that was in flight when a worker died is reported
  as an unknown outcome (the kind's failure event, evidence reference
  `outcome-unknown:<command id>`), which the machine follows to verification or a
  human, never to a retry. A record pre-published under a command id the controller
  will use next (a squatted id) is refused and never shadows the real command;
- a command past its deadline (the operation's recovery deadline it carries) is not
  executed: it is reported as failed with `deadline-expired:<command id>`;
- a command of a drill operation (`CapabilityCommand.drill`, `recoveryctl drill`) is
  answered by `drill_answer` without calling the handler: nothing in the world changes;
- a group without committed offsets starts where the operator says (`start=`, else
  `RECOVERY_WORKER_START`: `latest` by default, `earliest`, or a time), never at the
  start of the topic unasked, so a new worker does not re-run history;
- a result it cannot hand to the producer (the queue stays full) stops the run without
  committing, as a failed flush does, so the command is redelivered instead of its
  result being lost;
- it continues the command's trace (W3C headers) around the handler and the report.

What it cannot do alone: an effect that happened while the worker was killed, before
the answer was recorded, is reported as an unknown outcome, not as what it was; only
the machine's verification (or a human) finds out (docs/capability-worker.md).

The handlers in `demo_handlers` are in-memory fakes for the demo and the tests. `run`
returns when its `stop` event is set; nothing here loops forever or prints.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from machines import (
    AuthenticationError,
    AuthRefusal,
    EvidencePayload,
    Role,
    Roster,
)
from producers.client import RESULT_EVENTS, RecoveryClient, roster_file
from producers.errors import ProducersError
from producers.execution_store import (
    ExecutionRecords,
    ExecutionState,
    StoredAnswer,
    open_execution_store,
)
from producers.settings import WorkerSettings
from schemas import (
    CAPABILITY_COMMAND,
    CONTENT_TYPE,
    ENV_ROSTER_FILE,
    HEADER_COMMAND_ID,
    HEADER_PRODUCER,
    CapabilityCommand,
    KafkaSecurity,
    TopicNames,
    WireCode,
    WireDecoder,
    WireError,
    header_value,
    kafka_config,
    librdkafka_logger,
    verify_record,
)

__all__ = [
    "ENV_WORKER_START",
    "ActionResult",
    "CapabilityWorker",
    "Handler",
    "StartPosition",
    "WorkerStats",
    "demo_handlers",
    "drill_answer",
    "roster_from_env",
    "verify_outcome",
]

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What a handler did. `event_type` overrides the conventional result event;
    `completed_at` (UTC) is when the effect completed, the result's event time (the
    command's `issued_at` when not given). A handler answering a repeated command from
    its store returns the stored values, `completed_at` included, so the report is the
    same event as the first. `retry_after_seconds` (a failure's: what a rate-limited API
    asked for) asks the controller to command the operation's next retry no sooner
    (docs/wire-protocol.md, section 5); it never makes a retry happen."""

    succeeded: bool
    evidence: EvidencePayload | None = None
    event_type: str | None = None
    evidence_ref: str | None = None
    completed_at: datetime | None = None
    retry_after_seconds: int | None = None


# None means "nothing to report": the machine does not listen for this capability's
# completion (an escalation ticket, a notification).
Handler = Callable[[CapabilityCommand], ActionResult | None]


@dataclass(slots=True)
class WorkerStats:
    """Counters of one `run`, returned when it stops."""

    consumed: int = 0
    executed: int = 0
    reported: int = 0
    duplicates: int = 0
    skipped: int = 0
    undecodable: int = 0
    # Handler answers no result event fits (logged, never retried: a fault of the handler).
    unreportable: int = 0
    # Commands refused by verification, by reason code (`machines.AuthRefusal`).
    refused: Counter[str] = field(default_factory=Counter)
    # Redelivered commands the execution store had an answer for (reported again).
    replayed: int = 0
    # Redelivered commands that were in flight when a worker died: outcome unknown.
    outcome_unknown: int = 0
    # Commands past their deadline: refused, reported as failed, never executed.
    expired: int = 0
    # Commands of drill operations: answered by `drill_answer`, the handler not called.
    drills: int = 0


# Where a new group (one without committed offsets) starts reading.
ENV_WORKER_START: Final = WorkerSettings.variable("start")
# The evidence references of the answers the worker makes itself, with their codes.
DEADLINE_EXPIRED: Final = "deadline-expired"
OUTCOME_UNKNOWN: Final = "outcome-unknown"


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a worker group with no committed offsets starts on each partition: the
    end of the log at assignment (`latest`, the default: no history is executed), its
    beginning (`earliest`), or the first record at or after `timestamp`. A group with
    committed offsets always goes on from them."""

    mode: str = "latest"
    timestamp: datetime | None = None

    @classmethod
    def parse(cls, text: str) -> StartPosition:
        """`latest`, `earliest` or an ISO 8601 time with its offset (`2026-12-01T00:00Z`);
        raises `ProducersError` otherwise."""
        value = text.strip()
        if value in ("latest", "earliest"):
            return cls(value)
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise ProducersError(
                f"worker start position {text!r}: expected latest, earliest or an ISO 8601 "
                "time with a UTC offset (2026-12-01T00:00:00+00:00)"
            )
        return cls("timestamp", when.astimezone(UTC))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StartPosition:
        """`RECOVERY_WORKER_START` (`WorkerSettings.start`), else `latest`."""
        return cls.parse(WorkerSettings.load(environ).start)

    def describe(self) -> str:
        """`latest`, `earliest` or the time."""
        return self.mode if self.timestamp is None else self.timestamp.isoformat()


def roster_from_env(environ: Mapping[str, str] | None = None) -> Roster:
    """The roster named by `RECOVERY_ROSTER_FILE`. Raises `ProducersError` naming the
    variable when it is unset or the file does not load."""
    roster = roster_file(environ)
    if roster is None:
        raise ProducersError(
            "the worker verifies every command against the controller's public key and has "
            f"no roster: set {ENV_ROSTER_FILE} to the policy file (or a `producers:`-only "
            "file) listing the controller with role `controller`, or pass `roster=`"
        )
    return roster


# Consumer errors that only an operator can fix (an ACL or the group's name).
_REFUSED_BY_ACLS: Final = frozenset(
    {KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED}
)


class CapabilityWorker:
    """Executes the commands of the capabilities it has handlers for."""

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        client: RecoveryClient,
        handlers: Mapping[str, Handler],
        *,
        topics: TopicNames | None = None,
        batch_size: int = 100,
        poll_timeout: float = 0.5,
        dedupe_capacity: int = 10_000,
        consumer_config: Mapping[str, Any] | None = None,
        security: KafkaSecurity | None = None,
        roster: Roster | None = None,
        store: ExecutionRecords | None = None,
        start: StartPosition | str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        # `security`: the worker principal's settings (else the environment's).
        # `store`: the execution store (else `RECOVERY_WORKER_STORE_URL`, the group's
        # shared one, or `RECOVERY_WORKER_STORE`); `start`: where a
        # group without committed offsets starts (else `RECOVERY_WORKER_START`, `latest`).
        if isinstance(start, str):
            start = StartPosition.parse(start)
        self._start = start if start is not None else StartPosition.from_env()
        config: dict[str, Any] = {
            **kafka_config(bootstrap, security),
            "group.id": group_id,
            # Only for a committed offset that fell out of the log (retention): go on
            # from the oldest record; the execution store keeps it from running twice.
            "auto.offset.reset": "earliest",
            "logger": librdkafka_logger("worker"),
            **(consumer_config or {}),
        }
        # Offsets are committed by hand after the results are durable (never ahead).
        config["enable.auto.commit"] = False
        self._config = config
        self._client = client
        self._handlers = dict(handlers)
        self._topic = (topics or client.publisher.topics).commands
        self._batch_size = batch_size
        self._poll_timeout = poll_timeout
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._capacity = dedupe_capacity
        self._decoder = WireDecoder()
        # Fail closed: without a roster naming a controller, nothing is executed.
        self._roster = roster if roster is not None else roster_from_env()
        if not any(self._roster.with_role(Role.CONTROLLER)):
            raise ProducersError(
                "the worker's roster lists no producer with role `controller`: every "
                "command would be refused; add the controller's public key to it"
            )
        self._store = store if store is not None else open_execution_store()
        self._clock = clock
        # Set once the group has assigned this member its partitions and each has its
        # position (the start position resolved for a new group).
        self.assigned = threading.Event()

    def run(self, stop: threading.Event) -> WorkerStats:
        """Consume and execute until `stop` is set; then finish the current batch, commit
        and leave the group cleanly. Returns the counters of this run."""
        stats = WorkerStats()
        consumer = Consumer(self._config)
        try:
            consumer.subscribe([self._topic], on_assign=self._on_assign)
            while not stop.is_set():
                messages = consumer.consume(self._batch_size, self._poll_timeout)
                consumed_before = stats.consumed
                batch_ids: list[str] = []
                try:
                    for message in messages:
                        self._handle(message, stats, batch_ids)
                    if stats.consumed == consumed_before:
                        continue  # nothing but broker notices: no offset to commit
                    self._settle(consumer)
                except Exception:
                    # Nothing of this batch is committed; forget its commands so that
                    # their redelivery (to this worker or the next) is answered from the
                    # execution store (or, never claimed, executed).
                    for command_id in batch_ids:
                        self._seen.pop(command_id, None)
                    raise
        finally:
            consumer.close()
            librdkafka_logger("worker").flush()  # the lines held back, summarised
        return stats

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Position each assigned partition: at the group's committed offset, else at
        the start position. A `latest` start is committed at once, so a member that dies
        before its first batch does not let the next one start later still."""
        try:
            positions = consumer.committed(partitions, timeout=30)
            fresh = [p for p in positions if p.offset < 0]
            for partition in fresh:
                partition.offset = self._start_offset(consumer, partition)
            consumer.assign(positions)
            if fresh and self._start.mode == "latest":
                consumer.commit(offsets=fresh, asynchronous=False)
        except KafkaException as exc:
            raise ProducersError(f"worker could not position {self._topic}: {exc}") from exc
        if fresh:
            _log.info(
                "worker group starts %d partition(s) of %s at %s",
                len(fresh),
                self._topic,
                self._start.describe(),
            )
        self.assigned.set()

    def _start_offset(self, consumer: Consumer, partition: TopicPartition) -> int:
        if self._start.mode == "earliest":
            return OFFSET_BEGINNING
        _low, high = consumer.get_watermark_offsets(partition, timeout=30)
        if self._start.timestamp is None:
            return int(high)
        probe = TopicPartition(
            partition.topic, partition.partition, int(self._start.timestamp.timestamp() * 1000)
        )
        [found] = consumer.offsets_for_times([probe], timeout=30)
        # -1: no record at or after the time, so start at the end.
        return int(high) if found.offset < 0 else int(found.offset)

    def _settle(self, consumer: Consumer) -> None:
        # Results first, offsets second: a crash between the two re-executes the batch,
        # and the deterministic result events make a re-report a duplicate.
        self._client.flush()
        consumer.commit(asynchronous=False)

    def _consumer_error(self, error: KafkaError) -> None:
        """Raise for what only an operator can fix; log the rest (the client retries)."""
        if error.fatal():
            raise ProducersError(f"consumer of {self._topic} failed: {error}")
        if error.code() in _REFUSED_BY_ACLS:
            # Retried for ever, it would leave the worker up and doing nothing.
            raise ProducersError(
                f"the broker refuses this worker {error.name()} on topic {self._topic} in "
                f"group {self._config['group.id']}: {error.str()}; a worker principal may "
                "read the commands topic in groups named recovery-worker* only "
                "(docs/operations.md, Kafka security): name its group so"
            )
        if error.code() != KafkaError._PARTITION_EOF:
            _log.warning("consumer of %s: %s", self._topic, error)

    def _handle(self, message: Message[Any, Any], stats: WorkerStats, batch_ids: list[str]) -> None:
        error = message.error()
        if error is not None:
            self._consumer_error(error)
            return
        stats.consumed += 1
        pairs = _header_pairs(message.headers())
        refusal = self._authenticate(message, pairs)
        if refusal is not None:
            self._refuse(message, pairs, refusal[0], refusal[1], stats)
            return
        # Signed, so the id is the controller's: dedupe on it before decoding.
        command_id = header_value(pairs, HEADER_COMMAND_ID)
        if command_id is None:
            self._refuse(message, pairs, AuthRefusal.IDENTITY_MISMATCH, "no command id", stats)
            return
        if command_id in self._seen:
            self._seen.move_to_end(command_id)
            stats.duplicates += 1
            return
        command = self._decode(message, header_value(pairs, CONTENT_TYPE), stats)
        if command is None:
            return
        if command.command_id != command_id:
            reason = f"command id {command.command_id} is not the signed {command_id}"
            self._refuse(message, pairs, AuthRefusal.IDENTITY_MISMATCH, reason, stats)
            return
        self._already_seen(command_id, batch_ids)
        handler = self._handlers.get(command.capability)
        if handler is None:
            stats.skipped += 1  # another worker group serves this capability
            return
        carrier = {k: v.decode("utf-8", "replace") for k, v in pairs if v is not None}
        with _tracer.start_as_current_span(
            f"execute {command.capability}",
            context=propagate.extract(carrier),
            kind=SpanKind.CONSUMER,
            attributes={
                "recovery.command_id": command.command_id,
                "recovery.operation_id": command.operation_id,
            },
        ):
            self._execute(command, handler, stats)

    def _authenticate(
        self, message: Message[Any, Any], pairs: list[tuple[str, bytes | None]]
    ) -> tuple[str, str] | None:
        """None when the record is signed by a roster controller key valid now; else the
        refusal code and reason."""
        try:
            entry = verify_record(
                self._roster,
                message.topic() or "",
                message.key(),
                message.value(),
                pairs,
                at=self._clock(),
            )
        except AuthenticationError as exc:
            return exc.code, exc.reason
        if Role.CONTROLLER not in entry.roles():
            return AuthRefusal.ROLE_NOT_PERMITTED, f"producer {entry.id} is not a controller"
        return None

    def _refuse(
        self,
        message: Message[Any, Any],
        pairs: list[tuple[str, bytes | None]],
        code: str,
        reason: str,
        stats: WorkerStats,
    ) -> None:
        stats.refused[str(code)] += 1
        _log.warning(
            "refused command at %s[%s]@%s (claimed id %s, producer %s): %s: %s; not executed",
            message.topic(),
            message.partition(),
            message.offset(),
            header_value(pairs, HEADER_COMMAND_ID),
            header_value(pairs, HEADER_PRODUCER),
            code,
            reason,
        )

    def _decode(
        self, message: Message[Any, Any], content_type: str | None, stats: WorkerStats
    ) -> CapabilityCommand | None:
        try:
            name, record = self._decoder.decode(message.value(), content_type)
            if name != CAPABILITY_COMMAND:
                raise WireError(WireCode.UNKNOWN_SCHEMA, f"a {name} record is not a command")
            return CapabilityCommand.from_record(record)
        except WireError as exc:
            stats.undecodable += 1
            where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
            _log.error("skipping undecodable command at %s: %s", where, exc)
            return None

    def _execute(self, command: CapabilityCommand, handler: Handler, stats: WorkerStats) -> None:
        """Run `handler` once per command id, ever: claim the id in the store first, record
        the answer before reporting it; a redelivered id is answered from the store."""
        found = self._store.lookup(command.command_id)
        if found is not None:
            self._answer_again(command, found.state, found.answer, stats)
            return
        now = self._clock()
        if command.deadline is not None and now >= command.deadline:
            stats.expired += 1
            _log.warning(
                "command %s (%s) of operation %s refused: %s: its deadline %s has passed "
                "(now %s); not executed",
                command.command_id,
                command.capability,
                command.operation_id,
                DEADLINE_EXPIRED,
                command.deadline.isoformat(),
                now.isoformat(),
            )
            self._store.claim(command.command_id, command.capability, now)
            self._finish(command, self._own_answer(command, DEADLINE_EXPIRED), stats)
            return
        if not self._store.claim(command.command_id, command.capability, now):
            # Claimed since the lookup, by another worker on the same store: it answers.
            stats.duplicates += 1
            return
        if command.drill:
            # A response drill (CONFORMANCE L4.6): answer as the handler would in the
            # drill's script, without calling it, so nothing in the world changes.
            stats.drills += 1
            _log.info("command %s is a drill's: answered, not executed", command.command_id)
            self._finish(command, _stored(drill_answer(command)), stats)
            return
        stats.executed += 1
        try:
            result = handler(command)
        except Exception as exc:  # a failing handler is a failed action, reported as such
            _log.exception("command %s (%s) failed", command.command_id, command.capability)
            result = ActionResult(succeeded=False, evidence_ref=f"error:{type(exc).__name__}")
        self._finish(command, _stored(result), stats)

    def _answer_again(
        self,
        command: CapabilityCommand,
        state: ExecutionState,
        answer: StoredAnswer | None,
        stats: WorkerStats,
    ) -> None:
        if state is ExecutionState.DONE and answer is not None:
            stats.replayed += 1
            _log.info("command %s already executed: reporting its answer again", command.command_id)
            self._report(command, answer, stats)
            return
        # In flight when a worker died: the effect may or may not have happened.
        stats.outcome_unknown += 1
        _log.warning(
            "command %s (%s) of operation %s was in flight when a worker stopped: %s; "
            "not executed again",
            command.command_id,
            command.capability,
            command.operation_id,
            OUTCOME_UNKNOWN,
        )
        self._finish(command, self._own_answer(command, OUTCOME_UNKNOWN), stats)

    def _own_answer(self, command: CapabilityCommand, code: str) -> StoredAnswer:
        """The worker's answer for a command it does not execute: the kind's failure event
        (verification unavailable, retry/compensation/containment failed), which every
        machine follows to verification or a human, never to a blind retry. A kind with
        no conventional failure event gets no report; the operation waits for an
        operator (logged at ERROR)."""
        reportable = command.kind == "verify" or command.kind in RESULT_EVENTS
        if not reportable:
            _log.error(
                "command %s (%s, kind %s): %s and no result event to report it with; the "
                "operation waits for an operator",
                command.command_id,
                command.capability,
                command.kind,
                code,
            )
        return StoredAnswer(
            reported=reportable, succeeded=False, evidence_ref=f"{code}:{command.command_id}"
        )

    def _finish(self, command: CapabilityCommand, answer: StoredAnswer, stats: WorkerStats) -> None:
        # Recorded before it is reported: a crash after this re-reports the same answer.
        self._store.record(command.command_id, answer, self._clock())
        self._report(command, answer, stats)

    def _report(self, command: CapabilityCommand, answer: StoredAnswer, stats: WorkerStats) -> None:
        if not answer.reported:
            return
        try:
            event = self._client.action_result(
                command,
                answer.succeeded,
                answer.evidence,
                event_type=answer.event_type,
                evidence_ref=answer.evidence_ref,
                event_time=answer.completed_at,
                retry_after_seconds=answer.retry_after_seconds,
            )
        except (ProducersError, WireError) as exc:
            # The handler's answer fits no result event: retrying cannot fix it.
            stats.unreportable += 1
            _log.error("command %s: result not reported: %s", command.command_id, exc)
            return
        # A full queue raises here and stops the run uncommitted (see `run`).
        self._client.publisher.publish(event)
        stats.reported += 1

    def _already_seen(self, command_id: str, batch_ids: list[str]) -> bool:
        if command_id in self._seen:
            self._seen.move_to_end(command_id)
            return True
        self._seen[command_id] = None
        batch_ids.append(command_id)
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return False


def _stored(result: ActionResult | None) -> StoredAnswer:
    if result is None:
        return StoredAnswer(reported=False)
    return StoredAnswer(
        reported=True,
        succeeded=result.succeeded,
        evidence=result.evidence,
        event_type=result.event_type,
        evidence_ref=result.evidence_ref,
        completed_at=result.completed_at,
        retry_after_seconds=result.retry_after_seconds,
    )


def drill_answer(command: CapabilityCommand) -> ActionResult | None:
    """What a worker reports for a drill's command instead of executing it: a
    verification answers `verify_outcome` (deterministic from the operation id, so the
    drill picks an id for the outcome its scenario needs), a retry, compensation or
    containment succeeds, and any other kind reports nothing, as the demo handlers do.
    The evidence reference `drill:<command id>` shows the handler was not called."""
    reference = f"drill:{command.command_id}"
    if command.kind == "verify":
        found = verify_outcome(command) == "found"
        return ActionResult(
            succeeded=True,
            evidence=EvidencePayload(
                outcome="applied" if found else "not_applied", reference=reference
            ),
            evidence_ref=reference,
        )
    if command.kind in RESULT_EVENTS:
        return ActionResult(succeeded=True, evidence_ref=reference)
    return None


def _header_pairs(raw: Any) -> list[tuple[str, bytes | None]]:
    items = raw.items() if isinstance(raw, Mapping) else (raw or [])
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


def verify_outcome(command: CapabilityCommand) -> str:
    """The fake verifier's answer, deterministic from the command: `params["demo_outcome"]`
    when given (`found` or `not_found`), otherwise from a hash of the operation id, so a
    replayed demo gets the same answers."""
    forced = command.params.get("demo_outcome")
    if forced in ("found", "not_found"):
        return str(forced)
    return (
        "found"
        if hashlib.sha256(command.operation_id.encode()).digest()[0] % 2 == 0
        else "not_found"
    )


def _verify(command: CapabilityCommand) -> ActionResult:
    found = verify_outcome(command) == "found"
    return ActionResult(
        succeeded=True,
        evidence=EvidencePayload(
            outcome="applied" if found else "not_applied",
            reference=f"demo-verifier:{command.command_id}",
        ),
    )


def _succeed(_command: CapabilityCommand) -> ActionResult:
    return ActionResult(succeeded=True)


def _acknowledge(_command: CapabilityCommand) -> None:
    return None


_DEMO: Final[Mapping[str, Handler]] = {
    "procurement.verify-request": _verify,
    "payment.verify-refund": _verify,
    "deploy.verify-steps": _verify,
    "agent.stop-task": _succeed,
    "credentials.revoke-delegation": _succeed,
    "capability.isolate": _acknowledge,
    "human.escalate": _acknowledge,
    "email.quarantine-outbox": _acknowledge,
    "deploy.freeze-pipeline": _acknowledge,
}


def demo_handlers() -> dict[str, Handler]:
    """In-memory fake handlers for the catalogue's capabilities (demo and tests only):
    verifiers answer `verify_outcome`, `agent.stop-task` and
    `credentials.revoke-delegation` succeed (CONTAINMENT_SUCCEEDED, each naming its
    command: a containment waits for both), the rest acknowledge without an event."""
    return dict(_DEMO)
