"""`recoveryctl ops list|show|migrate`: the operations in the ledger, one operation's
timeline, and moving one to another version of its machine (`ops/commands/migrate.py`).

- `list [--state S] [--machine NAME[@VERSION]] [--older-than 15m] [--waiting-for-human]`
  lists operations, least recently changed first, with their machine, state, age and
  whether they wait for a human (the current state of their pinned machine accepts
  HUMAN_APPROVED or HUMAN_REJECTED): the escalation queue is
  `recoveryctl ops list --waiting-for-human`. `--agent`, `--task`, `--principal`,
  `--correlation` and `--idempotency-key` find the operations of one of those (exact
  values), `--search TERM` the ones where any of them, or the operation id, is TERM;
  then the most recently changed come first.
- `list --overdue [--grace 60s]` lists instead the timers due longer ago than the grace
  and not decided yet (nobody fired them, or their event waits in the outbox or the
  events topic), oldest due first: what is stuck, for whatever reason.
- `show OPERATION_ID` prints what the operation waits for (each armed timer: a state's
  timeout, the stall bound, the deadline, a scheduled retry, when it fires and whether
  it is overdue), then the timeline: every event with the decision it got (the guards
  evaluated with their evidence, refusals, the state before and after), every command
  issued with whether the relay published it and which event answered it, the signed
  human decisions, and whether the operation's audit chain verifies.

Everything is read from the ledger in one read-only snapshot (`ledger.LedgerInspector`;
connect as `recovery_reader`). Each prints a table, or JSON with `--json`. Exit status:
0 shown, 1 `show`: the audit chain is broken, 2 no database, rules that do not load, or
an unknown operation.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger import OperationSummary, OverdueTimer
from ops.commands.db import add_ledger_options
from ops.commands.migrate import register_migrate
from ops.context import (
    Context,
    PinnedMachines,
    add_rules_options,
    parse_duration,
    register_command,
    table,
)
from ops.usecases import timeline, waiting_for_human
from schemas import is_drill_operation

__all__ = ["register", "render_timeline"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `ops` subcommand and its `list` and `show` actions."""
    parser = subparsers.add_parser(
        "ops",
        help="list operations (the escalation queue) and show one operation's timeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="ops_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="operations by state, machine and age")
    listing.add_argument("--state", metavar="STATE", help="only operations in this state")
    listing.add_argument("--machine", metavar="NAME[@VERSION]", help="only this machine")
    listing.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="DURATION",
        help="only operations unchanged for this long (90s, 15m, 2h, 7d)",
    )
    listing.add_argument(
        "--waiting-for-human",
        action="store_true",
        help="only operations whose state accepts a human decision",
    )
    search = listing.add_argument_group("search (exact values; most recent first)")
    for flag, field, what in _SEARCH:
        search.add_argument(flag, dest=field, metavar="VALUE", help=what)
    listing.add_argument(
        "--overdue",
        action="store_true",
        help="list the timers not decided though due longer ago than --grace instead",
    )
    listing.add_argument(
        "--grace",
        type=parse_duration,
        default=timedelta(seconds=60),
        metavar="DURATION",
        help="with --overdue: how late a timer may be before it counts (default 60s)",
    )
    listing.add_argument("--limit", type=int, default=1000, metavar="N", help="default 1000")
    add_ledger_options(listing, json_help="print the operations as JSON")
    add_rules_options(listing)
    register_command(listing, _list)
    show = actions.add_parser("show", help="one operation's timeline and audit status")
    show.add_argument("operation_id", metavar="OPERATION_ID")
    add_ledger_options(show, json_help="print the timeline as JSON")
    add_rules_options(show)
    register_command(show, _show)
    register_migrate(actions)


# Option, `LedgerInspector.search` keyword, help.
_SEARCH = (
    ("--agent", "agent", "the affected agent"),
    ("--task", "task", "the agent's task"),
    ("--principal", "principal", "the initiating principal"),
    ("--correlation", "correlation_id", "the correlation id"),
    ("--idempotency-key", "idempotency_key", "the idempotency key the tool declared"),
    ("--search", "term", "any of these, or the operation id"),
)


