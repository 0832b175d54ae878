"""`recoveryctl keys generate|show`: Ed25519 keys for approvers and producers.

- `generate --out FILE [--id NAME] [--role ROLE]` writes a new private key (PKCS#8 PEM,
  created with mode 0600, never overwriting a file) and prints its key id and public
  key, with the roster entry to add to the policy's `approvers` (for an approver; a
  producer's public key goes where the deployment registers producers).
- `show FILE [--id NAME] [--role ROLE]` prints the same for an existing private key file.

The private key never leaves the file: `recoveryctl approve --key-file FILE` signs with
it locally. Exit status: 0 done, 2 the file cannot be created or read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import key_id, public_key_b64, write_private_key
from ops.commands.output import print_json
from ops.commands.review import load_private_key

__all__ = ["register", "run_generate", "run_show"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `keys` subcommand and its `generate` and `show` actions."""
    parser = subparsers.add_parser(
        "keys",
        help="create and show Ed25519 keys of approvers and producers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    generate = actions.add_parser("generate", help="write a new private key file (mode 0600)")
    generate.add_argument("--out", type=Path, required=True, metavar="FILE")
    generate.set_defaults(handler=run_generate)
    show = actions.add_parser("show", help="print the public key of a private key file")
    show.add_argument("file", type=Path, metavar="FILE")
    show.set_defaults(handler=run_show)
    for child in (generate, show):
        child.add_argument("--id", default="APPROVER-ID", metavar="NAME", help="roster id")
        child.add_argument(
            "--role", default="recovery-approver", metavar="ROLE", help="roster role"
        )
        child.add_argument("--json", action="store_true", help="print a JSON object")


def _describe(key: Ed25519PrivateKey, args: argparse.Namespace, path: Path) -> dict[str, Any]:
    return {
        "file": str(path),
        "key_id": key_id(key.public_key()),
        "public_key": public_key_b64(key),
        "roster_entry": {"id": args.id, "public_key": public_key_b64(key), "roles": [args.role]},
    }


def _print(report: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        print_json(report, out)
        return
    entry = report["roster_entry"]
    print(f"key id      {report['key_id']}", file=out)
    print(f"public key  {report['public_key']}", file=out)
    print(f"private key {report['file']} (keep it to yourself; mode 0600)", file=out)
    print("policy roster entry (approvers:):", file=out)
    print(f"  - id: {entry['id']}", file=out)
    print(f"    public_key: {entry['public_key']}", file=out)
    print(f"    roles: [{entry['roles'][0]}]", file=out)


def run_generate(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Create the key file (refusing to overwrite one) and print its public half."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    key = Ed25519PrivateKey.generate()
    try:
        write_private_key(args.out, key)  # PEM PKCS#8, mode 0600, never overwriting
    except OSError as exc:
        print(f"recoveryctl keys generate: cannot create {args.out}: {exc}", file=err)
        return 2
    _print(_describe(key, args, args.out), args, out)
    return 0


def run_show(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the key id, public key and roster entry of an existing private key file."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    try:
        key = load_private_key(args.file)
    except ValueError as exc:
        print(f"recoveryctl keys show: {exc}", file=err)
        return 2
    report = _describe(key, args, args.file)
    mode = args.file.stat().st_mode & 0o777
    report["mode"] = f"{mode:04o}"
    _print(report, args, out)
    if mode & 0o077:
        print(
            f"warning: {args.file} is readable by others (mode {mode:04o}); chmod 600 it",
            file=err,
        )
    return 0
