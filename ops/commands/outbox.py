"""`recoveryctl outbox held [--json]` and `recoveryctl outbox release RECORD_ID`.

The relay holds an outbox row it cannot encode (docs/relay.md, "Held rows"): the row and
every later row of its key stay unpublished, in order, and leases skip that key so the
other keys keep flowing. `held` lists the held rows (record id, key, topic, when, why,
how many rows of the key wait behind it); `release` lifts one hold after its cause was
fixed (a relay that understands the row is deployed, or the row was repaired), so the
next lease retries the key from that row. A row that still cannot be encoded is simply
held again. Exit status: 0 done (`held`: nothing held), 1 rows are held (`held`) or no
held row has that id (`release`), 2 no database known or reachable.
"""

from __future__ import annotations

import argparse

from ledger import HeldOutboxRow
from ops.commands.db import add_ledger_options
from ops.context import Context, register_command
from ops.errors import Refused

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `outbox` subcommand and its `held` and `release` actions."""
    parser = subparsers.add_parser(
        "outbox",
        help="list and release outbox rows the relay held as unpublishable",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="outbox_action", metavar="ACTION", required=True)
    held = actions.add_parser("held", help="list held rows and the keys they block")
    add_ledger_options(held)
    register_command(held, _held)
    release = actions.add_parser("release", help="lift a hold so the relay retries its key")
    release.add_argument("record_id", metavar="RECORD_ID", help="the held row's record id")
    add_ledger_options(release)
    register_command(release, _release)


def _row_json(row: HeldOutboxRow) -> dict[str, object]:
    return {
        "record_id": row.record_id,
        "key": row.key,
        "topic": row.topic,
        "position": row.position,
        "held_at": row.held_at.isoformat(),
        "reason": row.reason,
        "waiting": row.waiting,
    }


def _held(ctx: Context) -> int:
    """List the held rows; 0 none held, 1 some held."""
    rows = ctx.ledger().held_outbox()
    if ctx.json:
        ctx.print_json({"held": [_row_json(r) for r in rows]})
    else:
        for r in rows:
            ctx.say(
                f"HELD {r.record_id} key={r.key} topic={r.topic} since={r.held_at.isoformat()} "
                f"waiting={r.waiting}: {r.reason}"
            )
        ctx.say(f"{len(rows)} held row(s), {len({r.key for r in rows})} key(s) blocked")
    return 1 if rows else 0


def _release(ctx: Context) -> int:
    """Lift one hold; 0 released, 1 no such held row."""
    record_id = ctx.args.record_id
    key = ctx.ledger().release_outbox(record_id)
    if ctx.json:
        ctx.print_json({"record_id": record_id, "released": key is not None, "key": key})
        return 0 if key is not None else 1
    if key is None:
        raise Refused(
            f"no held, unpublished outbox row {record_id}; list them with `recoveryctl outbox held`"
        )
    ctx.say(f"released {record_id}: the relay retries key {key} on its next lease")
    return 0