def _age(now: datetime, then: datetime) -> str:
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _list(ctx: Context) -> int:
    """List operations; 0 listed (perhaps none). Reads no policy."""
    if ctx.args.overdue:
        return _list_overdue(ctx)
    args, pinned = ctx.args, ctx.machines
    name, _, version = (args.machine or "").partition("@")
    now = datetime.now(UTC)
    before = now - args.older_than if args.older_than is not None else None
    wanted = {field: getattr(args, field) for _flag, field, _what in _SEARCH}
    if any(wanted.values()):
        found: Sequence[OperationSummary] = [
            op
            for op in ctx.inspector().search(**wanted, limit=args.limit)
            if (args.state is None or op.state == args.state)
            and (not name or op.machine_name == name)
            and (not version or op.machine_version == version)
            and (before is None or op.updated_at < before)
        ]
    else:
        found = ctx.inspector().operations(
            state=args.state,
            machine=name or None,
            machine_version=version or None,
            updated_before=before,
            limit=args.limit,
        )
    rows = [
        (
            op,
            waiting_for_human(
                pinned, op.machine_name, op.machine_version, op.machine_digest, op.state
            ),
        )
        for op in found
    ]
    if args.waiting_for_human:
        rows = [(op, waiting) for op, waiting in rows if waiting]
    if ctx.json:
        ctx.print_json({"operations": [_summary_json(op, w) for op, w in rows]})
        return 0
    mark = {True: "yes", False: "no", None: "? (machine not pinned)"}
    ctx.say(
        table(
            ("operation", "machine", "state", "human", "age", "agent", "task"),
            [
                (
                    op.operation_id,
                    f"{op.machine_name}@{op.machine_version}",
                    op.state,
                    mark[waiting],
                    _age(now, op.updated_at),
                    op.agent,
                    op.task,
                )
                for op, waiting in rows
            ],
        )
    )
    ctx.say(f"{len(rows)} operation(s)")
    return 0


def _list_overdue(ctx: Context) -> int:
    """List the overdue timers (`ledger.OverdueTimer`); 0 listed (perhaps none)."""
    now = datetime.now(UTC)
    found = ctx.inspector().overdue_timers(now - ctx.args.grace, ctx.args.limit)
    if ctx.json:
        ctx.print_json({"overdue": [_overdue_json(t, now) for t in found]})
        return 0
    ctx.say(
        table(
            ("operation", "machine", "state", "timer", "event", "due", "late", "fired"),
            [
                (
                    t.operation_id,
                    f"{t.machine_name}@{t.machine_version}",
                    t.state,
                    t.kind,
                    t.event_type,
                    t.due_at.isoformat(timespec="seconds"),
                    _age(now, t.due_at),
                    "not yet" if t.fired_at is None else "yes, not decided",
                )
                for t in found
            ],
        )
    )
    ctx.say(f"{len(found)} overdue timer(s)")
    return 0


def _overdue_json(timer: OverdueTimer, now: datetime) -> dict[str, Any]:
    return {
        "operation_id": timer.operation_id,
        "machine": {"name": timer.machine_name, "version": timer.machine_version},
        "state": timer.state,
        "timer_id": timer.timer_id,
        "kind": timer.kind,
        "event_type": timer.event_type,
        "armed_at": timer.armed_at.isoformat(),
        "due_at": timer.due_at.isoformat(),
        "late_seconds": round((now - timer.due_at).total_seconds(), 1),
        "fired_at": None if timer.fired_at is None else timer.fired_at.isoformat(),
    }


def _waiting(pinned: PinnedMachines, op: OperationSummary) -> bool | None:
    return waiting_for_human(
        pinned, op.machine_name, op.machine_version, op.machine_digest, op.state
    )


def _summary_json(op: OperationSummary, waiting: bool | None) -> dict[str, Any]:
    return {
        "operation_id": op.operation_id,
        # A response drill's operation (`recoveryctl drill`), not an incident.
        "drill": is_drill_operation(op.operation_id),
        "correlation_id": op.correlation_id,
        "machine": {
            "name": op.machine_name,
            "version": op.machine_version,
            "digest": op.machine_digest,
        },
        "policy_digest": op.policy_digest,
        "state": op.state,
        "version": op.version,
        "waiting_for_human": waiting,
        "initiating_principal": op.initiating_principal,
        "agent": op.agent,
        "task": op.task,
        "created_at": op.created_at.isoformat(),
        "updated_at": op.updated_at.isoformat(),
    }


def _show(ctx: Context) -> int:
    """Print one operation's timeline; 0 shown, 1 broken audit chain. Reads no policy."""
    inspector = ctx.inspector()
    report = timeline(inspector, inspector.operation_record(ctx.args.operation_id), ctx.machines)
    if ctx.json:
        ctx.print_json(report)
    else:
        ctx.say(render_timeline(report))
    return 0 if report["audit"]["intact"] else 1


def _awaited(awaiting: Sequence[Mapping[str, Any]]) -> str:
    """The commands the state still waits for, for people (SPEC §7.3)."""
    return ", ".join(f"{a['command_id']} ({a['capability']})" for a in awaiting) or "-"


