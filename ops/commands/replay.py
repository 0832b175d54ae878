"""`recoveryctl replay --verify [OPERATION_ID ...]`: are the recorded decisions the ones
the pinned machine and policy make on the recorded events?

For every operation (or the ones named), the ledger's events are decided again through
the machine the operation is pinned to and the controller's policy, each at the time it
was decided (`machines.replay`), each under the policy its decision names, and each
replayed decision is compared, field by field, with the decision row (recoverability
paper §7.3: decisions checkable apart from outcomes). Every mismatch is reported. The
policies are the one loaded and every one the controllers recorded in the audit stream
when they started or reloaded their rules (`consumer.reload`: the `rules:<group>`
chains). An operation migrated between machine versions is replayed across the move,
each event under the version that decided it. An operation whose machine versions are
not all pinned by the lock file, or one of whose decisions names a policy digest found
in neither, cannot be checked and is reported as such.

Read from one read-only snapshot per operation (`ledger.LedgerInspector`). A table, or
JSON with `--json`. Exit status: 0 every checked decision replays, 1 a mismatch (or an
operation that could not be checked), 2 no database or rules, or an unknown operation.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from consumer import rules_chain_id
from ledger import Ledger, LedgerInspector, OperationRecord
from machines import (
    Arrival,
    EventError,
    Policy,
    compare_decisions,
    parse_event,
    replay_decisions,
)
from ops.commands.db import add_ledger_options
from ops.context import Context, LoadedRules, add_rules_options, register_command, table

__all__ = ["register", "verify_operation"]

_ALL = 10_000_000
# Every group's rules chain starts so (`consumer.rules_chain_id`).
RULES_CHAIN_PREFIX = rules_chain_id("")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `replay` subcommand."""
    parser = subparsers.add_parser(
        "replay",
        help="recompute recorded decisions from the ledger's events and compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("operation_ids", nargs="*", metavar="OPERATION_ID")
    parser.add_argument(
        "--verify",
        action="store_true",
        required=True,
        help="compare each recorded decision with its replay (the only mode)",
    )
    add_ledger_options(parser, json_help="print the report as JSON")
    add_rules_options(parser)
    register_command(parser, _replay)


def recorded_policies(ledger: Ledger) -> dict[str, Policy]:
    """Every policy the controllers recorded on their rules chains (`consumer.reload`),
    by digest; a document that no longer validates, or validates to another digest, is
    left out (a decision naming it is then reported unchecked)."""
    found: dict[str, Policy] = {}
    for chain in ledger.audit_operation_ids():
        if not chain.startswith(RULES_CHAIN_PREFIX):
            continue
        records, _ = ledger.audit_chain(chain)
        for record in records:
            for digest, document in (record.record.get("policies") or {}).items():
                try:
                    policy = Policy.model_validate(document)
                except ValueError:
                    continue
                if policy.digest == digest:
                    found.setdefault(digest, policy)
    return found


def verify_operation(
    record: OperationRecord, loaded: LoadedRules, policies: Mapping[str, Policy] | None = None
) -> dict[str, Any]:
    """The replay verdict of one operation: `status` `ok`, `mismatch` or `unchecked`,
    the number of decisions, and each mismatch described. `policies` are the recorded
    ones by digest (`recorded_policies`), besides the loaded one."""
    row = record.row
    op = str(row["operation_id"])
    result: dict[str, Any] = {
        "operation_id": op,
        "decisions": len(record.decisions),
        "status": "ok",
        "mismatches": [],
        "reason": None,
    }
    # Every version the operation was decided under (it may have been migrated): the
    # first opens it, and each must be pinned.
    ran = {
        (str(d["machine"]["name"]), str(d["machine"]["version"]), str(d["machine"]["digest"]))
        for d in record.decisions
    } | {(row["machine_name"], row["machine_version"], row["machine_digest"])}
    first = record.decisions[0]["machine"] if record.decisions else None
    opening = (
        (row["machine_name"], row["machine_version"], row["machine_digest"])
        if first is None
        else (first["name"], first["version"], first["digest"])
    )
    machine = loaded.machine_for(*opening)
    policy = loaded.rules.policy
    missing = sorted(f"{n}@{v} ({d})" for n, v, d in ran if loaded.machine_for(n, v, d) is None)
    if machine is None or missing:
        result["status"] = "unchecked"
        result["reason"] = (
            f"machine {', '.join(missing)} is not pinned by the lock file; pass the "
            "controller's --lock"
        )
        return result
    # The roster is not part of a policy's digest, and a recorded document has none:
    # the loaded one's stands in for it (replay checks no signature).
    known = {
        d: p.model_copy(update={"producers": policy.producers}) for d, p in (policies or {}).items()
    }
    known[policy.digest] = policy
    digests = sorted({str(d["policy_digest"]) for d in record.decisions} - set(known))
    if digests:
        result["status"] = "unchecked"
        result["reason"] = (
            f"decided under policy {', '.join(digests)}, neither the loaded {policy.id} "
            f"{policy.digest} nor one the controllers recorded; pass that policy with --policy"
        )
        return result
    try:
        events = [parse_event(e.envelope) for e in record.events]
    except EventError as exc:
        result["status"] = "mismatch"
        result["mismatches"] = [f"operation {op}: a stored event no longer validates: {exc}"]
        return result
    times = [datetime.fromisoformat(str(d["decided_at"])) for d in record.decisions]
    recorded_ids = [d["event"]["id"] for d in record.decisions]
    if [e.event_id for e in events] != recorded_ids:
        result["status"] = "mismatch"
        result["mismatches"] = [
            f"operation {op}: the stored events {[e.event_id for e in events]} are not the "
            f"events the decisions name {recorded_ids}; a row was added or removed"
        ]
        return result
    arrival = Arrival(
        op,
        ancestors=tuple(row["ancestors"]),
        lineage_agents=tuple(sorted(record.view.lineage.lineage_agents)),
    )
    under = [known[str(d["policy_digest"])] for d in record.decisions]
    replayed = replay_decisions(
        machine, loaded.rules, events, times, arrival, loaded.machines, under
    )
    found = compare_decisions(op, record.decisions, replayed)
    if found:
        result["status"] = "mismatch"
        result["mismatches"] = [m.describe() for m in found]
        result["fields"] = sorted({f for m in found for f in m.fields})
    return result


def _replay(ctx: Context) -> int:
    """Verify every (or each named) operation; see the module docstring."""
    results = _verify_all(ctx.inspector(), ctx.rules, list(ctx.args.operation_ids))
    failed = [r for r in results if r["status"] != "ok"]
    if ctx.json:
        ctx.print_json(
            {
                "operations": results,
                "checked": sum(1 for r in results if r["status"] != "unchecked"),
                "mismatched": sum(1 for r in results if r["status"] == "mismatch"),
            }
        )
        return 1 if failed else 0
    ctx.say(
        table(
            ("operation", "decisions", "replay"),
            [(r["operation_id"], r["decisions"], r["status"].upper()) for r in results],
        )
    )
    for r in failed:
        for line in r["mismatches"] or [r["reason"]]:
            ctx.say(f"  {line}")
    ctx.say(f"{len(results) - len(failed)} of {len(results)} operation(s) replay as recorded")
    return 1 if failed else 0


def _verify_all(
    inspector: LedgerInspector, loaded: LoadedRules, operation_ids: list[str]
) -> list[dict[str, Any]]:
    ids = operation_ids or [o.operation_id for o in inspector.operations(limit=_ALL)]
    policies = recorded_policies(inspector)
    return [
        verify_operation(inspector.operation_record(op), loaded, policies) for op in sorted(ids)
    ]
