"""`recoveryctl keys generate|show`: Ed25519 keys of producers and approvers, and their
roster entries.

- `generate --id ID --role ROLE [--role ROLE ...] [--capability C ...] [--tool T ...]
  [--environment E ...] [--agent A ...] [--out FILE] [--roster FILE] [--if-missing]`
  writes a new private key (PKCS#8 PEM, created with mode 0600, never overwriting a
  file; with `--if-missing` an existing key file is kept and used) and the producer's
  roster entry with one grant per role, scoped by the options (`producers:`; the scopes
  each role takes are in docs/operations.md, "Producer roster"). The entry is added to
  the roster file (`--roster`, else `RECOVERY_CONTROLLER_ROSTER_PATH`, else the running
  local stack's `keys/roster.json`) and printed; with no roster file it is only printed.
  On the local stack the key file defaults to `<stack dir>/keys/<ID>.pem`. For role
  `approver` the policy's `approvers:` entry is printed too (`--approval-role`, default
  `recovery-approver`): a human decision is checked against it.
- `show FILE [--id ID] [--role ROLE ...]` prints the key id, public key and entry of an
  existing private key file.

A key file readable by group or others is refused (exit 2) with the `chmod` that fixes
it: whoever reads it can sign as its holder. The private key never leaves the file.
Exit status: 0 done, 2 the file cannot be created or read, or a usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import RulesSettings
from machines import (
    ProducerEntry,
    Role,
    key_id,
    load_private_key,
    public_key_b64,
    public_key_text,
    write_private_key,
)
from ops.context import Context, register_command
from ops.errors import UsageError
from ops.keys import STACK_ROSTER
from ops.roster_file import (
    SCOPE_OPTIONS,
    entry_document,
    grants_for,
    new_entry,
    read_roster_file,
    with_producer,
    write_roster_file,
)

__all__ = ["add_entry_options", "default_roster", "entry_from_flags", "register"]

_APPROVAL_ROLE = "recovery-approver"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `keys` subcommand and its `generate` and `show` actions."""
    parser = subparsers.add_parser(
        "keys",
        help="create and show Ed25519 keys of producers and approvers, with roster entries",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    generate = actions.add_parser(
        "generate", help="write a new private key file (mode 0600) and its roster entry"
    )
    generate.add_argument(
        "--out", type=Path, metavar="FILE", help="default on the local stack: keys/ID.pem"
    )
    generate.add_argument(
        "--if-missing",
        action="store_true",
        help="keep (and use) the key file when it exists instead of refusing",
    )
    add_entry_options(generate, roles_required=True)
    register_command(generate, _generate)
    show = actions.add_parser("show", help="print the public key of a private key file")
    show.add_argument("file", type=Path, metavar="FILE")
    add_entry_options(show, roles_required=False)
    register_command(show, _show)


def add_entry_options(parser: argparse.ArgumentParser, *, roles_required: bool) -> None:
    """`--id`, `--role`, the scope options, `--roster`, `--approval-role` and `--json`."""
    parser.add_argument(
        "--id", required=roles_required, default="PRODUCER-ID", metavar="ID", help="roster id"
    )
    parser.add_argument(
        "--role",
        dest="roles",
        action="append",
        type=Role,
        choices=list(Role),
        required=roles_required,
        metavar="ROLE",
        help=f"a role it holds, repeatable: {', '.join(Role)}",
    )
    scopes = parser.add_argument_group("the scope of its grants (repeatable; '*' is any)")
    for field, option in SCOPE_OPTIONS.items():
        scopes.add_argument(option, dest=field, action="append", default=[], metavar="NAME")
    parser.add_argument(
        "--roster",
        type=Path,
        metavar="FILE",
        help="the roster file to add the entry to (default: RECOVERY_CONTROLLER_ROSTER_PATH, "
        "else the local stack's keys/roster.json)",
    )
    parser.add_argument(
        "--approval-role",
        default=_APPROVAL_ROLE,
        metavar="ROLE",
        help=f"for role approver: the policy's approval role (default {_APPROVAL_ROLE})",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object")


def default_roster(ctx: Context) -> Path | None:
    """`--roster`, else the controller's roster file, else the running stack's."""
    chosen: Path | None = ctx.flag("roster") or RulesSettings.load().roster_path
    if chosen is None and ctx.stack is not None:
        chosen = Path(ctx.stack.stack_dir) / "keys" / STACK_ROSTER
    return chosen


def entry_from_flags(ctx: Context, public_key: str) -> ProducerEntry:
    """The roster entry `--id`, `--role` and the scope options describe, for a key."""
    args = ctx.args
    roles: list[Role] = args.roles or []
    grants = grants_for(roles, {field: getattr(args, field) for field in SCOPE_OPTIONS})
    return new_entry(args.id, public_key, grants)


def _describe(
    ctx: Context, entry: ProducerEntry, key: Ed25519PrivateKey, path: Path
) -> dict[str, Any]:
    args = ctx.args
    report: dict[str, Any] = {
        "file": str(path),
        "key_id": key_id(key.public_key()),
        "public_key": public_key_b64(key),
        "roster_entry": entry_document(entry),
        "roster": None,
        "approvers_entry": None,
    }
    if Role.APPROVER in (args.roles or []):
        report["approvers_entry"] = {
            "id": args.id,
            "public_key": public_key_b64(key),
            "roles": [args.approval_role],
        }
    return report


def _print(ctx: Context, report: dict[str, Any]) -> None:
    if ctx.json:
        ctx.print_json(report)
        return
    ctx.say(f"key id      {report['key_id']}")
    ctx.say(f"public key  {report['public_key']}")
    ctx.say(f"private key {report['file']} (mode 0600; keep it to yourself)")
    ctx.say("roster entry (producers:):")
    ctx.say(_indented([report["roster_entry"]]))
    if report["approvers_entry"] is not None:
        ctx.say("policy entry (approvers:; a human decision is checked against it):")
        ctx.say(_indented([report["approvers_entry"]]))
    if report["roster"] is not None:
        ctx.say(f"added to roster {report['roster']}; restart the controller to load it")


def _indented(document: Any) -> str:
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=None).rstrip()
    return "\n".join(f"  {line}" for line in text.splitlines())


def _key_file(ctx: Context) -> Path:
    args = ctx.args
    if args.out is not None:
        return Path(args.out)
    if ctx.stack is None:
        raise UsageError("pass --out FILE (without a running local stack there is no default)")
    return Path(ctx.stack.stack_dir) / "keys" / f"{args.id}.pem"


def _generate(ctx: Context) -> int:
    """Create the key file (or keep it, `--if-missing`), add the entry to the roster
    file and print both."""
    path = _key_file(ctx)
    entry_from_flags(ctx, public_key_text(Ed25519PrivateKey.generate().public_key()))  # usage
    roster_path = default_roster(ctx)
    roster = read_roster_file(roster_path) if roster_path is not None else None
    if path.exists() and ctx.args.if_missing:
        key = load_private_key(path)
    else:
        key = Ed25519PrivateKey.generate()
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private_key(path, key)  # PEM PKCS#8, mode 0600, never overwriting
        except FileExistsError as exc:
            raise UsageError(
                f"cannot create {path}: it exists, and a key is never overwritten; "
                "`recoveryctl keys show FILE` prints its entry, `--if-missing` keeps it"
            ) from exc
        except OSError as exc:
            raise UsageError(f"cannot create {path}: {exc}") from exc
    entry = entry_from_flags(ctx, public_key_text(key.public_key()))
    report = _describe(ctx, entry, key, path)
    if roster is not None and roster_path is not None:
        write_roster_file(roster_path, with_producer(roster, entry))
        report["roster"] = str(roster_path)
    _print(ctx, report)
    return 0


def _show(ctx: Context) -> int:
    """Print the key id, public key and roster entry of an existing private key file
    (refused when others may read it: `load_private_key`)."""
    path: Path = ctx.args.file
    key = load_private_key(path)
    report = _describe(ctx, entry_from_flags(ctx, public_key_text(key.public_key())), key, path)
    report["mode"] = f"{path.stat().st_mode & 0o777:04o}"
    _print(ctx, report)
    return 0
