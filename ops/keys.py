"""Keys the local stack generates for its components (never public-name keys).

`stack_key(name)` is `<stack dir>/keys/<name>.key`: an Ed25519 private key (PEM PKCS#8,
mode 0600, in a 0700 folder), created on first use and kept for the stack's life, so a
demo run on a reused stack signs with the same controller key as the last one.
`stack_roster()` is `<stack dir>/keys/roster.json`, a `producers:`-only roster naming
the controller (`recovery-controller`, role `controller`) with that key's public half,
and every producer `recoveryctl keys generate` or `roster add` put there: the roster the
stack's controller runs with (`recoveryctl run` on the stack) and its workers, tools and
auditors verify with (`RECOVERY_ROSTER_FILE`). `recoveryctl stack up` makes both.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    Grant,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    load_private_key,
    public_key_text,
    write_private_key,
)
from ops.paths import stack_dir
from ops.roster_file import read_roster_file, write_roster_file
from schemas import DEFAULT_CONTROLLER_ID

__all__ = ["STACK_ROSTER", "controller_roster", "stack_key", "stack_roster"]

# The stack's roster, in its keys folder: the controller, and every producer added.
STACK_ROSTER = "roster.json"


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


def controller_roster(key_file: Path, producer: str = DEFAULT_CONTROLLER_ID) -> Roster:
    """A worker's roster holding the controller whose private key is in `key_file`."""
    public = public_key_text(load_private_key(key_file).public_key())
    return Roster(
        producers=(
            ProducerEntry(
                id=producer,
                keys=(ProducerKey(public_key=public),),
                grants=(Grant(role=Role.CONTROLLER, capabilities=("*",)),),
            ),
        )
    )


def stack_roster(directory: Path | None = None) -> Path:
    """The stack's roster file naming its controller key (both made when missing). The
    producers added to it (`recoveryctl keys generate`, `recoveryctl roster add`) are
    kept; the controller's entry is written again from its key."""
    key = stack_key("controller", directory)
    path = key.parent / STACK_ROSTER
    own = controller_roster(key)
    kept = read_roster_file(path).producers if path.exists() else ()
    others = tuple(p for p in kept if p.id != DEFAULT_CONTROLLER_ID)
    write_roster_file(path, Roster(producers=(*own.producers, *others)))
    return path
