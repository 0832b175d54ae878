"""`recoveryctl ops list|show`: the operations in the ledger and one operation's timeline.

- `list [--state S] [--machine NAME[@VERSION]] [--older-than 15m] [--waiting-for-human]`
  lists operations, least recently changed first, with their machine, state, age and
  whether they wait for a human (the current state of their pinned machine accepts
  HUMAN_APPROVED or HUMAN_REJECTED): the escalation queue is
  `recoveryctl ops list --waiting-for-human`.
- `show OPERATION_ID` prints the timeline: every event with the decision it got (the
  guards evaluated with their evidence, refusals, the state before and after), every
  command issued with whether the relay published it and which event answered it, the
  signed human decisions, and whether the operation's audit chain verifies.

Everything is read from the ledger in one read-only snapshot (`ledger.LedgerInspector`;
connect as `recovery_reader`). Each prints a table, or JSON with `--json`. Exit status:
0 shown, 1 `show`: the audit chain is broken, 2 no database, rules that do not load, or
an unknown operation.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from ledger import (
    LedgerError,
    LedgerInspector,
    OperationRecord,
    OperationSummary,
    UnknownOperation,
)
from machines import awaited_actions, awaits_human
from ops.commands.db import add_ledger_options
from ops.commands.output import open_inspector, print_json, table
from ops.commands.rules import LoadedRules, add_rules_options, load_rules_or_report, parse_duration
from schemas import is_drill_operation

__all__ = ["register", "run_list", "run_show", "timeline"]


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
    listing.add_argument("--limit", type=int, default=1000, metavar="N", help="default 1000")
    add_ledger_options(listing, json_help="print the operations as JSON")
    add_rules_options(listing)
    listing.set_defaults(handler=run_list)
    show = actions.add_parser("show", help="one operation's timeline and audit status")
    show.add_argument("operation_id", metavar="OPERATION_ID")
    add_ledger_options(show, json_help="print the timeline as JSON")
    add_rules_options(show)
    show.set_defaults(handler=run_show)


def _age(now: datetime, then: datetime) -> str:
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _waiting(rules: LoadedRules, op: OperationSummary | Mapping[str, Any]) -> bool | None:
    """Whether the operation waits for a human; None when its machine is not pinned."""
    row: Mapping[str, Any] = op if isinstance(op, Mapping) else _summary_json(op, None)
    machine = row.get("machine")
    name, version, digest = (
        (machine["name"], machine["version"], machine["digest"])
        if machine is not None
        else (row["machine_name"], row["machine_version"], row["machine_digest"])
    )
    pinned = rules.machine_for(str(name), str(version), str(digest))
    return None if pinned is None else awaits_human(pinned, str(row["state"]), rules.rules.registry)


def run_list(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """List operations; 0 listed (perhaps none), 2 no database or rules."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    rules = load_rules_or_report("ops list", args, err)
    if rules is None:
        return 2
    inspector = open_inspector("ops list", args.database_url, err)
    if inspector is None:
        return 2
    name, _, version = (args.machine or "").partition("@")
    now = datetime.now(UTC)
    before = now - args.older_than if args.older_than is not None else None
    try:
        found = inspector.operations(
            state=args.state,
            machine=name or None,
            machine_version=version or None,
            updated_before=before,
            limit=args.limit,
        )
    except LedgerError as exc:
        print(f"recoveryctl ops list: {exc}", file=err)
        return 2
    finally:
        inspector.close()
    rows = [(op, _waiting(rules, op)) for op in found]
    if args.waiting_for_human:
        rows = [(op, waiting) for op, waiting in rows if waiting]
    if args.json:
        print_json({"operations": [_summary_json(op, w) for op, w in rows]}, out)
        return 0
    mark = {True: "yes", False: "no", None: "? (machine not pinned)"}
    print(
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
        ),
        file=out,
    )
    print(f"{len(rows)} operation(s)", file=out)
    return 0


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


