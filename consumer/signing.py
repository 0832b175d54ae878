"""The controller's key: every record the controller emits is signed with it.

The controller loads its Ed25519 key from `RECOVERY_CONTROLLER_SIGNING_KEY_FILE`
(`ControllerSettings.signing_key_file`) at startup and signs each outbox row when the
commit builds it (`schemas.OutboxSigner`, passed to the ledger with the batch): commands
on `recovery.commands`, cascade events on `recovery.events`, audit records on
`recovery.audit`, evidence on `recovery.evidence` and dead letters on `recovery.dlq`. The
relay, a lower-trust component, never holds the key and publishes the stored signature as
it is; a relay that changed a byte would break it. Without a key the controller does not
start (fail closed), and says which variable to set.
"""

from __future__ import annotations

from consumer.errors import ControllerError
from consumer.settings import ControllerSettings
from machines import KeyFileError, key_id, load_private_key
from schemas import ENV_CONTROLLER_SIGNING_KEY_FILE, OutboxSigner, RecordSigner

__all__ = ["controller_signer"]


def controller_signer(settings: ControllerSettings) -> OutboxSigner:
    """The signer of the controller's outbox rows, from its key file. Raises
    `ControllerError` naming the variable when no key is configured or it is unusable."""
    path = settings.signing_key_file
    if path is None:
        raise ControllerError(
            "the controller signs every record it emits and has no key: set "
            f"{ENV_CONTROLLER_SIGNING_KEY_FILE} to its Ed25519 private key file (PEM "
            "PKCS#8, mode 0600; create one with `recoveryctl keys generate --out FILE`) "
            "and list its public key under the controller's `producers` entry in the "
            "policy (role `controller`)"
        )
    try:
        key = load_private_key(path, setting=ENV_CONTROLLER_SIGNING_KEY_FILE)
    except KeyFileError as exc:
        raise ControllerError(f"controller cannot start: {exc}") from exc
    signer = RecordSigner(settings.producer_id, key, key_id(key.public_key()))
    return OutboxSigner(signer, settings.topics)
