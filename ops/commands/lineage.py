"""`recoveryctl lineage OPERATION_ID [--database-url URL] [--json]`.

Reconstructs a delegation tree for an incident review (CONFORMANCE L5.4): the tree that
contains OPERATION_ID, from its topmost known ancestor down, with each operation's
agent, task and state, whether it is containing (and which decision made it so) or held
by contained ancestors, its delegated credentials, its effects as trusted evidence shows
them (confirmed, not applied, unknown, compensated, with the evidence references) and
every command issued to it with the event that answered it, if one did. Everything is
read through the `Ledger` interface. Exit status: 0 shown, 2 no database known or
reachable, or the operation is not in the ledger.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from ledger import Ledger
from machines import ANSWERED_KINDS, LineageRow
from ops.commands.db import add_ledger_options
from ops.context import Context, register_command

__all__ = ["lineage_report", "register", "render_text"]

_OUTCOME_BUCKET = {"applied": "confirmed", "not_applied": "not_applied", "unknown": "unknown"}
_COMPENSATED = "COMPENSATION_SUCCEEDED"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `lineage` subcommand."""
    parser = subparsers.add_parser(
        "lineage",
        help="show an operation's delegation tree: states, effects, commands",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("operation_id", metavar="OPERATION_ID")
    add_ledger_options(parser, json_help="print the tree as JSON")
    register_command(parser, _lineage)


def lineage_report(ledger: Ledger, operation_id: str) -> dict[str, Any]:
    """The tree containing `operation_id` as JSON-ready data: `root` (its topmost known
    ancestor), `operation_id`, and `operations` shallowest first, each with its lineage
    row, `depth` below the root, `effects` and `commands`. Raises `UnknownOperation`."""
    own = ledger.lineage(operation_id)
    root = own.ancestors[-1] if own.ancestors else operation_id
    tree = ledger.lineage_tree(root)
    operations = []
    for row in tree:
        decisions = ledger.decisions(row.operation_id)
        operations.append(
            {
                **row.to_dict(),
                "depth": _depth(row, root),
                "effects": _effects(decisions),
                "commands": _commands(decisions),
            }
        )
    return {"root": root, "operation_id": operation_id, "operations": operations}


def _depth(row: LineageRow, root: str) -> int:
    return row.ancestors.index(root) + 1 if root in row.ancestors else 0


def _effects(decisions: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Evidence references per effect status: trusted verification outcomes (the
    latest one is the operation's current status) and successful compensations."""
    effects: dict[str, list[str]] = {
        "confirmed": [],
        "not_applied": [],
        "unknown": [],
        "compensated": [],
    }
    for decision in decisions:
        verification = decision.get("evidence", {}).get("verification")
        if verification is not None:
            bucket = _OUTCOME_BUCKET[str(verification["outcome"])]
            effects[bucket].append(str(verification["reference"]))
        event = decision["event"]
        if event["type"] == _COMPENSATED and decision["outcome"] == "transitioned":
            effects["compensated"].append(str(event["evidence_ref"]))
    return effects


def _commands(decisions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every command issued, with the type and id of the event that answered it."""
    answers = {
        d["event"]["causation"]: d["event"] for d in decisions if d["event"].get("causation")
    }
    commands = []
    for decision in decisions:
        for invocation in decision["invocations"]:
            answer = answers.get(invocation["command_id"])
            commands.append(
                {
                    "command_id": invocation["command_id"],
                    "capability": invocation["capability"],
                    "kind": invocation["kind"],
                    "params": invocation["params"],
                    "sequence": decision["sequence"],
                    "caused_by_event": decision["event"]["id"],
                    "caused_by_type": decision["event"]["type"],
                    "answered_by": None
                    if answer is None
                    else {"event_id": answer["id"], "type": answer["type"]},
                }
            )
    return commands


def render_text(report: Mapping[str, Any]) -> str:
    """The report as an indented tree for people."""
    lines = [f"lineage of {report['operation_id']} (root {report['root']})"]
    for op in report["operations"]:
        pad = "  " * op["depth"]
        mark = " *" if op["operation_id"] == report["operation_id"] else ""
        status = []
        if op["containing"]:
            status.append(f"CONTAINING since {op['containment_cause']}")
        if op["contained_ancestors"]:
            status.append("held by contained " + ", ".join(op["contained_ancestors"]))
        lines.append(
            f"{pad}{op['operation_id']}{mark}  [{op['state']}]  agent {op['agent']}  "
            f"task {op['task']}" + (f"  ({'; '.join(status)})" if status else "")
        )
        if op["delegated_credentials"]:
            lines.append(f"{pad}  credentials: {', '.join(op['delegated_credentials'])}")
        effects = op["effects"]
        lines.append(
            f"{pad}  effects: "
            + ", ".join(f"{name} {len(refs)}" + _refs(refs) for name, refs in effects.items())
        )
        for command in op["commands"]:
            answer = command["answered_by"]
            lines.append(
                f"{pad}  command {command['command_id']} {command['capability']} "
                f"({command['kind']}) for {command['caused_by_type']}: "
                + _status(command["kind"], answer)
            )
    return "\n".join(lines)


def _status(kind: str, answer: Mapping[str, Any] | None) -> str:
    if answer is not None:
        return f"answered by {answer['type']}"
    # Notifications and escalations report no result event (SPEC §6.4 answers only
    # actions whose outcome the machine waits for).
    return "open" if kind in ANSWERED_KINDS else "sent"


def _refs(refs: Sequence[str]) -> str:
    return f" ({', '.join(refs)})" if refs else ""


def _lineage(ctx: Context) -> int:
    """Print the lineage report; 0 shown."""
    report = lineage_report(ctx.ledger(), ctx.args.operation_id)
    if ctx.json:
        ctx.print_json(report)
    else:
        ctx.say(render_text(report))
    return 0
