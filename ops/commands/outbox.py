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
import json
import sys
from typing import TextIO

from ledger import HeldOutboxRow, LedgerError
from ops.commands.db import add_ledger_options, open_ledger

__all__ = ["register", "run_held", "run_release"]


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
    held.set_defaults(handler=run_held)
    release = actions.add_parser("release", help="lift a hold so the relay retries its key")
    release.add_argument("record_id", metavar="RECORD_ID", help="the held row's record id")
    add_ledger_options(release)
    release.set_defaults(handler=run_release)


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


def run_held(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """List the held rows; return 0 none held, 1 some held, 2 unusable database."""
    out = out or sys.stdout  # looked up per call, so a redirected stdout is honoured
    err = err or sys.stderr
    ledger = open_ledger("outbox held", args.database_url, err)
    if ledger is None:
        return 2
    try:
        rows = ledger.held_outbox()
    except LedgerError as exc:
        print(f"recoveryctl outbox held: {exc}", file=err)
        return 2
    finally:
        ledger.close()
    if args.json:
        print(json.dumps({"held": [_row_json(r) for r in rows]}, indent=2), file=out)
    else:
        for r in rows:
            print(
                f"HELD {r.record_id} key={r.key} topic={r.topic} since={r.held_at.isoformat()} "
                f"waiting={r.waiting}: {r.reason}",
                file=out,
            )
        print(f"{len(rows)} held row(s), {len({r.key for r in rows})} key(s) blocked", file=out)
    return 1 if rows else 0


def run_release(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Lift one hold; return 0 released, 1 no such held row, 2 unusable database."""
    out = out or sys.stdout
    err = err or sys.stderr
    ledger = open_ledger("outbox release", args.database_url, err)
    if ledger is None:
        return 2
    try:
        key = ledger.release_outbox(args.record_id)
    except LedgerError as exc:
        print(f"recoveryctl outbox release: {exc}", file=err)
        return 2
    finally:
        ledger.close()
    if args.json:
        body = {"record_id": args.record_id, "released": key is not None, "key": key}
        print(json.dumps(body, indent=2), file=out)
    elif key is None:
        print(
            f"recoveryctl outbox release: no held, unpublished outbox row {args.record_id}; "
            "list them with `recoveryctl outbox held`",
            file=err,
        )
    else:
        print(f"released {args.record_id}: the relay retries key {key} on its next lease", file=out)
    return 0 if key is not None else 1
