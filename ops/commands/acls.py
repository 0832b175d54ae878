"""`recoveryctl acls show`: list the broker's ACLs (table, or `--json`).

Lists every ACL binding on the broker named by --bootstrap, RECOVERY_KAFKA_BOOTSTRAP or
the running local stack, connecting with the environment's RECOVERY_KAFKA_* security
settings, else as the local stack's admin principal. `recoveryctl topics create`
provisions them (`producers.acl_bindings`; docs/operations.md, "Kafka security").
Exit status: 0 listed, 1 the broker refused, 2 no broker known.
"""

from __future__ import annotations

import argparse
import json
import sys

from ops.commands.topics import admin_connection
from producers import ProvisionError, list_acls
from schemas import ENV_KAFKA_BOOTSTRAP, KafkaConfigError

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
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    try:
        connection = admin_connection(args.bootstrap)
    except KafkaConfigError as exc:
        print(f"recoveryctl acls show: {exc}", file=err)
        return 2
    if connection is None:
        print(
            f"recoveryctl acls show: no broker known; pass --bootstrap, set "
            f"{ENV_KAFKA_BOOTSTRAP}, or run `recoveryctl stack up` first",
            file=err,
        )
        return 2
    bootstrap, security = connection
    try:
        report = list_acls(bootstrap, security=security)
    except (ProvisionError, KafkaConfigError) as exc:
        print(f"recoveryctl acls show: {exc}", file=err)
        return 1
    rows = [entry.to_dict() for entry in report.entries]
    if args.json:
        payload = {"bootstrap": bootstrap, "authorizer": report.enabled, "acls": rows}
        print(json.dumps(payload, indent=2), file=out)
        return 0
    if not report.enabled:
        print(f"{bootstrap}: the broker has no authorizer; every client may do anything", file=out)
        return 0
    if not rows:
        print(f"{bootstrap}: no ACLs (provision them with `recoveryctl topics create`)", file=out)
        return 0
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in _COLUMNS}
    print("  ".join(c.upper().ljust(widths[c]) for c in _COLUMNS).rstrip(), file=out)
    for row in rows:
        print("  ".join(row[c].ljust(widths[c]) for c in _COLUMNS).rstrip(), file=out)
    print(f"{len(rows)} bindings on {bootstrap} ({security.describe()})", file=out)
    return 0
