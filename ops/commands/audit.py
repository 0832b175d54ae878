"""`recoveryctl audit verify [--operation ID] [--database-url URL] [--json]`.

Recomputes the hash chain of every operation's audit records (or of one operation) from
the ledger database and reports, per broken chain, the first break: the operation, the
sequence, and the expected versus the found hash (or sequence). A record altered,
deleted in the middle or deleted at the end (the operation row keeps the chain head) is
detected. Exit status: 0 every chain intact, 1 a chain is broken, 2 no database known or
reachable, or the operation is unknown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from ledger import (
    ChainBreak,
    LedgerError,
    SigningKeyError,
    key_id,
    load_signing_key,
    public_key_text,
)
from ops.commands.db import add_ledger_options, open_ledger

__all__ = ["register", "run_key", "run_verify"]

KEY_FILE_SETTING = "RECOVERY_CONTROLLER_SIGNING_KEY_FILE"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `audit` subcommand and its `verify` action."""
    parser = subparsers.add_parser(
        "audit",
        help="verify the hash-chained audit records in the ledger",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="audit_action", metavar="ACTION", required=True)
    verify = actions.add_parser("verify", help="recompute audit chains; report the first break")
    verify.add_argument("--operation", metavar="ID", help="verify one operation's chain only")
    add_ledger_options(verify)
    verify.set_defaults(handler=run_verify)
    key = actions.add_parser("key", help="print the controller's audit signing public key")
    key.add_argument(
        "--key-file", metavar="PATH", help=f"the Ed25519 key file (default: ${KEY_FILE_SETTING})"
    )
    key.add_argument("--json", action="store_true", help="print a JSON object")
    key.set_defaults(handler=run_key)


def run_key(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the key id and public key of the signing key; 0 shown, 2 no usable key."""
    out = out or sys.stdout
    err = err or sys.stderr
    path = args.key_file or os.environ.get(KEY_FILE_SETTING)
    if not path:
        print(
            f"recoveryctl audit key: no key file: pass --key-file or set {KEY_FILE_SETTING}",
            file=err,
        )
        return 2
    try:
        public = load_signing_key(path).public_key()
    except SigningKeyError as exc:
        print(f"recoveryctl audit key: {exc}", file=err)
        return 2
    if args.json:
        print(
            json.dumps({"key_id": key_id(public), "public_key": public_key_text(public)}), file=out
        )
    else:
        print(f"{key_id(public)} {public_key_text(public)}", file=out)
    return 0


def _break_json(found: ChainBreak) -> dict[str, object]:
    return {
        "operation_id": found.operation_id,
        "sequence": found.sequence,
        "reason": found.reason,
        "expected": found.expected,
        "found": found.found,
    }


def run_verify(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Verify the chains; print the verdict; return 0 intact, 1 broken, 2 unusable."""
    out = out or sys.stdout  # looked up per call, so a redirected stdout is honoured
    err = err or sys.stderr
    ledger = open_ledger("audit verify", args.database_url, err)
    if ledger is None:
        return 2
    try:
        if args.operation is not None and args.operation not in ledger.audit_operation_ids():
            print(
                f"recoveryctl audit verify: operation {args.operation} has no operation row "
                "and no audit record in this ledger",
                file=err,
            )
            return 2
        checked = (args.operation,) if args.operation else ledger.audit_operation_ids()
        breaks = ledger.verify_audit(args.operation)
    except LedgerError as exc:
        print(f"recoveryctl audit verify: {exc}", file=err)
        return 2
    finally:
        ledger.close()
    if args.json:
        body = {
            "intact": not breaks,
            "chains_checked": len(checked),
            "breaks": [_break_json(b) for b in breaks],
        }
        print(json.dumps(body, indent=2), file=out)
    else:
        for found in breaks:
            print(f"BROKEN {found.describe()}", file=out)
        if not breaks:
            print(f"audit intact: {len(checked)} chain(s) verified", file=out)
        else:
            print(f"audit BROKEN: {len(breaks)} of {len(checked)} chain(s)", file=out)
    return 1 if breaks else 0
