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
from datetime import UTC, datetime, timedelta

from ledger import LedgerError, PostgresLedger
from ops.commands.db import add_ledger_options
from ops.context import Context, register_command
from ops.errors import UsageError
from schemas import ENV_CONTROLLER_SIGNING_KEY_FILE, IdentitySettings, OutboxSigner, RecordSigner

__all__ = ["register_purge"]


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
    register_command(purge, _purge)


def _signer(ctx: Context) -> OutboxSigner:
    key = ctx.controller_key("a tombstone is signed with the controller's key")
    return OutboxSigner(RecordSigner(IdentitySettings.load().controller_id, key), ctx.topics)


def _retention_days(ctx: Context) -> dict[str, int]:
    days: dict[str, int] = {}
    for machine in ctx.machines.machines.values():  # the catalogue the controller pins
        days[machine.name] = max(days.get(machine.name, 0), machine.audit.retention_days)
    return days


def _chosen(ctx: Context, ledger: PostgresLedger, now: datetime) -> list[str]:
    args = ctx.args
    if args.operation:
        return list(dict.fromkeys(args.operation))
    if args.before:
        try:
            before = datetime.fromisoformat(args.before)
        except ValueError as exc:
            raise UsageError(f"--before {args.before}: {exc}") from exc
        before = before if before.tzinfo else before.replace(tzinfo=UTC)
        return [c.operation_id for c in ledger.purge_candidates(before)]
    days = _retention_days(ctx)
    out = []
    for c in ledger.purge_candidates(now):
        keep = days.get(c.machine_name)
        if keep is not None and c.updated_at < now - timedelta(days=keep):
            out.append(c.operation_id)
    return out


def _purge(ctx: Context) -> int:
    """Purge; print what went; 0 done, 1 a purge refused."""
    args = ctx.args
    signer = None if args.dry_run else _signer(ctx)
    ledger = ctx.ledger()
    now = datetime.now(UTC)
    done: list[dict[str, object]] = []
    refused: list[dict[str, str]] = []
    for op in _chosen(ctx, ledger, now):
        if signer is None:
            done.append({"operation_id": op})
            continue
        try:
            result = ledger.purge_operation(
                op, reason=args.reason, now=now, topics=ctx.topics, sign=signer
            )
        except LedgerError as exc:
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
    _print(ctx, done, refused)
    return 1 if refused else 0


def _print(ctx: Context, done: list[dict[str, object]], refused: list[dict[str, str]]) -> None:
    if ctx.json:
        ctx.print_json({"dry_run": bool(ctx.args.dry_run), "purged": done, "refused": refused})
        return
    for item in done:
        if ctx.args.dry_run:
            ctx.say(f"would purge {item['operation_id']}")
        else:
            ctx.say(
                f"purged {item['operation_id']}: {item['rows_removed']} row(s) through "
                f"sequence {item['purged_through']}; tombstone #{item['tombstone_sequence']}"
            )
    for no in refused:
        ctx.say(f"REFUSED {no['operation_id']}: {no['reason']}")
    ctx.say(f"{len(done)} purged, {len(refused)} refused")
