"""The client library tools, capability workers and approvers use to publish events.

`EventPublisher` owns one idempotent producer (`enable.idempotence`, `acks=all`) and
publishes encoded records with the wire headers: `content-type`, `recovery-schema`
(the writer schema's fingerprint), a deterministic `recovery-record-id`, and the W3C
trace context of the current span (`traceparent`, `tracestate`), injected with
OpenTelemetry's global propagator. Records are keyed by operation id, so one
operation's events stay in order on one partition. Delivery is asynchronous: `flush`
waits and raises `DeliveryFailed` for every record the broker did not acknowledge.

Every record is signed by its producer (`schemas.RecordSigner`: headers
`recovery-producer`, `recovery-key-id`, `recovery-signature` over the topic, key, value
digest and the headers consumers act on); the controller refuses anything else. The
signer is passed in, or built from `RECOVERY_PRODUCER_ID` and
`RECOVERY_PRODUCER_KEY_FILE`; a process that publishes for several producers (a test
harness, a gateway holding each tool's key) passes a mapping of producer id to signer,
and each event is signed by the signer of its `producer`. Only the relay, which signs
with the controller's key on its own path, builds a publisher with `signer=None`.

Given the roster (`roster=`, else the file `RECOVERY_ROSTER_FILE` names), a publisher
refuses at once to sign with a key the roster does not list, or lists revoked or out of
its validity: the controller would dead-letter every record it signs (`key-unknown`...).

`RecoveryClient` builds valid envelopes on top of it, with the signer's id as the
envelope's `producer`: any event (`publish_event`), the
result of a capability command (`report_action_result`, causation = the command id) and
a signed human decision (`publish_human_decision`, or `publish_signed_decision` for one
signed elsewhere). `confirm` waits, bounded, for the controller's verdict on an event it
published: decided (and how), or dead-lettered with the reason (`producers.verdicts`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry import propagate

from machines import (
    MIGRATION_APPROVED,
    AuthenticationError,
    ClassifierOutput,
    DeclaredFacts,
    Event,
    EvidencePayload,
    HumanDecision,
    Lineage,
    PolicyError,
    Roster,
    Scope,
    Verdict,
    call_context_claims,
    load_roster,
    sign_decision,
)
from producers.errors import DeliveryFailed, ProducersError, RecordRefused
from producers.verdicts import EventVerdict, VerdictReader
from schemas import (
    CONTENT_TYPE,
    ENV_ROSTER_FILE,
    EVENT_ENVELOPE,
    HEADER_CALL_CONTEXT,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    HEADER_SIGNATURE,
    MAX_EVENT_RECORD_BYTES,
    AvroSingleObjectCodec,
    CapabilityCommand,
    IdentitySettings,
    JsonCodec,
    KafkaSecurity,
    RecordSigner,
    SignerSettingMissing,
    TopicNames,
    WireCode,
    WireError,
    event_to_json,
    event_to_record,
    kafka_config,
    librdkafka_logger,
    record_id,
    record_to_event,
    signer_from_env,
)

__all__ = ["RESULT_EVENTS", "EventPublisher", "RecoveryClient", "Signers", "event_record_id"]

# One producer's signer, or several keyed by producer id.
Signers = RecordSigner | Mapping[str, RecordSigner]


class _FromEnv:
    """The default signer: `RECOVERY_PRODUCER_ID` and `RECOVERY_PRODUCER_KEY_FILE`."""


_FROM_ENV: Final = _FromEnv()

# The result event a capability kind reports when the caller does not name one:
# (on success, on failure). Verification is special: its success names what was found.
RESULT_EVENTS: Final[Mapping[str, tuple[str, str]]] = {
    "retry": ("RETRY_SUCCEEDED", "RETRY_FAILED"),
    "compensate": ("COMPENSATION_SUCCEEDED", "COMPENSATION_FAILED"),
    "stop": ("CONTAINMENT_SUCCEEDED", "CONTAINMENT_FAILED"),
    # A containment is complete when all of its actions are (SPEC §7.3): the revocation
    # and the isolation report their own results, each naming its command.
    "revoke": ("CONTAINMENT_SUCCEEDED", "CONTAINMENT_FAILED"),
    "isolate": ("CONTAINMENT_SUCCEEDED", "CONTAINMENT_FAILED"),
}
_VERIFY_EVENTS: Final = {"applied": "VERIFICATION_FOUND", "not_applied": "VERIFICATION_NOT_FOUND"}
_VERIFY_FAILED: Final = "VERIFICATION_UNAVAILABLE"

# Producer settings that make publishing safe to retry, which callers cannot weaken:
# the broker dedupes the producer's own retries (idempotence), and a record counts as
# written only once all in-sync replicas have it.
_SAFE_PRODUCER: Final[Mapping[str, Any]] = {"enable.idempotence": True, "acks": "all"}
# Defaults callers may change: a record is sent at once (librdkafka's 5 ms linger held
# every failure report that long before it left the tool: about 5 ms of the p50 from a
# report to its command, docs/PERFORMANCE.md; records produced while a request is in
# flight still travel together), and a stuck record fails within the timeout rather
# than hanging a tool forever. librdkafka's own log lines go to Python logging rather
# than straight to stderr.
_DEFAULT_PRODUCER: Final[Mapping[str, Any]] = {
    "linger.ms": 0,
    "delivery.timeout.ms": 30000,
    "logger": librdkafka_logger("client"),
}
_BUFFER_RETRIES: Final = 50
# Where each recently delivered record landed (record id -> topic, partition, offset), for
# finding its dead letter; the oldest are forgotten beyond this many.
_REMEMBERED_DELIVERIES: Final = 10_000
# Broker or client errors that refuse a record for what it is: sent again as it is, it
# is refused again (any other error is an outage, retried).
_REFUSING: Final = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.POLICY_VIOLATION,
    }
)


def roster_file(environ: Mapping[str, str] | None = None) -> Roster | None:
    """The roster `RECOVERY_ROSTER_FILE` names, None when unset; raises `ProducersError`
    naming the variable when the file does not load."""
    path = IdentitySettings.load(environ).roster_file
    if path is None:
        return None
    try:
        return load_roster(path)
    except (OSError, PolicyError) as exc:
        raise ProducersError(
            f"roster {path} (from {ENV_ROSTER_FILE}) does not load: {exc}"
        ) from exc


def _check_signers(roster: Roster, signers: Iterable[RecordSigner]) -> None:
    """Refuse a signer whose key the controller would not accept (`Roster.valid_key`):
    better one clear error at start than every record dead-lettered in silence."""
    now = datetime.now(UTC)
    for signer in signers:
        try:
            roster.valid_key(signer.producer, signer.key_id, at=now)
        except AuthenticationError as exc:
            raise ProducersError(
                f"producer {signer.producer} signs with key {signer.key_id}, which the roster "
                f"refuses ({exc.code}: {exc.reason}): the controller would dead-letter every "
                "record it signs; add the key to the roster (`recoveryctl roster add --id "
                f"{signer.producer} --key-file FILE ...`) and restart the controller, or sign "
                "with a listed key"
            ) from exc


def event_record_id(event: Event) -> str:
    """The deterministic record id of an event: the same event id on the same operation
    always gets the same id, so a consumer can dedupe republished events by header."""
    return record_id("event", event.operation_id, event.event_id)


class EventPublisher:
    """One idempotent producer and the wire format; use as a context manager, or call
    `close` (which flushes). Not thread-safe: give each thread its own publisher."""

    def __init__(
        self,
        bootstrap: str,
        *,
        signer: Signers | _FromEnv | None = _FROM_ENV,
        topics: TopicNames | None = None,
        producer_config: Mapping[str, Any] | None = None,
        use_json: bool = False,
        codec: AvroSingleObjectCodec | None = None,
        security: KafkaSecurity | None = None,
        max_record_bytes: int = MAX_EVENT_RECORD_BYTES,
        roster: Roster | _FromEnv | None = _FROM_ENV,
    ) -> None:
        # `security`: the principal's client settings (else the environment's).
        # `max_record_bytes`: a larger record (key, value, headers) is refused before it
        # is produced (`RecordRefused`): the controller would only dead-letter it.
        # `roster`: the controller's roster (else RECOVERY_ROSTER_FILE's, when set): each
        # signer's key must be in it, and `RecoveryClient.confirm` believes verdicts
        # signed by its controller keys only.
        self._max_record_bytes = max_record_bytes
        if isinstance(signer, _FromEnv):
            try:
                signer = signer_from_env()
            except (SignerSettingMissing, ValueError) as exc:
                raise ProducersError(f"the publisher cannot sign: {exc}") from exc
        self.signers: Mapping[str, RecordSigner] = (
            {}
            if signer is None
            else {signer.producer: signer}
            if isinstance(signer, RecordSigner)
            else dict(signer)
        )
        self.roster = roster_file() if isinstance(roster, _FromEnv) else roster
        if self.roster is not None:
            _check_signers(self.roster, self.signers.values())
        self.bootstrap = bootstrap
        self.security = security
        config: dict[str, Any] = {
            **kafka_config(bootstrap, security),
            **_DEFAULT_PRODUCER,
            **(producer_config or {}),
        }
        config.update(_SAFE_PRODUCER)  # never weakened by caller settings
        self._producer = Producer(config)
        self.topics = topics or TopicNames.from_env()
        self._avro = codec or AvroSingleObjectCodec()
        self._json = JsonCodec() if use_json else None
        self._pending: dict[str, int] = {}
        self._landed: dict[str, tuple[str, int, int]] = {}
        self._failures: list[tuple[str, str]] = []
        self._refused: dict[str, str] = {}
        self._closed = False

    def publish(
        self, event: Event, *, topic: str | None = None, call_context: str | None = None
    ) -> str:
        """Encode `event` and hand it to the producer keyed by its operation id; returns
        its record id. `call_context` (the one the agent's runtime signed for this call,
        `machines.issue_call_context`) travels in the `recovery-call-context` header.
        Raises `WireError` for an event that cannot be encoded (nothing is sent) and
        `ProducersError` when the local queue stays full."""
        if self._json is not None:
            value = self._json.encode(event_to_json(event), EVENT_ENVELOPE)
            content_type, fingerprint = self._json.content_type, None
        else:
            value = self._avro.encode(event_to_record(event), EVENT_ENVELOPE)
            content_type = self._avro.content_type
            fingerprint = self._avro.fingerprint(EVENT_ENVELOPE)
        rid = event_record_id(event)
        self.send(
            topic or self.topics.events,
            key=event.operation_id,
            value=value,
            record_id=rid,
            content_type=content_type,
            fingerprint=fingerprint,
            extra_headers=None if call_context is None else {HEADER_CALL_CONTEXT: call_context},
            producer=event.producer,
        )
        return rid

    def signer_for(self, producer: str) -> RecordSigner:
        """The signer of `producer`; raises `ProducersError` when this publisher holds no
        key for it (an event must be signed by the producer it names)."""
        found = self.signers.get(producer)
        if found is None:
            held = ", ".join(sorted(self.signers)) or "none (signer=None)"
            raise ProducersError(
                f"no signing key for producer {producer!r} (this publisher signs for "
                f"{held}); an event's producer is always its signer's id"
            )
        return found

    def _signer_of(
        self, record_id: str, producer: str | None, extra: Mapping[str, str] | None
    ) -> RecordSigner | None:
        if not self.signers:
            return None  # built with signer=None: the relay's door, or a hostile test's
        if producer is not None:
            return self.signer_for(producer)
        if extra and HEADER_SIGNATURE in extra:
            return None  # already signed by its producer (forwarded as it is)
        if len(self.signers) == 1:
            (only,) = self.signers.values()
            return only
        if self.signers:
            raise ProducersError(
                f"record {record_id}: this publisher signs for several producers; name one"
            )
        return None

    def send(
        self,
        topic: str,
        *,
        key: str,
        value: bytes,
        record_id: str,
        content_type: str,
        fingerprint: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        producer: str | None = None,
    ) -> None:
        """Produce one already-encoded record with the standard headers and the current
        trace context, signed by `producer`'s signer (the only one, if `producer` is not
        given; a record whose `extra_headers` already carry a signature is forwarded as
        it is; unsigned only on a publisher built with `signer=None`). The lower-level
        door the relay and tests use."""
        if self._closed:
            raise ProducersError(f"record {record_id}: the publisher is closed")
        signer = self._signer_of(record_id, producer, extra_headers)
        headers: dict[str, str] = {CONTENT_TYPE: content_type, HEADER_RECORD_ID: record_id}
        if fingerprint is not None:
            headers[HEADER_SCHEMA] = fingerprint
        headers.update(extra_headers or {})
        propagate.inject(headers)
        encoded: list[tuple[str, bytes | None]] = [
            (k, v.encode("utf-8")) for k, v in headers.items()
        ]
        if signer is not None:
            encoded = signer.sign(topic, key.encode("utf-8"), value, encoded)
        self._produce(topic, key.encode("utf-8"), value, encoded, record_id)

    def republish(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
        tracking_id: str,
    ) -> None:
        """Produce a record exactly as it was once consumed: the same key, value bytes
        and headers, nothing added (no trace context, no record id), so whatever its
        producer signed still verifies. `recoveryctl dlq redrive` sends a dead letter's
        original record back through here; `tracking_id` (the dead letter's id) is what
        `flush` reports it under. Raises `ProducersError` when the local queue stays full."""
        if self._closed:
            raise ProducersError(f"record {tracking_id}: the publisher is closed")
        self._produce(topic, key, value, headers, tracking_id)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
        tracking_id: str,
    ) -> None:
        """Hand one record to the producer, tracked under `tracking_id` until its
        delivery report; serves delivery reports while the local queue is full and
        raises `ProducersError` when it stays full, `RecordRefused` when the record is
        larger than this publisher's bound or the client refuses it."""
        size = len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)
        if size > self._max_record_bytes:
            raise RecordRefused(
                tracking_id,
                f"{size} bytes with key and headers, more than the {self._max_record_bytes}"
                f"-byte limit of {topic}",
            )
        self._pending[tracking_id] = self._pending.get(tracking_id, 0) + 1

        def on_delivery(error: KafkaError | None, message: Message[Any, Any]) -> None:
            self._delivered(tracking_id, error)
            if error is None:
                self._note_landed(tracking_id, message)

        kafka_headers: list[tuple[str, str | bytes | None]] = list(headers)
        for _ in range(_BUFFER_RETRIES):
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=kafka_headers, on_delivery=on_delivery
                )
                break
            except BufferError:
                # The local queue is full: serve delivery reports to make room.
                self._producer.poll(0.1)
            except KafkaException as exc:
                self._delivered(tracking_id, None, settled=False)
                raise RecordRefused(tracking_id, str(exc.args[0])) from exc
        else:
            self._delivered(tracking_id, None, settled=False)
            raise ProducersError(
                f"record {tracking_id}: the producer queue stayed full; the broker is slow or "
                "down, flush and retry later"
            )
        self._producer.poll(0)

    def _delivered(self, rid: str, error: KafkaError | None, *, settled: bool = True) -> None:
        if rid not in self._pending:
            # Already reported by an earlier `flush` as unacknowledged; the caller has
            # republished or given up on it, so a late report must not count twice.
            return
        left = self._pending[rid] - 1
        if left > 0:
            self._pending[rid] = left
        else:
            del self._pending[rid]
        if error is not None and settled:
            self._failures.append((rid, str(error)))
            if error.code() in _REFUSING:
                self._refused[rid] = str(error)

    def _note_landed(self, rid: str, message: Message[Any, Any]) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if topic is None or partition is None or offset is None:
            return
        self._landed[rid] = (topic, partition, offset)
        if len(self._landed) > _REMEMBERED_DELIVERIES:
            del self._landed[next(iter(self._landed))]

    def landed(self, record_id: str) -> tuple[str, int, int] | None:
        """Where the broker wrote record `record_id` (topic, partition, offset), once its
        delivery was reported; None before, or when it was not delivered."""
        return self._landed.get(record_id)

    @property
    def pending(self) -> int:
        """Records handed to the producer whose delivery report has not arrived."""
        return sum(self._pending.values())

    def flush(self, timeout: float = 30.0) -> None:
        """Wait up to `timeout` seconds for every delivery report. Raises `DeliveryFailed`
        listing each record the broker refused or that is still unacknowledged."""
        self._producer.flush(timeout)
        failures = self._failures + [(rid, "not acknowledged in time") for rid in self._pending]
        refused, self._failures, self._refused = self._refused, [], {}
        if failures:
            self._pending.clear()
            raise DeliveryFailed(failures, refused)

    def close(self, timeout: float = 30.0) -> None:
        """Flush and release the producer; idempotent. Raises `DeliveryFailed` as `flush`."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            self._producer.close()

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            # Do not hide the original error behind a delivery failure.
            try:
                self.close()
            except DeliveryFailed:
                pass


class RecoveryClient:
    """Builds and publishes valid recovery events on behalf of one producer identity
    (a tool, a capability worker or an approver): the id of a signer the publisher
    holds (`producer`; the publisher's only signer when not given)."""

    def __init__(self, publisher: EventPublisher, producer: str | None = None) -> None:
        if producer is None:
            if len(publisher.signers) != 1:
                raise ProducersError(
                    "name the producer: the publisher signs for "
                    f"{', '.join(sorted(publisher.signers)) or 'nobody'}"
                )
            (producer,) = publisher.signers
        publisher.signer_for(producer)  # refuse an identity it cannot sign as, now
        self.publisher = publisher
        self.producer = producer

    def build_event(
        self,
        event_type: str,
        *,
        operation_id: str,
        correlation_id: str,
        machine_name: str,
        machine_version: str,
        lineage: Lineage,
        evidence_ref: str,
        event_id: str | None = None,
        event_time: datetime | None = None,
        evidence: EvidencePayload | None = None,
        human_decision: HumanDecision | None = None,
        classifier: ClassifierOutput | None = None,
        causation: str | None = None,
        facts: DeclaredFacts | None = None,
        scope: Scope | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Event:
        """A validated `Event` (it goes through `parse_event`, as the controller will):
        a random event id unless one is given, the time now (UTC) unless given. `facts`
        is the tool integration's declaration (CONFORMANCE Level 2): put it on the event
        that opens the operation, since later declarations count only from producers the
        policy trusts and never change facts already declared. `scope` names the
        capability, tool and environment the machine's `applies_to` is checked against.
        `payload` is free-form context for auditors (a JSON object), which the controller
        keeps only as the machine's `audit.redact` and `audit.record` allow (SPEC §10).
        Raises `WireError` (`envelope-invalid`) when the envelope would be refused."""
        event = Event(
            event_type=event_type,
            event_id=event_id or f"evt-{secrets.token_hex(12)}",
            operation_id=operation_id,
            correlation_id=correlation_id,
            machine_name=machine_name,
            machine_version=machine_version,
            event_time=event_time or datetime.now(UTC),
            evidence_ref=evidence_ref,
            producer=self.producer,
            lineage=lineage,
            evidence=evidence,
            human_decision=human_decision,
            classifier=classifier,
            causation=causation,
            facts=facts,
            scope=scope,
            payload=payload,
        )
        # Round-trip through the edge validator so a tool learns of a bad envelope here,
        # not from the dead-letter topic.
        return record_to_event(event.content())

    def publish_event(
        self, event_type: str, *, call_context: str | None = None, **fields: Any
    ) -> Event:
        """`build_event` and publish it; returns the event (flush to confirm delivery).
        With `call_context`, the context the agent's runtime signed for this call
        (`machines.call_context`), the event carries it, and its operation id and
        lineage default to the ones the context names: the controller believes the
        affected agent because the runtime vouched for it, not because the tool says so."""
        if call_context is not None:
            operation_id, lineage = call_context_claims(call_context)
            fields.setdefault("operation_id", operation_id)
            fields.setdefault("lineage", lineage)
        event = self.build_event(event_type, **fields)
        self.publisher.publish(event, call_context=call_context)
        return event

    def action_result(
        self,
        command: CapabilityCommand,
        succeeded: bool,
        evidence: EvidencePayload | None = None,
        *,
        event_type: str | None = None,
        evidence_ref: str | None = None,
        event_time: datetime | None = None,
        retry_after_seconds: int | None = None,
    ) -> Event:
        """The result event of `command`, built but not published (`report_action_result`
        publishes it). Its causation is the command id (SPEC §6.4: an action never
        advances state silently) and everything else is a function of the arguments:
        the event id is `result:<command id>` and the event time, unless given, is the
        command's `issued_at`, so reporting the same outcome of the same command twice
        (a worker that crashed after reporting, before committing) builds the same
        event, which the controller dedupes instead of refusing it as an event-id
        conflict. Without `event_type`, the command's kind picks it (`RESULT_EVENTS`;
        verification by the evidence outcome); a kind without a convention must name
        one. `retry_after_seconds` (whole seconds, 0 or more) goes into the payload: the
        controller commands the operation's next retry no sooner (docs/wire-protocol.md,
        section 5). Raises `ProducersError` for an outcome with no result event or a bad
        `retry_after_seconds`, and `WireError` for an envelope the controller would
        refuse."""
        chosen = event_type or _result_event(command, succeeded, evidence)
        if retry_after_seconds is not None and (
            isinstance(retry_after_seconds, bool)
            or not isinstance(retry_after_seconds, int)
            or retry_after_seconds < 0
        ):
            raise ProducersError(
                f"command {command.command_id}: retry_after_seconds {retry_after_seconds!r} "
                "is not a whole number of seconds, 0 or more"
            )
        if evidence is not None and evidence.outcome is not None:
            # The verifier is whoever reports (and signs) the verification.
            if evidence.verifier is None:
                evidence = replace(evidence, verifier=self.producer)
            elif evidence.verifier != self.producer:
                raise ProducersError(
                    f"command {command.command_id}: evidence names verifier "
                    f"{evidence.verifier!r} but this client reports as {self.producer}; the "
                    "controller refuses it (identity-mismatch): leave verifier unset"
                )
        return self.build_event(
            chosen,
            event_id=f"result:{command.command_id}",
            operation_id=command.operation_id,
            correlation_id=command.correlation_id,
            machine_name=command.machine_name,
            machine_version=command.machine_version,
            lineage=command.lineage,
            evidence_ref=evidence_ref or f"command:{command.command_id}",
            event_time=event_time or command.issued_at,
            evidence=evidence,
            causation=command.command_id,
            payload=None
            if retry_after_seconds is None
            else {"retry_after_seconds": retry_after_seconds},
        )

    def report_action_result(
        self,
        command: CapabilityCommand,
        succeeded: bool,
        evidence: EvidencePayload | None = None,
        *,
        event_type: str | None = None,
        evidence_ref: str | None = None,
        event_time: datetime | None = None,
        retry_after_seconds: int | None = None,
    ) -> Event:
        """Publish `action_result(...)` (see there: the same outcome of the same command
        is the same event); returns it (flush to confirm delivery). Raises as
        `action_result`, and `ProducersError` when the producer queue stays full."""
        event = self.action_result(
            command,
            succeeded,
            evidence,
            event_type=event_type,
            evidence_ref=evidence_ref,
            event_time=event_time,
            retry_after_seconds=retry_after_seconds,
        )
        self.publisher.publish(event)
        return event

    def publish_human_decision(
        self,
        *,
        private_key: Ed25519PrivateKey,
        verdict: Verdict,
        operation_id: str,
        correlation_id: str,
        machine_name: str,
        machine_version: str,
        machine_digest: str,
        state: str,
        transition: str,
        lineage: Lineage,
        expires_at: datetime,
        nonce: str | None = None,
        event_time: datetime | None = None,
        reviewed_digest: str = "",
        for_resume: bool = False,
    ) -> Event:
        """Sign a decision with the approver's Ed25519 key (`machines.approvals`, domain
        v2) and publish it as HUMAN_APPROVED or HUMAN_REJECTED. The approver is this
        client's producer identity; the decision binds the operation, the state the
        approver looked at, the target state, the machine digest, an expiry, a fresh
        nonce and `reviewed_digest`: `machines.review_digest` of the operation's view as
        reviewed (a review packet shows it), which an approval must match when it
        arrives; `for_resume` says the approval is given for the resume itself and binds
        its checkpoint. A rejection needs no digest. `expires_at` must be in UTC: the
        signature covers its ISO-8601 form."""
        if expires_at.utcoffset() != timedelta(0):
            raise WireError(
                WireCode.NON_UTC_TIME,
                f"approval for operation {operation_id}: expires_at {expires_at.isoformat()} "
                "is not UTC; pass datetime.now(UTC) + a duration",
            )
        nonce = nonce or secrets.token_hex(16)
        decision = sign_decision(
            HumanDecision(
                approver=self.producer,
                operation_id=operation_id,
                state=state,
                transition=transition,
                machine_digest=machine_digest,
                expires_at=expires_at,
                nonce=nonce,
                decision=verdict,
                reviewed_digest=reviewed_digest,
                for_resume=for_resume,
            ),
            private_key,
        )
        return self.publish_signed_decision(
            decision,
            correlation_id=correlation_id,
            machine_name=machine_name,
            machine_version=machine_version,
            lineage=lineage,
            event_time=event_time,
        )

    def publish_signed_decision(
        self,
        decision: HumanDecision,
        *,
        correlation_id: str,
        machine_name: str,
        machine_version: str,
        lineage: Lineage,
        event_time: datetime | None = None,
    ) -> Event:
        """Publish a decision an approver signed elsewhere (the reviewer console's page
        signs in the browser) as HUMAN_APPROVED or HUMAN_REJECTED. The record is this
        client's (a producer holding the `approver` role: the approver itself, or a
        service forwarding decisions such as the console); the decision's signature is
        published as it is and proves the approver to the controller
        (`machines.check_decision`)."""
        if not decision.signature:
            raise ProducersError(
                f"decision for operation {decision.operation_id} by {decision.approver} has "
                "no signature; sign it first (`machines.sign_decision`)"
            )
        return self.publish_event(
            "HUMAN_APPROVED" if decision.decision == "approved" else "HUMAN_REJECTED",
            event_id=f"decision:{decision.nonce}",
            operation_id=decision.operation_id,
            correlation_id=correlation_id,
            machine_name=machine_name,
            machine_version=machine_version,
            lineage=lineage,
            evidence_ref=f"approval:{self.producer}:{decision.nonce}",
            event_time=event_time,
            human_decision=decision,
        )

    def publish_migration(
        self,
        decision: HumanDecision,
        *,
        correlation_id: str,
        machine_name: str,
        target_version: str,
        lineage: Lineage,
    ) -> Event:
        """Publish an approver's signed migration of one operation to `target_version`
        of its machine as `MIGRATION_APPROVED` (`machines.migration`: the decision's
        `transition` is the state it maps to, its `reviewed_digest` the plan's
        `machines.migration_digest`). The record is this client's, an `approver`."""
        if not decision.signature:
            raise ProducersError(
                f"migration of operation {decision.operation_id} by {decision.approver} has "
                "no signature; sign it first (`machines.sign_decision`)"
            )
        return self.publish_event(
            MIGRATION_APPROVED,
            event_id=f"migration:{decision.nonce}",
            operation_id=decision.operation_id,
            correlation_id=correlation_id,
            machine_name=machine_name,
            machine_version=target_version,
            lineage=lineage,
            evidence_ref=f"migration:{self.producer}:{decision.nonce}",
            human_decision=decision,
        )

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for delivery of everything published; see `EventPublisher.flush`."""
        self.publisher.flush(timeout)

    def confirm(self, event: Event, timeout: float = 30.0) -> EventVerdict:
        """Flush, then wait at most `timeout` seconds for the controller's verdict on
        `event` (one this client published): decided, with its outcome and states, or
        dead-lettered, with the reason code and text (`producers.EventVerdict.describe` says
        it in a line). Reads the audit topic as this publisher's principal and believes
        only records signed by a controller of the publisher's roster. Raises
        `DeliveryFailed` when the broker did not take the record, `VerdictTimeout`
        (saying what to check) when no verdict came, and `ProducersError` without a
        roster."""
        self.publisher.flush(min(timeout, 30.0))
        with self.verdicts(since=min(event.event_time, datetime.now(UTC))) as reader:
            return reader.wait(
                event.operation_id,
                event.event_id,
                coordinates=self.publisher.landed(event_record_id(event)),
                timeout=timeout,
            )

    def verdicts(self, *, since: datetime) -> VerdictReader:
        """A reader of the controller's verdicts from `since` on (`producers.verdicts`),
        on this publisher's broker, principal, topics and roster: for a process that
        awaits several (a worker's results, for one). Close it when done."""
        roster = self.publisher.roster
        if roster is None:
            raise ProducersError(
                "no roster to believe the controller's verdict with: set RECOVERY_ROSTER_FILE "
                "to the controller's roster (`recoveryctl stack env` names the stack's), or "
                "pass roster= to the EventPublisher"
            )
        return VerdictReader(
            self.publisher.bootstrap,
            roster,
            since=since,
            topics=self.publisher.topics,
            security=self.publisher.security,
        )


def _result_event(
    command: CapabilityCommand, succeeded: bool, evidence: EvidencePayload | None
) -> str:
    if command.kind == "verify":
        if not succeeded:
            return _VERIFY_FAILED
        outcome = evidence.outcome if evidence is not None else None
        if outcome in _VERIFY_EVENTS:
            return _VERIFY_EVENTS[str(outcome)]
    elif command.kind in RESULT_EVENTS:
        success, failure = RESULT_EVENTS[command.kind]
        return success if succeeded else failure
    raise ProducersError(
        f"command {command.command_id} ({command.capability}, kind {command.kind}): no "
        "conventional result event for this outcome; pass event_type= naming the event "
        "the machine expects"
    )