def render_timeline(report: Mapping[str, Any]) -> str:
    """The timeline for people: a header, then tables of events, commands, approvals."""
    op = report["operation"]
    waiting = {True: "yes", False: "no", None: "? (machine not pinned)"}[op["waiting_for_human"]]
    lines = [
        f"operation {op['operation_id']}  (correlation {op['correlation_id']})",
        f"  machine   {op['machine_name']}@{op['machine_version']}  {op['machine_digest']}",
        f"  policy    {op['policy_digest']}",
        f"  state     {op['state']}  (ledger version {op['version']}; waiting for a human: "
        f"{waiting})",
        f"  who       principal {op['initiating_principal']}, agent {op['agent']}, "
        f"runtime {op['runtime'] or '-'}, task {op['task']}",
        f"  lineage   parent {op['parent_operation'] or '-'}, origin "
        f"{op['origin_operation'] or '-'}, depth {op['depth']}"
        + (f", descendants {', '.join(report['descendants'])}" if report["descendants"] else ""),
        f"  changed   {op['updated_at']} (opened {op['created_at']})",
        f"  awaiting  {_awaited(op['awaiting'])}",
        *_waiting_lines(report["waiting"]),
        "",
        "events and decisions",
        table(
            ("seq", "event", "type", "producer", "outcome", "state", "guards", "commands"),
            [_event_row(e) for e in report["events"]],
        ),
    ]
    notes = _decision_notes(report["events"])
    if notes:
        lines += ["", *notes]
    lines += [
        "",
        "commands",
        table(
            ("command", "capability", "kind", "seq", "published", "answered by"),
            [
                (
                    c["command_id"],
                    c["capability"],
                    c["kind"],
                    c["decision_sequence"],
                    c["published_at"] or ("HELD: " + c["held"] if c["held"] else "not yet"),
                    c["answered_by"],
                )
                for c in report["commands"]
            ],
        ),
    ]
    if report["approvals"]:
        lines += [
            "",
            "human decisions",
            table(
                ("event", "approver", "verdict", "state", "transition", "expires"),
                [
                    (
                        a["event_id"],
                        a["approver"],
                        a["verdict"],
                        a["state"],
                        a["transition"],
                        a["expires_at"],
                    )
                    for a in report["approvals"]
                ],
            ),
        ]
    audit = report["audit"]
    lines += ["", "audit chain: " + ("intact" if audit["intact"] else "BROKEN")]
    lines += [f"  {b}" for b in audit["breaks"]]
    return "\n".join(lines)


def _waiting_lines(waiting: Mapping[str, Any]) -> list[str]:
    """What the operation waits for: its timers, when each fires (issue #29)."""
    timers = waiting["timers"]
    if not timers:
        return ["", "waiting: no timer armed"]
    lines = [
        "",
        "waiting"
        + (" (STALLED: escalated, until an event moves it)" if waiting["stalled"] else ""),
    ]
    lines.append(
        table(
            ("timer", "event", "due", "when", "does"),
            [(t["kind"], t["event_type"], t["due_at"], _when(t), t["does"]) for t in timers],
        )
    )
    return lines


def _when(timer: Mapping[str, Any]) -> str:
    if timer["spent"]:
        return "fired, decided"
    seconds = float(timer["due_in_seconds"])
    if seconds > 0:
        return f"in {_span(seconds)}"
    fired = "fired, not decided" if timer["fired_at"] else "not fired"
    return f"OVERDUE {_span(-seconds)} ({fired})"


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _event_row(event: Mapping[str, Any]) -> Sequence[Any]:
    decision = event["decision"]
    if decision is None:
        return ("-", event["event_id"], event["event_type"], event["producer"], "-", "-", "-", "-")
    guards = ", ".join(f"{g['guard']}={'T' if g['value'] else 'F'}" for g in decision["guards"])
    return (
        decision["sequence"],
        event["event_id"],
        event["event_type"],
        event["producer"],
        decision["outcome"],
        f"{decision['state_before']} -> {decision['state_after']}",
        guards or None,
        len(decision["commands"]) or None,
    )


def _decision_notes(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Guard evidence and refusals, one line each, under the table that names them."""
    notes = []
    for event in events:
        decision = event["decision"]
        if decision is None:
            continue
        for guard in decision["guards"]:
            if guard["evidence"] or guard.get("error"):
                evidence = ", ".join(guard["evidence"]) or "-"
                error = f"; error {guard['error']}" if guard.get("error") else ""
                notes.append(
                    f"  #{decision['sequence']} guard {guard['guard']}: evidence {evidence}{error}"
                )
        migration = decision.get("migration")
        if migration is not None:
            notes.append(
                f"  #{decision['sequence']} migrated {migration['from']['version']} -> "
                f"{migration['to']['version']} ({migration['to']['digest']})"
            )
        named = (decision.get("machine") or {}).get("named_version")
        if named is not None:
            notes.append(
                f"  #{decision['sequence']} the event named version {named}; decided by "
                f"{decision['machine']['version']}, the operation's"
            )
        for refusal in decision["refusals"]:
            notes.append(
                f"  #{decision['sequence']} refused {refusal['code']}: {refusal['message']}"
            )
    return notes
