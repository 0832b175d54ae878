"""`recoveryctl audit verify [--operation ID] [--against-topic] [--database-url URL] [--json]`.

Recomputes the hash chain of every operation's audit records (or of one operation) from
the ledger database and reports, per broken chain, the first break: the operation, the
sequence, and the expected versus the found hash (or sequence). A record altered,
deleted in the middle or deleted at the end (the operation row keeps the chain head) is
detected. With `--against-topic` it also reads `recovery.audit` (the SIEM's signed,
append-only copy) and proves the database agrees with what the controller published and
signed: a consistent rewrite, a deletion that is not a signed retention purge, a record
missing from the topic, or an unsigned or forged record on it is reported (see
`ops/audit_topic.py`). Exit status: 0 every chain intact (and the topic agrees), 1 a chain
is broken or the topic disagrees, 2 no database or broker known or reachable, no
controller key, or the operation is unknown.

`recoveryctl audit key` prints the controller's public key, which is what a SIEM needs to
verify the records of `recovery.audit` itself (docs/operations.md, "Keys").
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger import ChainBreak, PostgresLedger
from machines import (
    Grant,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    key_id,
    load_roster,
    public_key_from_text,
    public_key_text,
)
from ops.audit_topic import TopicReport, compare_with_topic, verify_authors
from ops.commands.db import add_ledger_options
from ops.commands.purge import register_purge
from ops.context import Context, parse_duration, register_command
from ops.errors import NotConfigured, UsageError
from producers import read_topic
from schemas import (
    DEFAULT_CONTROLLER_ID,
    ENV_CONTROLLER_ID,
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_KAFKA_BOOTSTRAP,
    ENV_ROSTER_FILE,
    IdentitySettings,
)

__all__ = ["register"]

KEY_FILE_SETTING = ENV_CONTROLLER_SIGNING_KEY_FILE


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
    verify.add_argument(
        "--against-topic",
        action="store_true",
        help="also compare the database with the signed records on the audit topic",
    )
    verify.add_argument("--bootstrap", metavar="HOST:PORT", help=f"Kafka (${ENV_KAFKA_BOOTSTRAP})")
    verify.add_argument(
        "--topic",
        metavar="NAME",
        help="the audit topic the controller publishes to (default: RECOVERY_TOPIC_AUDIT or ours)",
    )
    verify.add_argument(
        "--public-key", metavar="BASE64", help="the controller's public key (`audit key`)"
    )
    verify.add_argument(
        "--key-file",
        metavar="PATH",
        help=f"or its private key file, for the public half (default: ${KEY_FILE_SETTING})",
    )
    verify.add_argument(
        "--publish-lag",
        type=parse_duration,
        default=timedelta(minutes=5),
        metavar="DURATION",
        help="with --against-topic: a record unpublished for longer than this is a finding, "
        "not pending (default 5m)",
    )
    verify.add_argument(
        "--controller-id",
        metavar="ID",
        help=f"the controller producer id (${ENV_CONTROLLER_ID}; {DEFAULT_CONTROLLER_ID})",
    )
    add_ledger_options(verify)
    register_command(verify, _verify)
    key = actions.add_parser("key", help="print the controller's audit signing public key")
    key.add_argument(
        "--key-file", metavar="PATH", help=f"the Ed25519 key file (default: ${KEY_FILE_SETTING})"
    )
    key.add_argument("--json", action="store_true", help="print a JSON object")
    register_command(key, _key)
    register_purge(actions)


def _key(ctx: Context) -> int:
    """Print the key id and public key of the signing key; 0 shown, 2 no usable key."""
    public = ctx.controller_key("no key file").public_key()
    if ctx.json:
        ctx.print_json({"key_id": key_id(public), "public_key": public_key_text(public)})
    else:
        ctx.say(f"{key_id(public)} {public_key_text(public)}")
    return 0


def _break_json(found: ChainBreak) -> dict[str, object]:
    return {
        "operation_id": found.operation_id,
        "sequence": found.sequence,
        "reason": found.reason,
        "expected": found.expected,
        "found": found.found,
    }


def _verify(ctx: Context) -> int:
    """Verify the chains; print the verdict; return 0 intact, 1 broken."""
    args, ledger = ctx.args, ctx.ledger()
    if args.operation is not None and args.operation not in ledger.audit_operation_ids():
        raise UsageError(
            f"operation {args.operation} has no operation row and no audit record in this ledger"
        )
    checked = (args.operation,) if args.operation else ledger.audit_operation_ids()
    roster = _controller_roster(ctx)
    breaks = ledger.verify_audit(args.operation)
    # The controller signs each row for its audit topic's name: `--topic` when given.
    topics = ctx.topics.model_copy(update={"audit": args.topic}) if args.topic else ctx.topics
    authors = verify_authors(ledger, roster, topics, args.operation)
    report = _against_topic(ctx, ledger, roster) if args.against_topic else None
    intact = not breaks and not authors and (report is None or report.clean)
    if ctx.json:
        body: dict[str, object] = {
            "intact": intact,
            "chains_checked": len(checked),
            "breaks": [_break_json(b) for b in breaks],
            "authors": [finding.to_json() for finding in authors],
        }
        if report is not None:
            body["topic"] = report.to_json()
        ctx.print_json(body)
    else:
        for found in breaks:
            ctx.say(f"BROKEN {found.describe()}")
        for finding in authors:
            ctx.say(f"UNPROVEN {finding.describe()}")
        if not breaks and not authors:
            ctx.say(
                f"audit intact: {len(checked)} chain(s) verified, every record signed by "
                "the controller"
            )
        else:
            ctx.say(
                f"audit BROKEN: {len(breaks)} of {len(checked)} chain(s) broken, "
                f"{len(authors)} record(s) the controller did not sign"
            )
        if report is not None:
            _print_topic(ctx, report)
    return 0 if intact else 1


def _print_topic(ctx: Context, report: TopicReport) -> None:
    for finding in report.findings:
        ctx.say(f"TOPIC {finding.describe()}")
    summary = (
        f"{report.records_read} record(s) read: {report.audit_records} audit, "
        f"{report.heads_records} chain-heads ({report.heads_checked} heads), "
        f"{report.tombstones} tombstone(s); {report.purged} purged, "
        f"{report.unpublished} not yet published"
    )
    if report.clean:
        ctx.say(f"topic agrees: {summary}")
    else:
        ctx.say(f"topic DISAGREES: {len(report.findings)} finding(s); {summary}")


def _controller_roster(ctx: Context) -> Roster:
    """The controller keys every audit row must be signed with: `--public-key`, else the
    public half of `--key-file` (or RECOVERY_CONTROLLER_SIGNING_KEY_FILE), else the
    controllers of RECOVERY_ROSTER_FILE (every key with its validity, across rotations),
    else the local stack's roster when the ledger is the stack's."""
    args, identity = ctx.args, IdentitySettings.load()
    producer = args.controller_id or identity.controller_id
    public: Ed25519PublicKey | None = None
    if args.public_key:
        public = public_key_from_text(args.public_key)
    elif args.key_file or identity.controller_key_file:
        public = ctx.controller_key("no key file").public_key()
    if public is not None:
        entry = ProducerEntry(
            id=producer,
            keys=(ProducerKey(public_key=public_key_text(public)),),
            grants=(Grant(role=Role.CONTROLLER, capabilities=("*",)),),
        )
        return Roster(producers=(entry,))
    roster_file = identity.roster_file
    if roster_file is None and ctx.role_url("reader") is not None and ctx.stack is not None:
        roster_file = Path(ctx.stack.stack_dir) / "keys" / "roster.json"
    if roster_file is None:
        raise NotConfigured(
            "audit verify proves each record's author with the controller's public key: pass "
            "--public-key (see `recoveryctl audit key`) or --key-file, or set "
            f"{KEY_FILE_SETTING} or {ENV_ROSTER_FILE}"
        )
    found = load_roster(roster_file)
    controllers = tuple(p for p in found.producers if Role.CONTROLLER in p.roles())
    if not controllers:
        raise NotConfigured(f"roster {roster_file} names no producer with role controller")
    return Roster(producers=controllers)


def _against_topic(ctx: Context, ledger: PostgresLedger, roster: Roster) -> TopicReport:
    """The comparison of the ledger with the audit topic."""
    topic = ctx.args.topic or ctx.topics.audit

    def progress(read: int, total: int) -> None:
        ctx.note(f"read {read} of {total} record(s) of {topic}")

    records = read_topic(ctx.bootstrap(), topic, progress=progress, security=ctx.kafka("admin"))
    return compare_with_topic(ledger, records, roster, publish_lag=ctx.args.publish_lag)
