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
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import key_id, load_private_key, public_key_b64, write_private_key
from ops.context import Context, register_command
from ops.errors import UsageError

__all__ = ["register"]


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
    register_command(generate, _generate)
    show = actions.add_parser("show", help="print the public key of a private key file")
    show.add_argument("file", type=Path, metavar="FILE")
    register_command(show, _show)
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


def _print(ctx: Context, report: dict[str, Any]) -> None:
    if ctx.json:
        ctx.print_json(report)
        return
    entry = report["roster_entry"]
    ctx.say(f"key id      {report['key_id']}")
    ctx.say(f"public key  {report['public_key']}")
    ctx.say(f"private key {report['file']} (keep it to yourself; mode 0600)")
    ctx.say("policy roster entry (approvers:):")
    ctx.say(f"  - id: {entry['id']}")
    ctx.say(f"    public_key: {entry['public_key']}")
    ctx.say(f"    roles: [{entry['roles'][0]}]")


def _generate(ctx: Context) -> int:
    """Create the key file (refusing to overwrite one) and print its public half."""
    path: Path = ctx.args.out
    key = Ed25519PrivateKey.generate()
    try:
        write_private_key(path, key)  # PEM PKCS#8, mode 0600, never overwriting
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc}") from exc
    _print(ctx, _describe(key, ctx.args, path))
    return 0


def _show(ctx: Context) -> int:
    """Print the key id, public key and roster entry of an existing private key file."""
    path: Path = ctx.args.file
    key = load_private_key(path)
    report = _describe(key, ctx.args, path)
    mode = path.stat().st_mode & 0o777
    report["mode"] = f"{mode:04o}"
    _print(ctx, report)
    if mode & 0o077:
        print(
            f"warning: {path} is readable by others (mode {mode:04o}); chmod 600 it", file=ctx.err
        )
    return 0
