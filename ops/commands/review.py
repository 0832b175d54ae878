"""`recoveryctl review|approve|reject OPERATION_ID`: a human decides an escalated operation.

- `review OP` prints the review packet (SPEC §9): identities, ids, the initiating request,
  the triggering event, the current state, the ledger history, downstream references,
  the verification evidence, the proposed action and the consequences of approving and
  of rejecting, each decided through the core on the current view (`machines.review`),
  with the packet's digest.
- `approve OP --key-file KEY --packet-digest DIGEST [--expires-in 15m]` and `reject OP
  ...` assemble the packet again from the ledger and refuse when its digest is not the
  one shown (an event arrived, a decision was made: review it again); otherwise they
  sign a HUMAN_APPROVED / HUMAN_REJECTED decision with the approver's Ed25519 private
  key (the approver is the policy roster entry holding that key's public half) for the
  state shown and the proposed target, with an expiry, and publish it to
  `recovery.events` through the client library (`producers.RecoveryClient`). With
  `--wait SECONDS` they wait for the controller's decision on it and print it.

The packet is read in one read-only snapshot (`ledger.LedgerInspector`); the machines
and policy are the controller's (`ops.commands.rules`). Exit status: 0 shown / published
(and, with `--wait`, the decision moved the operation), 1 refused (packet changed, state
accepts no such decision, key not in the roster, the controller refused or did not
decide in time), 2 usage: no database, broker or rules, unknown operation, unreadable key.
"""

from __future__ import annotations

import argparse
import secrets
import textwrap
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from machines import ReviewPacket, Verdict, load_private_key, sign_decision
from ops.commands.db import add_ledger_options
from ops.context import Context, add_rules_options, parse_duration, register_command, table
from ops.errors import Refused
from ops.guidance import guidance_heading, guidance_sentences
from ops.usecases import (
    VERDICT_EVENTS,
    approver_for,
    await_decision,
    proposed_decision,
    review,
    submit_decision,
)

__all__ = ["add_decision_options", "register", "render_packet"]

