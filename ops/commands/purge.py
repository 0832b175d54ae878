"""`recoveryctl audit purge (--operation ID... | --before DATE | --retention)`.

Retention that is not tampering (docs/ledger.md, "Retention"): each chosen operation's
history (events, decisions, evidence, approvals, audit records) goes through the
database's one retention door, `purge_operation_history`, and a `tombstone` audit record
signed with the controller's key continues its chain, published on the audit topic by
the relay. `audit verify` and `audit verify --against-topic` are clean afterwards and
tell the purge from a deletion.

`--before DATE` purges operations untouched since DATE (ISO-8601); `--retention` those
untouched for longer than their machine's `audit.retention_days`. `--dry-run` lists them.
The controller's key comes from `--key-file` or `RECOVERY_CONTROLLER_SIGNING_KEY_FILE`.
Exit status: 0 done (or nothing to do), 1 an operation was refused (unpublished outbox
rows: let the relay catch up), 2 unusable (no database, no key, bad date).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import TextIO

from ledger import LedgerError, PostgresLedger, UnknownOperation
from machines import KeyFileError, load_private_key
from ops.commands.db import add_ledger_options, open_ledger
from schemas import (
    DEFAULT_CONTROLLER_ID,
    ENV_CONTROLLER_ID,
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    OutboxSigner,
    RecordSigner,
    TopicNames,
)

__all__ = ["register_purge", "run_purge"]


def register_purge(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `audit purge`."""
    purge = actions.add_parser(
        "purge",
        help="purge old operations' history, leaving signed tombstones",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chosen = purge.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--operation", metavar="ID", action="append", help="purge this one")
    chosen.add_argument("--before", metavar="DATE", help="operations untouched since DATE")
    chosen.add_argument("--retention", action="store_true", help="per machine audit.retention_days")
    purge.add_argument("--reason", default="retention", help="recorded in each tombstone")
    purge.add_argument(
        "--key-file", metavar="PATH", help=f"default ${ENV_CONTROLLER_SIGNING_KEY_FILE}"
    )
    purge.add_argument("--dry-run", action="store_true", help="list what would be purged")
    add_ledger_options(purge)
    purge.set_defaults(handler=run_purge)


def _signer(args: argparse.Namespace, topics: TopicNames, err: TextIO) -> OutboxSigner | None:
    path = args.key_file or os.environ.get(ENV_CONTROLLER_SIGNING_KEY_FILE)
    if not path:
        print(
            "recoveryctl audit purge: a tombstone is signed with the controller's key: pass "
            f"--key-file or set {ENV_CONTROLLER_SIGNING_KEY_FILE}",
            file=err,
        )
        return None
    try:
        key = load_private_key(path, setting=ENV_CONTROLLER_SIGNING_KEY_FILE)
    except KeyFileError as exc:
        print(f"recoveryctl audit purge: {exc}", file=err)
        return None
    producer = os.environ.get(ENV_CONTROLLER_ID) or DEFAULT_CONTROLLER_ID
    return OutboxSigner(RecordSigner(producer, key), topics)


def _retention_days() -> dict[str, int]:
    from consumer import ControllerSettings, load_rules  # the catalogue the controller pins

    machines, _ = load_rules(ControllerSettings(bootstrap="unused", database_url="unused"))
    days: dict[str, int] = {}
    for machine in machines.values():
        days[machine.name] = max(days.get(machine.name, 0), machine.audit.retention_days)
    return days


def _chosen(args: argparse.Namespace, ledger: PostgresLedger, now: datetime) -> list[str]:
    if args.operation:
        return list(dict.fromkeys(args.operation))
    if args.before:
        before = datetime.fromisoformat(args.before)
        before = before if before.tzinfo else before.replace(tzinfo=UTC)
        return [c.operation_id for c in ledger.purge_candidates(before)]
    days = _retention_days()
    out = []
    for c in ledger.purge_candidates(now):
        keep = days.get(c.machine_name)
        if keep is not None and c.updated_at < now - timedelta(days=keep):
            out.append(c.operation_id)
    return out


def run_purge(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Purge; print what went; 0 done, 1 a purge refused, 2 unusable."""
    out = out or sys.stdout
    err = err or sys.stderr
    topics = TopicNames.from_env()
    signer = None if args.dry_run else _signer(args, topics, err)
    if signer is None and not args.dry_run:
        return 2
    ledger = open_ledger("audit purge", args.database_url, err)
    if ledger is None:
        return 2
    now = datetime.now(UTC)
    done: list[dict[str, object]] = []
    refused: list[dict[str, str]] = []
    try:
        try:
            chosen = _chosen(args, ledger, now)
        except ValueError as exc:
            print(f"recoveryctl audit purge: --before {args.before}: {exc}", file=err)
            return 2
        for op in chosen:
            if args.dry_run:
                done.append({"operation_id": op})
                continue
            try:
                result = ledger.purge_operation(
                    op, reason=args.reason, now=now, topics=topics, sign=signer
                )
            except (UnknownOperation, LedgerError) as exc:
                refused.append({"operation_id": op, "reason": str(exc)})
                continue
            done.append(
                {
                    "operation_id": op,
                    "rows_removed": result.rows_removed,
                    "purged_through": result.purged_through,
                    "tombstone_sequence": result.tombstone_sequence,
                }
            )
    finally:
        ledger.close()
    _print(args, done, refused, out)
    return 1 if refused else 0


def _print(
    args: argparse.Namespace,
    done: list[dict[str, object]],
    refused: list[dict[str, str]],
    out: TextIO,
) -> None:
    if args.json:
        body = {"dry_run": bool(args.dry_run), "purged": done, "refused": refused}
        print(json.dumps(body, indent=2), file=out)
    else:
        for item in done:
            if args.dry_run:
                print(f"would purge {item['operation_id']}", file=out)
            else:
                print(
                    f"purged {item['operation_id']}: {item['rows_removed']} row(s) through "
                    f"sequence {item['purged_through']}; tombstone #{item['tombstone_sequence']}",
                    file=out,
                )
        for no in refused:
            print(f"REFUSED {no['operation_id']}: {no['reason']}", file=out)
        print(f"{len(done)} purged, {len(refused)} refused", file=out)
