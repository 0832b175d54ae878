"""`recoveryctl roster show|add|remove|revoke`: the producer roster file, one entry at a
time.

- `show` lists each producer with its key ids (and whether each is usable now) and
  grants.
- `add --id ID (--key-file PEM | --public-key B64) --role ROLE [--role ...]
  [--capability C ...] [--tool T ...] [--environment E ...] [--agent A ...]` adds the
  producer, or to a listed producer the key and grants it lacks. `--print` writes
  nothing and prints the entry (to paste under a policy's `producers:`).
- `remove --id ID` drops a producer; `revoke --id ID --key-id KEY` marks one of its keys
  revoked (records signed with it are refused as `key-revoked`).

The file is `--roster FILE`, else `RECOVERY_CONTROLLER_ROSTER_PATH`, else the running
local stack's `keys/roster.json` (the one its controller, workers and tools read). It is
validated as the controller loads it and written whole; a policy file is refused (its
comments would be lost). Restart the controller after a change. Exit status: 0 done, 2
usage (no roster file, an unknown producer or key, a policy file).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import yaml

from machines import AuthenticationError, Grant, Roster, load_private_key, public_key_text
from ops.commands.keys import add_entry_options, default_roster, entry_from_flags
from ops.context import Context, register_command, table
from ops.errors import UsageError
from ops.roster_file import (
    SCOPE_OPTIONS,
    entry_document,
    read_roster_file,
    with_producer,
    with_revoked_key,
    without_producer,
    write_roster_file,
)

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `roster` and its `show`, `add`, `remove` and `revoke` actions."""
    parser = subparsers.add_parser(
        "roster",
        help="show and edit the producer roster file (who may sign which records)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="roster_action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="list the producers, their keys and grants")
    show.add_argument("--roster", type=Path, metavar="FILE", help="default: see above")
    show.add_argument("--json", action="store_true", help="print the roster as JSON")
    register_command(show, _show)

    add = actions.add_parser("add", help="add a producer, or a key and grants to one")
    key = add.add_mutually_exclusive_group(required=True)
    key.add_argument("--key-file", type=Path, metavar="PEM", help="its private key file")
    key.add_argument("--public-key", metavar="B64", help="its raw public key, base64")
    add.add_argument("--print", action="store_true", help="print the entry, write nothing")
    add_entry_options(add, roles_required=True)
    register_command(add, _add)

    remove = actions.add_parser("remove", help="remove a producer")
    remove.add_argument("--id", required=True, metavar="ID")
    remove.add_argument("--roster", type=Path, metavar="FILE", help="default: see above")
    register_command(remove, _remove)

    revoke = actions.add_parser("revoke", help="mark one key of a producer revoked")
    revoke.add_argument("--id", required=True, metavar="ID")
    revoke.add_argument("--key-id", required=True, metavar="KEY", help="ed25519:...")
    revoke.add_argument("--roster", type=Path, metavar="FILE", help="default: see above")
    register_command(revoke, _revoke)


def _file(ctx: Context) -> Path:
    found = default_roster(ctx)
    if found is None:
        raise UsageError(
            "no roster file: pass --roster FILE, set RECOVERY_CONTROLLER_ROSTER_PATH, or run "
            "`recoveryctl stack up` (its roster is keys/roster.json in the stack dir)"
        )
    return found


def _show(ctx: Context) -> int:
    path = _file(ctx)
    roster = read_roster_file(path)
    if ctx.json:
        ctx.print_json(
            {"roster": str(path), "producers": [entry_document(p) for p in roster.producers]}
        )
        return 0
    now = datetime.now(UTC)
    rows = []
    for producer in roster.producers:
        keys = ", ".join(
            f"{k.key_id}{'' if _usable(roster, producer.id, k.key_id, now) else ' (not usable)'}"
            for k in producer.keys
        )
        grants = "; ".join(
            " ".join([str(g.role), *(f"{f}={','.join(v)}" for f, v in _scope(g) if v)])
            for g in producer.grants
        )
        rows.append((producer.id, keys, grants or "-"))
    ctx.say(table(("producer", "keys", "grants"), rows))
    ctx.say(f"{len(rows)} producer(s) in {path}")
    return 0


def _usable(roster: Roster, producer: str, key_id: str, now: datetime) -> bool:
    try:
        roster.valid_key(producer, key_id, at=now)
    except AuthenticationError:
        return False
    return True


def _scope(grant: Grant) -> list[tuple[str, tuple[str, ...]]]:
    return [(name, getattr(grant, name)) for name in SCOPE_OPTIONS]


def _add(ctx: Context) -> int:
    args = ctx.args
    if args.key_file is not None:
        public = public_key_text(load_private_key(args.key_file).public_key())
    else:
        public = args.public_key
    try:
        entry = entry_from_flags(ctx, public)
    except ValueError as exc:  # pydantic: not an Ed25519 public key
        raise UsageError(f"--public-key: {exc}") from exc
    if args.print:
        if ctx.json:
            ctx.print_json(entry_document(entry))
        else:
            ctx.say(_yaml(entry_document(entry)))
        return 0
    path = _file(ctx)
    write_roster_file(path, with_producer(read_roster_file(path), entry))
    ctx.say(f"added {entry.id} ({entry.keys[0].key_id}) to {path}; restart the controller")
    return 0


def _yaml(document: object) -> str:
    return yaml.safe_dump([document], sort_keys=False, default_flow_style=None).rstrip()


def _remove(ctx: Context) -> int:
    path = _file(ctx)
    write_roster_file(path, without_producer(read_roster_file(path), ctx.args.id))
    ctx.say(f"removed {ctx.args.id} from {path}; restart the controller")
    return 0


def _revoke(ctx: Context) -> int:
    path = _file(ctx)
    args = ctx.args
    write_roster_file(path, with_revoked_key(read_roster_file(path), args.id, args.key_id))
    ctx.say(f"revoked key {args.key_id} of {args.id} in {path}; restart the controller")
    return 0