_VERDICT: dict[str, Verdict] = {"approve": "approved", "reject": "rejected"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `review`, `approve` and `reject` subcommands."""
    parser = subparsers.add_parser(
        "review",
        help="print the review packet of an operation waiting for a human",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("operation_id", metavar="OPERATION_ID")
    add_ledger_options(parser, json_help="print the packet as JSON")
    add_rules_options(parser)
    register_command(parser, _review)
    for verb, verdict in _VERDICT.items():
        parser = subparsers.add_parser(
            verb,
            help=f"sign and publish {VERDICT_EVENTS[verdict]} for a reviewed operation",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("operation_id", metavar="OPERATION_ID")
        add_decision_options(
            parser,
            key_help="the approver's Ed25519 private key (`recoveryctl keys generate`)",
            key_required=True,
        )
        parser.add_argument(
            "--packet-digest",
            required=True,
            metavar="DIGEST",
            help="the digest `recoveryctl review` showed; refused if the packet changed",
        )
        add_ledger_options(parser, json_help="print what was published as JSON")
        add_rules_options(parser)
        register_command(parser, _sign_and_publish)
        parser.set_defaults(verdict=verdict)


def add_decision_options(
    parser: argparse.ArgumentParser, *, key_help: str, key_required: bool
) -> None:
    """The options of a command that signs a human decision and publishes it: the
    approver's key, its expiry, the approver to check, where to publish, how long to
    wait for the controller's decision (`approve`, `reject`, `ops migrate`)."""
    parser.add_argument(
        "--key-file", type=Path, required=key_required, metavar="PEM", help=key_help
    )
    parser.add_argument(
        "--expires-in",
        type=parse_duration,
        default=timedelta(minutes=15),
        metavar="DURATION",
        help="how long the signed decision stays valid (default 15m)",
    )
    parser.add_argument(
        "--approver", metavar="ID", help="check that the key is this roster entry's"
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    parser.add_argument("--events-topic", metavar="TOPIC", help="default: RECOVERY_TOPIC_EVENTS")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for the controller's decision and print it",
    )


def _review(ctx: Context) -> int:
    """Print the packet; 0 shown."""
    found = review(ctx.inspector(), ctx.rules, ctx.args.operation_id, datetime.now(UTC))
    if ctx.json:
        ctx.print_json(found.packet.to_dict())
    else:
        ctx.say(render_packet(found.packet))
    return 0


def _sign_and_publish(ctx: Context) -> int:
    """Review again, compare digests, sign, check and publish; see the module doc."""
    args = ctx.args
    verdict: Verdict = args.verdict
    rules, inspector = ctx.rules, ctx.inspector()
    now = datetime.now(UTC)
    found = review(inspector, rules, args.operation_id, now)
    proposal = found.proposal(verdict, args.packet_digest)
    key = load_private_key(args.key_file)
    approver = approver_for(rules.rules.policy, key, args.approver)
    expires_at = now + args.expires_in
    decision = sign_decision(
        proposed_decision(
            proposal,
            verdict=verdict,
            approver=approver,
            view=found.record.view,
            expires_at=expires_at,
            nonce=secrets.token_hex(16),
        ),
        key,
    )
    subject = f"operation {found.packet.operation_id}"
    with ctx.approver_client(approver, key, subject) as client:
        event = submit_decision(found, decision, client=client, rules=rules, now=now)
    report: dict[str, Any] = {
        "operation_id": found.packet.operation_id,
        "event_type": VERDICT_EVENTS[verdict],
        "event_id": event.event_id,
        "approver": approver,
        "state": proposal["state"],
        "transition": proposal["transition"],
        "expires_at": expires_at.isoformat(),
        "packet_digest": found.packet.digest,
        "decision": None,
    }
    if args.wait > 0:
        report["decision"] = await_decision(
            inspector, found.packet.operation_id, event.event_id, args.wait
        )
    _print_decision(ctx, report)
    return _exit_status(ctx, report)


def _print_decision(ctx: Context, report: Mapping[str, Any]) -> None:
    if ctx.json:
        ctx.print_json(report)
        return
    ctx.say(
        f"published {report['event_type']} {report['event_id']} for {report['operation_id']} "
        f"by {report['approver']}: {report['state']} -> {report['transition']}, valid until "
        f"{report['expires_at']}"
    )
    d = report["decision"]
    if d is not None:
        ctx.say(
            f"controller decided #{d['sequence']}: {d['outcome']}, {d['state_before']} -> "
            f"{d['state_after']}" + "".join(f"; refused {code}" for code in d["refusals"])
        )


def _exit_status(ctx: Context, report: Mapping[str, Any]) -> int:
    wait: float = ctx.args.wait
    if wait <= 0:
        return 0
    decision = report["decision"]
    if decision is None:
        op = report["operation_id"]
        raise Refused(
            f"operation {op}: no decision within {wait:.0f}s; check that the controller "
            f"runs (`recoveryctl ops show {op}`)"
        )
    return 0 if decision["outcome"] == "transitioned" else 1


def render_packet(packet: ReviewPacket) -> str:
    """The packet for a reviewer, section by section, ending with how to decide."""
    c = packet.content
    op, ids = c["operation"], c["identities"]
    lineage = ids["lineage"]
    state = c["current_state"]
    lines = [
        f"REVIEW PACKET {packet.digest}",
        f"  assembled {packet.assembled_at.isoformat()} ({c['packet']})",
        "",
        *guidance_lines(c),
        "",
        "IN DETAIL",
        f"operation    {op['operation_id']}  (correlation {op['correlation_id']})",
        f"machine      {op['machine']['name']}@{op['machine']['version']}  "
        f"{op['machine']['digest']}",
        f"policy       {op['policy']['id']} {op['policy']['digest']}"
        + (
            ""
            if op["policy"]["digest"] == op["policy"]["operation_policy_digest"]
            else f"  (the operation was opened under {op['policy']['operation_policy_digest']})"
        ),
        f"identities   principal {ids['initiating_principal']}, agent {ids['agent']}, runtime "
        f"{ids['runtime'] or '-'}, task {ids['task']}",
        f"lineage      parent {lineage['parent_operation'] or '-'}, origin "
        f"{lineage['origin_operation'] or '-'}, depth {lineage['depth']}, credentials "
        f"{', '.join(lineage['delegated_credentials']) or '-'}",
        f"state        {state['name']} since {state['since'] or '-'} (ledger version "
        f"{state['ledger_version']}; accepts {', '.join(state['accepts']) or 'nothing'})",
        "awaiting     "
        + (", ".join(f"{a['command_id']} ({a['capability']})" for a in state["awaiting"]) or "-"),
    ]
    request = c["initiating_request"]
    if request is not None:
        scope = request.get("scope") or {}
        lines.append(
            f"request      {request['event_type']} {request['event_id']} from "
            f"{request['producer']}: capability {scope.get('capability', '-')}, tool "
            f"{scope.get('tool') or '-'}, evidence {request['evidence_ref']}"
        )
    trigger = c["triggering_event"]
    if trigger is not None:
        lines.append(
            f"triggered by {trigger['event_type']} {trigger['event_id']} (decision "
            f"#{trigger['decision_sequence']})"
        )
    lines += ["", "history"]
    lines.append(
        table(
            ("seq", "event", "type", "producer", "outcome", "state", "commands"),
            [
                (
                    h["sequence"],
                    h["event_id"],
                    h["event_type"],
                    h["producer"],
                    h["outcome"] + (f" ({', '.join(h['refusals'])})" if h["refusals"] else ""),
                    f"{h['state_before']} -> {h['state_after']}",
                    len(h["commands"]) or None,
                )
                for h in c["history"]
            ],
        )
    )
    down = c["downstream"]
    lines += ["", "downstream"]
    lines.append(
        table(
            ("command", "capability", "kind", "answered by"),
            [
                (
                    d["command_id"],
                    d["capability"],
                    d["kind"],
                    d["answered_by"] and f"{d['answered_by']} ({d['result']})",
                )
                for d in down["commands"]
            ],
        )
    )
    if down["descendant_operations"]:
        lines.append(f"  operations below: {', '.join(down['descendant_operations'])}")
    lines.append(f"  evidence references: {', '.join(down['evidence_refs']) or '-'}")
    evidence = c["verification"]
    lines += [
        "",
        f"verification current outcomes: {', '.join(evidence['current_outcomes']) or 'none'}"
        f" (effect epoch {evidence['effect_epoch']})",
    ]
    lines += [
        f"  {v['verifier']}: {v['outcome']} ({v['reference']}, epoch {v['epoch']})"
        for v in evidence["verifications"]
    ]
    lines += [
        f"  checkpoint {k['checkpoint_id']}: {'validated' if k['validated'] else 'NOT validated'}"
        f" ({k['reference']})"
        for k in evidence["checkpoints"]
    ]
    lines += ["", "consequences"]
    for verb, verdict in _VERDICT.items():
        event_type = VERDICT_EVENTS[verdict]
        lines += _consequence_lines(verb, c["consequences"][verb], packet.proposal(event_type))
    lines += [
        "",
        f"to decide: recoveryctl approve {op['operation_id']} --key-file KEY --packet-digest "
        f"{packet.digest}",
        f"       or: recoveryctl reject {op['operation_id']} --key-file KEY --packet-digest "
        f"{packet.digest}",
    ]
    return "\n".join(lines)


def _consequence_lines(
    verb: str, consequence: Mapping[str, Any] | None, proposal: Mapping[str, Any] | None
) -> list[str]:
    if consequence is None or proposal is None:
        return [f"  {verb}: not accepted in this state (the controller would reject it)"]
    lines = [
        f"  {verb}: {consequence['outcome']}, {consequence['state_before']} -> "
        f"{consequence['state_after']}"
        + (f" (guard {proposal['guard']})" if proposal["guard"] else "")
    ]
    for command in consequence["commands"]:
        params = ", ".join(f"{k}={v}" for k, v in sorted(command["params"].items()))
        lines.append(f"    command {command['capability']} ({command['kind']}) {params}".rstrip())
    if not consequence["commands"]:
        lines.append("    no commands")
    lines += [f"    refused {r['code']}: {r['message']}" for r in consequence["refusals"]]
    lines += [f"    error {r['code']}: {r['message']}" for r in consequence["errors"]]
    return lines


# --- guidance: the packet in plain words (ops/guidance.py) ---------------------------

_WIDTH = 92


def guidance_lines(content: Mapping[str, Any]) -> list[str]:
    """The packet's guidance for a person who has never seen the machine, wrapped for a
    terminal: the same sentences the console shows (`ops.guidance`)."""
    lines = ["WHAT YOU ARE ASKED TO DECIDE"]
    lines += textwrap.wrap(
        guidance_heading(content), _WIDTH, initial_indent="  ", subsequent_indent="  "
    )
    for label, text in guidance_sentences(content):
        lines += textwrap.wrap(
            text, _WIDTH, initial_indent=f"  {label:<10}", subsequent_indent=" " * 12
        )
    return lines
