"""`recoveryctl incidents`: the security incidents the controller recorded.

An incident is a record the controller refused because it is an attack or a collision,
not bad input (docs/controller.md, "Operation ids are global"): today a report that
describes another operation under an operation's id (`opening-conflict`: another
machine, scope or agent; or another producer in another conversation, refused as
`correlation-mismatch`). Each is dead-lettered
like any refusal and its audit record on the partition's intake chain holds the
incident: both openings, the one that governs the operation and the one the report
claims, and what differs. This command lists them from the ledger (published or not),
oldest first per partition, with both openings side by side; `--json` for machines.
Exit status: 0 listed (perhaps none), 2 no database. Alert on the metric
`recovery_controller_security_incidents_total` (docs/operations.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ledger import Incident
from ops.commands.db import add_ledger_options
from ops.context import Context, register_command

__all__ = ["register"]

_SCOPE = ("capability", "tool", "environment")
_FIELDS = ("producer", "machine", *_SCOPE, "agent", "correlation_id")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `incidents` subcommand."""
    parser = subparsers.add_parser(
        "incidents",
        help="security incidents (conflicting openings), with both openings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--operation", metavar="ID", help="only this operation's incidents")
    add_ledger_options(parser)
    register_command(parser, _list)


def _json(incident: Incident) -> dict[str, Any]:
    return {"chain": incident.chain, "sequence": incident.sequence, **incident.body}


def _side(opening: Mapping[str, Any], name: str) -> str:
    value = opening.get(name)
    return "-" if value is None else str(value)


def _list(ctx: Context) -> int:
    """List the incidents, oldest first per partition."""
    found = ctx.inspector().incidents(ctx.args.operation)
    if ctx.json:
        ctx.print_json({"incidents": [_json(i) for i in found]})
        return 0
    if not found:
        ctx.say("no security incidents recorded")
        return 0
    for incident in found:
        body = incident.body
        opened, claimed = body.get("opened", {}), body.get("claimed", {})
        differs = set(body.get("differs", ()))
        ctx.say(
            f"INCIDENT {body.get('kind')} on operation {body.get('operation_id')} at "
            f"{body.get('at')} ({incident.chain} #{incident.sequence}): "
            f"{claimed.get('event_type')} {claimed.get('event_id')} differs in "
            f"{', '.join(sorted(differs))}"
        )
        width = max(len(f) for f in _FIELDS)
        ctx.say(f"  {'':{width}}  {'opened (governs)':32}  claimed (refused)")
        for name in _FIELDS:
            mark = "  <- differs" if _differs(name, differs) else ""
            ctx.say(f"  {name:{width}}  {_side(opened, name):32}  {_side(claimed, name)}{mark}")
    ctx.say(f"{len(found)} incident(s)")
    return 0


def _differs(name: str, differs: set[str]) -> bool:
    return (
        name in differs
        or (name in _SCOPE and "scope" in differs)
        or (name == "correlation_id" and "correlation" in differs)
    )
