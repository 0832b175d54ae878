"""`recoveryctl ops migrate OPERATION_ID --to VERSION`: move one operation to another
pinned version of its machine (docs/operations.md, "Upgrading a machine").

An operation stays on the machine version it opened under. To retire that version while
the operation is still in flight, an approver migrates it: this command reads the
operation from the ledger, maps its current state to a state of the new version (`--map
FROM=TO`, repeatable; by default each state to the state of the same name), checks the
mapping as the controller will (`machines.mapping_refusal`: the state exists, a final
state stays final and a non-final one non-final, the new state's entry actions already
ran, the new state still routes every event the old one did while commands are open),
signs a `MIGRATION_APPROVED` decision with the approver's Ed25519 key over the plan's
digest (the operation's position in the ledger, both versions' digests, both states),
checks it against the policy's approvers, and publishes it to `recovery.events`. The
controller decides it in order with the operation's other events, records the decision
(with a `migration` block) in the ledger and the audit chain, and from then on the
operation is decided by the new version. With `--wait SECONDS` the command waits for
that decision and prints it.

Exit status: 0 published (and, with `--wait`, migrated), 1 refused (a mapping the new
version does not allow, a key that is not an approver's, a plan that changed, the
controller refused or did not decide in time), 2 usage: no database, broker or rules,
an unknown operation, a version that is not pinned.
"""

from __future__ import annotations

import argparse
import secrets
from datetime import UTC, datetime
from typing import Any

from machines import MIGRATION_APPROVED, load_private_key, sign_decision
from ops.commands.db import add_ledger_options
from ops.commands.review import add_decision_options
from ops.context import Context, add_rules_options, register_command
from ops.errors import Refused, UsageError
from ops.usecases import approver_for, await_decision, plan_migration, submit_migration

__all__ = ["register_migrate"]


def register_migrate(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `ops migrate` to the `ops` actions."""
    parser = actions.add_parser(
        "migrate",
        help="move one operation to another pinned version of its machine (signed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("operation_id", metavar="OPERATION_ID")
    parser.add_argument("--to", required=True, metavar="VERSION", help="the pinned version")
    parser.add_argument(
        "--map",
        action="append",
        default=[],
        type=_pair,
        metavar="FROM=TO",
        help="map state FROM of the operation's version to TO of the new one (repeatable; "
        "default: the state of the same name)",
    )
    add_decision_options(
        parser,
        key_help="the approver's Ed25519 private key (`recoveryctl keys generate`); needed "
        "unless --dry-run",
        key_required=False,
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check and print the plan; sign nothing"
    )
    add_ledger_options(parser, json_help="print the plan and what was published as JSON")
    add_rules_options(parser)
    register_command(parser, _migrate)


def _pair(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(f"{text!r} is not FROM=TO (two state names)")
    return old, new


def _migrate(ctx: Context) -> int:
    """Plan, check, sign and publish; see the module doc."""
    args = ctx.args
    mapping = dict(args.map)
    if len(mapping) != len(args.map):
        raise UsageError("--map names a state twice")
    rules, inspector = ctx.rules, ctx.inspector()
    now = datetime.now(UTC)
    plan = plan_migration(inspector.operation_record(args.operation_id), rules, args.to, mapping)
    report: dict[str, Any] = {"plan": plan.to_dict(), "event_id": None, "decision": None}
    if args.dry_run:
        _print(ctx, report)
        return 0
    key = load_private_key(ctx.require(args.key_file, "ops migrate signs: pass --key-file PEM"))
    approver = approver_for(rules.rules.policy, key, args.approver)
    decision = sign_decision(
        plan.decision(approver, now + args.expires_in, secrets.token_hex(16)), key
    )
    with ctx.approver_client(approver, key, f"operation {args.operation_id}") as client:
        event = submit_migration(plan, decision, client=client, rules=rules, now=now)
    report.update(event_id=event.event_id, approver=approver, expires_at=decision.expires_at)
    if args.wait > 0:
        report["decision"] = await_decision(inspector, args.operation_id, event.event_id, args.wait)
    _print(ctx, report)
    return _status(args.operation_id, args.wait, report["decision"])


def _print(ctx: Context, report: dict[str, Any]) -> None:
    if ctx.json:
        ctx.print_json(report)
        return
    plan = report["plan"]
    old, new = plan["from"], plan["to"]
    ctx.say(
        f"operation {plan['operation_id']}: {old['name']}@{old['version']} state {old['state']}"
        f" -> {new['name']}@{new['version']} state {new['state']} (plan {plan['plan_digest']})"
    )
    if report["event_id"] is not None:
        ctx.say(
            f"published {MIGRATION_APPROVED} {report['event_id']} by {report['approver']}, "
            f"valid until {report['expires_at'].isoformat()}"
        )
    decision = report["decision"]
    if decision is not None:
        ctx.say(
            f"controller decided #{decision['sequence']}: {decision['outcome']}, "
            f"{decision['state_before']} -> {decision['state_after']}"
            + "".join(f"; refused {code}" for code in decision["refusals"])
        )


def _status(op: str, wait: float, decision: dict[str, Any] | None) -> int:
    if wait <= 0:
        return 0
    if decision is None:
        raise Refused(
            f"operation {op}: no decision within {wait:.0f}s; check that the controller "
            f"runs (`recoveryctl ops show {op}`)"
        )
    return 0 if decision["outcome"] == "transitioned" else 1
