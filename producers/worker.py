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
- it dedupes on the authenticated command id only (bounded memory), so a record
  pre-published under a command id the controller will use next (a squatted id) is
  refused and never shadows the real command; the result event is a function of the
  command and the handler's answer (`RecoveryClient.action_result`: event id
  `result:<command id>`, event time the command's `issued_at` unless the handler says
  when the effect completed), so a redelivered command that slips past the in-memory
  window, answered the same way, produces the same event, which the controller dedupes;
- a result it cannot hand to the producer (the queue stays full) stops the run without
  committing, as a failed flush does, so the command is redelivered instead of its
  result being lost;
- it continues the command's trace (W3C headers) around the handler and the report.

What it cannot do alone: a crash after the handler acted and before the result was
acknowledged re-executes the command on redelivery. Only a durable store of executions
by command id in the handler (docs/capability-worker.md) makes that harmless and makes
the second answer equal to the first.

The handlers in `demo_handlers` are in-memory fakes for the demo and the tests. `run`
returns when its `stop` event is set; nothing here loops forever or prints.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, Message
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from machines import (
    AuthenticationError,
    AuthRefusal,
    EvidencePayload,
    PolicyError,
    Role,
    Roster,
    load_roster,
)
from producers.client import RecoveryClient
from producers.errors import ProducersError
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
    "ActionResult",
    "CapabilityWorker",
    "Handler",
    "WorkerStats",
    "demo_handlers",
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
    same event as the first."""

    succeeded: bool
    evidence: EvidencePayload | None = None
    event_type: str | None = None
    evidence_ref: str | None = None
    completed_at: datetime | None = None


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


def roster_from_env(environ: Mapping[str, str] | None = None) -> Roster:
    """The roster named by `RECOVERY_ROSTER_FILE`. Raises `ProducersError` naming the
    variable when it is unset or the file does not load."""
    env = os.environ if environ is None else environ
    path = env.get(ENV_ROSTER_FILE)
    if not path:
        raise ProducersError(
            "the worker verifies every command against the controller's public key and has "
            f"no roster: set {ENV_ROSTER_FILE} to the policy file (or a `producers:`-only "
            "file) listing the controller with role `controller`, or pass `roster=`"
        )
    try:
        return load_roster(Path(path))
    except (OSError, PolicyError) as exc:
        raise ProducersError(
            f"roster {path} (from {ENV_ROSTER_FILE}) does not load: {exc}"
        ) from exc


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
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        # `security`: the worker principal's settings (else the environment's).
        config: dict[str, Any] = {
            **kafka_config(bootstrap, security),
            "group.id": group_id,
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
        self._clock = clock

    def run(self, stop: threading.Event) -> WorkerStats:
        """Consume and execute until `stop` is set; then finish the current batch, commit
        and leave the group cleanly. Returns the counters of this run."""
        stats = WorkerStats()
        consumer = Consumer(self._config)
        try:
            consumer.subscribe([self._topic])
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
                    # their redelivery (to this worker or the next) runs them again.
                    for command_id in batch_ids:
                        self._seen.pop(command_id, None)
                    raise
        finally:
            consumer.close()
        return stats

    def _settle(self, consumer: Consumer) -> None:
        # Results first, offsets second: a crash between the two re-executes the batch,
        # and the deterministic result events make a re-report a duplicate.
        self._client.flush()
        consumer.commit(asynchronous=False)

    def _handle(self, message: Message[Any, Any], stats: WorkerStats, batch_ids: list[str]) -> None:
        error = message.error()
        if error is not None:
            if error.fatal():
                raise ProducersError(f"consumer of {self._topic} failed: {error}")
            if error.code() != KafkaError._PARTITION_EOF:
                _log.warning("consumer of %s: %s", self._topic, error)
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
        stats.executed += 1
        try:
            result = handler(command)
        except Exception as exc:  # a failing handler is a failed action, reported as such
            _log.exception("command %s (%s) failed", command.command_id, command.capability)
            result = ActionResult(succeeded=False, evidence_ref=f"error:{type(exc).__name__}")
        if result is None:
            return
        try:
            event = self._client.action_result(
                command,
                result.succeeded,
                result.evidence,
                event_type=result.event_type,
                evidence_ref=result.evidence_ref,
                event_time=result.completed_at,
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
    "credentials.revoke-delegation": _acknowledge,
    "capability.isolate": _acknowledge,
    "human.escalate": _acknowledge,
    "email.quarantine-outbox": _acknowledge,
    "deploy.freeze-pipeline": _acknowledge,
}


def demo_handlers() -> dict[str, Handler]:
    """In-memory fake handlers for the catalogue's capabilities (demo and tests only):
    verifiers answer `verify_outcome`, `agent.stop-task` succeeds (CONTAINMENT_SUCCEEDED),
    the rest acknowledge without an event."""
    return dict(_DEMO)
