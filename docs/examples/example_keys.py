"""Keys and the producer roster of the guides' examples (docs/tool-integration.md,
"Signing"): the tool integration `coupa-integration` and the capability worker
`coupa-worker`, each with its own Ed25519 key, and the roster that tells the controller
who they are and what each may report.

    python docs/examples/example_keys.py .stack/example-keys
    RECOVERY_CONTROLLER_POLICY_PATH=docs/examples/policy.yaml \\
    RECOVERY_CONTROLLER_ROSTER_PATH=.stack/example-keys/roster.json \\
        recoveryctl run --migrate --create-topics &
    python docs/examples/tool_timeout.py --keys .stack/example-keys

Each key file is written once, mode 0600; running it again keeps the keys and rewrites
the roster. The roster's grants are the examples' least privilege: the tool reports
`procurement.create-request` calls through `coupa` for `procurement-agent`; the worker
executes the procurement capabilities and answers the verification (it is the status-API
verifier, so its own id is the verifier in its evidence).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import load_private_key, public_key_text, write_private_key
from schemas import RecordSigner

TOOL: Final = "coupa-integration"
WORKER: Final = "coupa-worker"
AGENT: Final = "procurement-agent"
_PROCUREMENT: Final = ["procurement.create-request", "procurement.verify-request"]

GRANTS: Final[dict[str, list[dict[str, Any]]]] = {
    TOOL: [
        {
            "role": "tool",
            "capabilities": ["procurement.create-request"],
            "tools": ["coupa"],
            "environments": ["production", "staging"],
            "agents": [AGENT],
        }
    ],
    WORKER: [
        {"role": "worker", "capabilities": _PROCUREMENT},
        {"role": "verifier", "capabilities": _PROCUREMENT},
    ],
}


def key_path(folder: Path, producer: str) -> Path:
    """Where `producer`'s private key lives in `folder`."""
    return folder / f"{producer}.pem"


def generate(folder: Path) -> Path:
    """Make each producer's key (once) and write `folder/roster.json`; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    producers = []
    for producer, grants in GRANTS.items():
        path = key_path(folder, producer)
        if not path.exists():
            write_private_key(path, Ed25519PrivateKey.generate())
        public = public_key_text(load_private_key(path).public_key())
        producers.append({"id": producer, "keys": [{"public_key": public}], "grants": grants})
    roster = folder / "roster.json"
    roster.write_text(json.dumps({"producers": producers}, indent=2), encoding="utf-8")
    return roster


def signer(folder: Path, producer: str) -> RecordSigner:
    """The record signer of `producer` from its key file in `folder`."""
    return RecordSigner(producer, load_private_key(key_path(folder, producer), setting="--keys"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: example_keys.py DIRECTORY", file=sys.stderr)
        sys.exit(2)
    print(generate(Path(sys.argv[1])))
