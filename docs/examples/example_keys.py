"""Who the guides' examples sign as (docs/tool-integration.md, "Signing"): the tool
integration `coupa-integration` and the capability worker `coupa-worker`, each with its
own Ed25519 key, made with their roster entries as the guides say:

    recoveryctl keys generate --id coupa-integration --role tool \\
        --capability procurement.create-request --tool coupa --environment production \\
        --agent procurement-agent --if-missing
    recoveryctl keys generate --id coupa-worker --role worker --role verifier \\
        --capability procurement.create-request --capability procurement.verify-request \\
        --if-missing

On the local stack that writes `<stack dir>/keys/<id>.pem` (0600) and adds each entry to
the stack's roster (`keys/roster.json`), which its controller runs with. The grants are
the examples' least privilege: the tool reports `procurement.create-request` calls
through `coupa` for `procurement-agent`; the worker executes the procurement
capabilities and answers the verification (it is the status-API verifier, so its own id
is the verifier in its evidence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from machines import load_private_key
from ops.paths import stack_dir
from schemas import RecordSigner

TOOL: Final = "coupa-integration"
WORKER: Final = "coupa-worker"
AGENT: Final = "procurement-agent"


def default_keys() -> Path:
    """The local stack's keys folder, where `recoveryctl keys generate` put the keys."""
    return stack_dir() / "keys"


def signer(folder: Path, producer: str) -> RecordSigner:
    """The record signer of `producer` from its key file `folder/<producer>.pem`."""
    return RecordSigner(producer, load_private_key(folder / f"{producer}.pem", setting="--keys"))
