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
import json
import os
import sys
from typing import TextIO

from ledger import ChainBreak, LedgerError, PostgresLedger
from machines import (
    Grant,
    KeyFileError,
    ProducerEntry,
    ProducerKey,
    Role,
    Roster,
    key_id,
    load_private_key,
    public_key_from_text,
    public_key_text,
)
from ops.audit_topic import TopicReport, compare_with_topic
from ops.commands.db import add_ledger_options, open_ledger
from ops.commands.purge import register_purge
from producers import ProducersError, read_topic
from schemas import (
    DEFAULT_CONTROLLER_ID,
    ENV_CONTROLLER_ID,
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_KAFKA_BOOTSTRAP,
    TopicNames,
)

__all__ = ["register", "run_key", "run_verify"]

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
        "--topic", metavar="NAME", help="the audit topic (default: RECOVERY_TOPIC_AUDIT or ours)"
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
        "--controller-id",
        metavar="ID",
        help=f"the controller producer id (${ENV_CONTROLLER_ID}; {DEFAULT_CONTROLLER_ID})",
    )
    add_ledger_options(verify)
    verify.set_defaults(handler=run_verify)
    key = actions.add_parser("key", help="print the controller's audit signing public key")
    key.add_argument(
        "--key-file", metavar="PATH", help=f"the Ed25519 key file (default: ${KEY_FILE_SETTING})"
    )
    key.add_argument("--json", action="store_true", help="print a JSON object")
    key.set_defaults(handler=run_key)
    register_purge(actions)


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
        public = load_private_key(path, setting=KEY_FILE_SETTING).public_key()
    except KeyFileError as exc:
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
        topic = _against_topic(args, ledger, err) if getattr(args, "against_topic", False) else None
    except LedgerError as exc:
        print(f"recoveryctl audit verify: {exc}", file=err)
        return 2
    finally:
        ledger.close()
    if topic == 2:
        return 2
    report = topic if isinstance(topic, TopicReport) else None
    if args.json:
        body: dict[str, object] = {
            "intact": not breaks and (report is None or report.clean),
            "chains_checked": len(checked),
            "breaks": [_break_json(b) for b in breaks],
        }
        if report is not None:
            body["topic"] = report.to_json()
        print(json.dumps(body, indent=2), file=out)
    else:
        for found in breaks:
            print(f"BROKEN {found.describe()}", file=out)
        if not breaks:
            print(f"audit intact: {len(checked)} chain(s) verified", file=out)
        else:
            print(f"audit BROKEN: {len(breaks)} of {len(checked)} chain(s)", file=out)
        if report is not None:
            _print_topic(report, out)
    return 1 if breaks or (report is not None and not report.clean) else 0


def _print_topic(report: TopicReport, out: TextIO) -> None:
    for finding in report.findings:
        print(f"TOPIC {finding.describe()}", file=out)
    summary = (
        f"{report.records_read} record(s) read: {report.audit_records} audit, "
        f"{report.heads_records} chain-heads ({report.heads_checked} heads), "
        f"{report.tombstones} tombstone(s); {report.purged} purged, "
        f"{report.unpublished} not yet published"
    )
    if report.clean:
        print(f"topic agrees: {summary}", file=out)
    else:
        print(f"topic DISAGREES: {len(report.findings)} finding(s); {summary}", file=out)


def _controller_roster(args: argparse.Namespace, err: TextIO) -> Roster | None:
    producer = args.controller_id or os.environ.get(ENV_CONTROLLER_ID) or DEFAULT_CONTROLLER_ID
    try:
        if args.public_key:
            public = public_key_text(public_key_from_text(args.public_key))
        else:
            path = args.key_file or os.environ.get(KEY_FILE_SETTING)
            if not path:
                print(
                    "recoveryctl audit verify: --against-topic needs the controller's public "
                    f"key: pass --public-key (see `recoveryctl audit key`), --key-file, or "
                    f"set {KEY_FILE_SETTING}",
                    file=err,
                )
                return None
            key = load_private_key(path, setting=KEY_FILE_SETTING)
            public = public_key_text(key.public_key())
    except KeyFileError as exc:
        print(f"recoveryctl audit verify: {exc}", file=err)
        return None
    entry = ProducerEntry(
        id=producer,
        keys=(ProducerKey(public_key=public),),
        grants=(Grant(role=Role.CONTROLLER, capabilities=("*",)),),
    )
    return Roster(producers=(entry,))


def _against_topic(
    args: argparse.Namespace, ledger: PostgresLedger, err: TextIO
) -> TopicReport | int:
    """The topic comparison, or 2 after saying why it cannot run."""
    roster = _controller_roster(args, err)
    if roster is None:
        return 2
    bootstrap = args.bootstrap or os.environ.get(ENV_KAFKA_BOOTSTRAP)
    if not bootstrap:
        print(
            f"recoveryctl audit verify: no broker: pass --bootstrap or set {ENV_KAFKA_BOOTSTRAP}",
            file=err,
        )
        return 2
    topic = args.topic or TopicNames.from_env().audit

    def progress(read: int, total: int) -> None:
        print(f"audit verify: read {read} of {total} record(s) of {topic}", file=err)

    try:
        return compare_with_topic(ledger, read_topic(bootstrap, topic, progress=progress), roster)
    except ProducersError as exc:
        print(f"recoveryctl audit verify: {exc}", file=err)
        return 2
