"""Publishing hand-built commands on the commands topic, signed or not, as the controller
(through its relay) or an attacker with a Kafka client would."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import Grant, ProducerEntry, ProducerKey, Role, Roster, public_key_text
from producers import EventPublisher
from schemas import (
    CAPABILITY_COMMAND,
    CONTENT_TYPE,
    DEFAULT_CONTROLLER_ID,
    HEADER_COMMAND_ID,
    HEADER_KEY_ID,
    HEADER_PRODUCER,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    HEADER_SIGNATURE,
    AvroSingleObjectCodec,
    CapabilityCommand,
    RecordSigner,
)
from tests.support.keys import controller_key

__all__ = ["controller_signer", "send_command", "worker_roster"]


def controller_signer() -> RecordSigner:
    """The session controller's record signer."""
    return RecordSigner(DEFAULT_CONTROLLER_ID, controller_key())


def worker_roster(*extra: ProducerEntry, key: Ed25519PrivateKey | None = None) -> Roster:
    """A worker's roster: the session controller (role `controller`) and `extra`."""
    public = public_key_text((key or controller_key()).public_key())
    controller = ProducerEntry(
        id=DEFAULT_CONTROLLER_ID,
        keys=(ProducerKey(public_key=public),),
        grants=(Grant(role=Role.CONTROLLER, capabilities=("*",)),),
    )
    return Roster(producers=(controller, *extra))


def send_command(
    publisher: EventPublisher,
    topic: str,
    command: CapabilityCommand,
    signer: RecordSigner | None = None,
) -> None:
    """Publish `command` as the relay does (Avro, standard headers), signed by `signer`
    over the exact record when given, unsigned otherwise."""
    codec = AvroSingleObjectCodec()
    value = codec.encode(command.to_record(), CAPABILITY_COMMAND)
    extra = {HEADER_COMMAND_ID: command.command_id}
    if signer is not None:
        headers: list[tuple[str, bytes | None]] = [
            (CONTENT_TYPE, codec.content_type.encode()),
            (HEADER_RECORD_ID, command.command_id.encode()),
            (HEADER_SCHEMA, codec.fingerprint(CAPABILITY_COMMAND).encode()),
            (HEADER_COMMAND_ID, command.command_id.encode()),
        ]
        signed = dict(signer.sign(topic, command.operation_id.encode(), value, headers))
        for name in (HEADER_PRODUCER, HEADER_KEY_ID, HEADER_SIGNATURE):
            extra[name] = (signed[name] or b"").decode()
    publisher.send(
        topic,
        key=command.operation_id,
        value=value,
        record_id=command.command_id,
        content_type=codec.content_type,
        fingerprint=codec.fingerprint(CAPABILITY_COMMAND),
        extra_headers=extra,
    )
