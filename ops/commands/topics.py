"""`recoveryctl topics create`: provision the recovery topics and their ACLs (idempotent).

Creates recovery.events, recovery.commands, recovery.evidence, recovery.audit and
recovery.dlq (names overridable with RECOVERY_TOPIC_EVENTS ... RECOVERY_TOPIC_DLQ) on
the broker named by --bootstrap, RECOVERY_KAFKA_BOOTSTRAP, or the running local stack,
and on a broker with an authorizer the least-privilege ACLs of each component's
principal on them (`producers.acl_bindings`; `recoveryctl acls show` lists them).
Existing topics and ACLs are left as they are. It connects with the RECOVERY_KAFKA_*
security settings of the environment, else as the local stack's admin principal.
Exit status: 0 done, 1 the broker refused, 2 no broker known.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ops.context import Context, register_command
from producers import provision, provision_acls

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `topics` subcommand and its `create` action."""
    parser = subparsers.add_parser(
        "topics",
        help="provision the recovery Kafka topics and their ACLs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create the topics and ACLs that do not exist yet")
    create.add_argument("--partitions", type=int, default=6, metavar="N", help="default 6")
    create.add_argument(
        "--replication",
        type=int,
        default=None,
        metavar="R",
        help="default: the broker's default.replication.factor (local stack: 1, or 3 with "
        "--brokers 3)",
    )
    create.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    create.add_argument("--json", action="store_true", help="print a JSON list of topics")
    register_command(create, _create)


def _create(ctx: Context) -> int:
    bootstrap, security = ctx.bootstrap(), ctx.kafka("admin")
    args = ctx.args
    results = provision(bootstrap, args.partitions, args.replication, security=security)
    acls = provision_acls(bootstrap, security=security)
    if ctx.json:
        ctx.print_json([asdict(r) for r in results])
        return 0
    for result in results:
        verb = "created" if result.created else "exists "
        ctx.say(f"{verb} {result.name} ({result.partitions} partitions)")
    if acls.enabled:
        ctx.say(f"ACLs: {len(acls.entries)} bindings in place (recoveryctl acls show)")
    else:
        ctx.say("ACLs: none provisioned, the broker has no authorizer (plaintext)")
    return 0
