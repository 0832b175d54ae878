"""Keys the test session signs with: generated per session, never public-name keys.

`ensure_controller_key()` (called by tests/conftest.py at import) makes the session's
controller key and points `RECOVERY_CONTROLLER_SIGNING_KEY_FILE` at it unless the
environment already names one, so every controller the tests start (in-process or as a
child process, which inherits the variable) signs its output. `controller_key()` is that
key, for tests that verify what the controller signed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import load_private_key, public_key_text, write_private_key
from schemas import (
    DEFAULT_CONTROLLER_ID,
    DEFAULT_TOPICS,
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    OutboxSigner,
    RecordSigner,
)

__all__ = [
    "controller_key",
    "controller_public_key",
    "controller_signer",
    "ensure_controller_key",
    "new_key_file",
]


@cache
def _folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="recovery-test-keys-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def new_key_file(name: str) -> tuple[Path, Ed25519PrivateKey]:
    """A fresh key written to the session's key folder as `<name>.key` (0600)."""
    key = Ed25519PrivateKey.generate()
    path = _folder() / f"{name}-{os.urandom(4).hex()}.key"
    write_private_key(path, key)
    return path, key


def ensure_controller_key() -> Path:
    """The session's controller key file, set in the environment (see the docstring)."""
    given = os.environ.get(ENV_CONTROLLER_SIGNING_KEY_FILE)
    if given:
        return Path(given)
    path, _ = new_key_file("controller")
    os.environ[ENV_CONTROLLER_SIGNING_KEY_FILE] = str(path)
    return path


def controller_key() -> Ed25519PrivateKey:
    """The session controller's private key."""
    return load_private_key(ensure_controller_key())


def controller_public_key() -> str:
    """The session controller's public key, base64 (the roster's form)."""
    return public_key_text(controller_key().public_key())


def controller_signer() -> OutboxSigner:
    """The session controller's row signer, for tests that write a ledger's batches
    themselves: `recoveryctl audit verify` proves every audit row with its key."""
    return OutboxSigner(RecordSigner(DEFAULT_CONTROLLER_ID, controller_key()), DEFAULT_TOPICS)