def timeline(
    inspector: LedgerInspector, record: OperationRecord, rules: LoadedRules
) -> dict[str, Any]:
    """The operation's timeline as JSON-ready data: identity, events with their
    decisions, commands with publication and answers, approvals and audit status."""
    by_event = {d["event"]["id"]: d for d in record.decisions}
    published = {o.record_id: o for o in record.outbox}
    # A refused event answered nothing: its command stays open (the view agrees).
    answers = {
        d["event"]["causation"]: d["event"]["id"]
        for d in record.decisions
        if d["event"]["causation"] and d["outcome"] != "refused"
    }
    events = []
    for event in record.events:
        decision = by_event.get(event.event_id)
        events.append(
            {
                "event_id": event.event_id,
                "event_type": event.event_type,
                "producer": event.envelope.get("producer"),
                "event_time": event.envelope.get("event_time"),
                "recorded_at": event.recorded_at.isoformat(),
                "source": {
                    "topic": event.source_topic,
                    "partition": event.source_partition,
                    "offset": event.source_offset,
                },
                "decision": None if decision is None else _decision_json(decision),
            }
        )
    commands = []
    for decision in record.decisions:
        for invocation in decision["invocations"]:
            sent = published.get(invocation["command_id"])
            commands.append(
                {
                    "command_id": invocation["command_id"],
                    "capability": invocation["capability"],
                    "kind": invocation["kind"],
                    "params": invocation["params"],
                    "decision_sequence": decision["sequence"],
                    "published_at": None
                    if sent is None or sent.published_at is None
                    else sent.published_at.isoformat(),
                    "held": None if sent is None else sent.held_reason,
                    "answered_by": answers.get(invocation["command_id"]),
                }
            )
    breaks = inspector.verify_audit(record.view.operation_id)
    row = dict(record.row)
    return {
        "operation": {
            **{k: v for k, v in row.items() if k not in {"created_at", "updated_at"}},
            "delegated_credentials": list(row["delegated_credentials"]),
            "ancestors": list(row["ancestors"]),
            "created_at": row["created_at"].isoformat(),
            "updated_at": row["updated_at"].isoformat(),
            "waiting_for_human": _waiting(rules, row),
            "awaiting": awaited_actions(record.view, rules.rules.registry),
        },
        "events": events,
        "commands": commands,
        "approvals": list(record.approvals),
        "descendants": list(record.descendants),
        "audit": {
            "intact": not breaks,
            "records": sum(1 for o in record.outbox if o.record_id.startswith("audit:")),
            "breaks": [b.describe() for b in breaks],
        },
    }


def _awaited(awaiting: Sequence[Mapping[str, Any]]) -> str:
    """The commands the state still waits for, for people (SPEC §7.3)."""
    return ", ".join(f"{a['command_id']} ({a['capability']})" for a in awaiting) or "-"


def _decision_json(decision: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "sequence": decision["sequence"],
        "decided_at": decision["decided_at"],
        "outcome": decision["outcome"],
        "state_before": decision["state_before"],
        "state_after": decision["state_after"],
        "guards": decision["guards"],
        "refusals": decision["refusals"],
        "errors": decision["errors"],
        "evidence": decision["evidence"],
        "approval": decision["approval"],
        "commands": [i["command_id"] for i in decision["invocations"]],
    }


def run_show(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print one operation's timeline; 0 shown, 1 broken audit chain, 2 unusable."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    rules = load_rules_or_report("ops show", args, err)
    if rules is None:
        return 2
    inspector = open_inspector("ops show", args.database_url, err)
    if inspector is None:
        return 2
    try:
        record = inspector.operation_record(args.operation_id)
        report = timeline(inspector, record, rules)
    except UnknownOperation as exc:
        print(f"recoveryctl ops show: {exc}; list them with `recoveryctl ops list`", file=err)
        return 2
    except LedgerError as exc:
        print(f"recoveryctl ops show: {exc}", file=err)
        return 2
    finally:
        inspector.close()
    if args.json:
        print_json(report, out)
    else:
        print(render_timeline(report), file=out)
    return 0 if report["audit"]["intact"] else 1


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
        for refusal in decision["refusals"]:
            notes.append(
                f"  #{decision['sequence']} refused {refusal['code']}: {refusal['message']}"
            )
    return notes
