"""Keys the local stack generates for its components (never public-name keys).

`stack_key(name)` is `<stack dir>/keys/<name>.key`: an Ed25519 private key (PEM PKCS#8,
mode 0600, in a 0700 folder), created on first use and kept for the stack's life, so a
demo run on a reused stack signs with the same controller key as the last one.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import write_private_key
from ops.paths import stack_dir

__all__ = ["stack_key"]


def stack_key(name: str, directory: Path | None = None) -> Path:
    """The path of the stack's key `name`, generated when missing."""
    folder = (directory or stack_dir()) / "keys"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{name}.key"
    if not path.exists():
        try:
            write_private_key(path, Ed25519PrivateKey.generate())
        except FileExistsError:
            pass  # another process of the stack made it first: use theirs
    return path
