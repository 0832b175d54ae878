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
import json
import os
import sys
from dataclasses import asdict
from typing import TextIO

from ops.errors import StackError
from ops.stack import live_state
from producers import ProvisionError, provision, provision_acls
from schemas import ENV_KAFKA_BOOTSTRAP, KafkaConfigError, KafkaSecurity

__all__ = ["admin_connection", "register", "run_create"]


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
    create.set_defaults(handler=run_create)


def admin_connection(bootstrap: str | None) -> tuple[str, KafkaSecurity] | None:
    """Where to administer Kafka and as whom: `bootstrap`, else RECOVERY_KAFKA_BOOTSTRAP
    (both with the environment's security settings), else the running local stack as
    its admin principal; None when no broker is known. Raises `KafkaConfigError` for
    unusable security settings."""
    if bootstrap:
        return bootstrap, KafkaSecurity.from_env()
    if os.environ.get(ENV_KAFKA_BOOTSTRAP):
        return os.environ[ENV_KAFKA_BOOTSTRAP], KafkaSecurity.from_env()
    try:
        state = live_state()
    except StackError:
        return None
    if state is None:
        return None
    return state.kafka.bootstrap, state.kafka.client("admin")


def run_create(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Provision the topics and ACLs; print one line per topic (or JSON); return the
    exit status."""
    # Resolved per call, not at import, so that redirected streams are honoured.
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        connection = admin_connection(args.bootstrap)
    except KafkaConfigError as exc:
        print(f"recoveryctl topics create: {exc}", file=err)
        return 2
    if connection is None:
        print(
            f"recoveryctl topics create: no broker known; pass --bootstrap, set "
            f"{ENV_KAFKA_BOOTSTRAP}, or run `recoveryctl stack up` first",
            file=err,
        )
        return 2
    bootstrap, security = connection
    try:
        results = provision(bootstrap, args.partitions, args.replication, security=security)
        acls = provision_acls(bootstrap, security=security)
    except (ProvisionError, KafkaConfigError) as exc:
        print(f"recoveryctl topics create: {exc}", file=err)
        return 1
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2), file=out)
        return 0
    for result in results:
        verb = "created" if result.created else "exists "
        print(f"{verb} {result.name} ({result.partitions} partitions)", file=out)
    if acls.enabled:
        print(f"ACLs: {len(acls.entries)} bindings in place (recoveryctl acls show)", file=out)
    else:
        print("ACLs: none provisioned, the broker has no authorizer (plaintext)", file=out)
    return 0
