"""Keys derived from public names, for test cases, simulations and the demo only.

`insecure_test_key(name)` turns a name into an Ed25519 private key deterministically, so
a test case or the demo can sign as an approver without shipping a secret. Anyone who
knows the name can compute the same key, so a key from here is no authentication at all:
`machines.policy.public_name_keys` finds them in a policy and the controller refuses to
start with one outside its demo mode (docs/controller.md, "Policy and demo mode").
"""

from __future__ import annotations

import base64
import hashlib
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = ["insecure_test_key", "public_name_key_b64"]

_SEED_PREFIX: Final = "agent-recovery test key:"


def insecure_test_key(seed_name: str) -> Ed25519PrivateKey:
    """A deterministic private key derived from a name, for test cases and simulations
    only: anyone who knows the name can sign, so a production roster never uses these."""
    seed = hashlib.sha256(f"{_SEED_PREFIX}{seed_name}".encode()).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_name_key_b64(seed_name: str) -> str:
    """The public key of `insecure_test_key(seed_name)`, raw and base64, as a policy
    roster stores public keys."""
    raw = insecure_test_key(seed_name).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")
