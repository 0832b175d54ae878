"""`recoveryctl acls show`: list the broker's ACLs (table, or `--json`).

Lists every ACL binding on the broker named by --bootstrap, RECOVERY_KAFKA_BOOTSTRAP or
the running local stack, connecting with the environment's RECOVERY_KAFKA_* security
settings, else as the local stack's admin principal. `recoveryctl topics create`
provisions them (`producers.acl_bindings`; docs/operations.md, "Kafka security").
Exit status: 0 listed, 1 the broker refused, 2 no broker known.
"""

from __future__ import annotations

import argparse

from ops.context import Context, register_command, table
from producers import list_acls

__all__ = ["register"]

_COLUMNS = ("principal", "permission", "operation", "resource_type", "resource", "pattern")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `acls` subcommand and its `show` action."""
    parser = subparsers.add_parser(
        "acls",
        help="list the Kafka ACLs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="list every ACL binding on the broker")
    show.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    show.add_argument("--json", action="store_true", help="print the bindings as JSON")
    register_command(show, _show)


def _show(ctx: Context) -> int:
    bootstrap, security = ctx.bootstrap(), ctx.kafka("admin")
    report = list_acls(bootstrap, security=security)
    rows = [entry.to_dict() for entry in report.entries]
    if ctx.json:
        ctx.print_json({"bootstrap": bootstrap, "authorizer": report.enabled, "acls": rows})
    elif not report.enabled:
        ctx.say(f"{bootstrap}: the broker has no authorizer; every client may do anything")
    elif not rows:
        ctx.say(f"{bootstrap}: no ACLs (provision them with `recoveryctl topics create`)")
    else:
        ctx.say(table(_COLUMNS, [[row[c] for c in _COLUMNS] for row in rows]))
        ctx.say(f"{len(rows)} bindings on {bootstrap} ({security.describe()})")
    return 0
