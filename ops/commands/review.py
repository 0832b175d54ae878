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
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import LedgerError, LedgerInspector, OperationRecord, UnknownOperation
from machines import Lineage, Policy, ReviewPacket, Verdict, public_key_b64, review_packet
from ops.commands.db import add_ledger_options
from ops.commands.output import (
    open_inspector,
    print_json,
    resolve_bootstrap,
    table,
    topics_with,
)
from ops.commands.rules import LoadedRules, add_rules_options, load_rules_or_report, parse_duration
from producers import DeliveryFailed, EventPublisher, ProducersError, RecoveryClient
from schemas import RecordSigner, WireError

__all__ = ["assemble_packet", "load_private_key", "register", "render_packet", "run_review"]

_EVENT = {"approve": "HUMAN_APPROVED", "reject": "HUMAN_REJECTED"}
_VERDICT: dict[str, Verdict] = {"approve": "approved", "reject": "rejected"}


class PacketError(Exception):
    """The packet cannot be assembled for this operation (named in the message)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `review`, `approve` and `reject` subcommands."""
    review = subparsers.add_parser(
        "review",
        help="print the review packet of an operation waiting for a human",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    review.add_argument("operation_id", metavar="OPERATION_ID")
    add_ledger_options(review, json_help="print the packet as JSON")
    add_rules_options(review)
    review.set_defaults(handler=run_review)
    for verb in ("approve", "reject"):
        parser = subparsers.add_parser(
            verb,
            help=f"sign and publish {_EVENT[verb]} for a reviewed operation",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("operation_id", metavar="OPERATION_ID")
        parser.add_argument(
            "--key-file",
            type=Path,
            required=True,
            metavar="PEM",
            help="the approver's Ed25519 private key (`recoveryctl keys generate`)",
        )
        parser.add_argument(
            "--packet-digest",
            required=True,
            metavar="DIGEST",
            help="the digest `recoveryctl review` showed; refused if the packet changed",
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
        parser.add_argument(
            "--events-topic", metavar="TOPIC", help="default: RECOVERY_TOPIC_EVENTS"
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="wait this long for the controller's decision and print it",
        )
        add_ledger_options(parser, json_help="print what was published as JSON")
        add_rules_options(parser)
        parser.set_defaults(handler=run_decide, verb=verb)


def assemble_packet(record: OperationRecord, loaded: LoadedRules, now: datetime) -> ReviewPacket:
    """The review packet of `record` under the controller's machines and policy. Raises
    `PacketError` when the operation's machine is not pinned by those rules."""
    row = record.row
    machine = loaded.machine_for(row["machine_name"], row["machine_version"], row["machine_digest"])
    if machine is None:
        raise PacketError(
            f"operation {row['operation_id']} runs machine {row['machine_name']}@"
            f"{row['machine_version']} ({row['machine_digest']}), which the lock file does not "
            "pin with that digest; pass the controller's --lock"
        )
    return review_packet(
        machine=machine,
        policy=loaded.rules.policy,
        registry=loaded.rules.registry,
        view=record.view,
        operation=row,
        events=[e.envelope for e in record.events],
        decisions=record.decisions,
        descendants=record.descendants,
        now=now,
    )


def _packet_for(
    command: str, args: argparse.Namespace, err: TextIO
) -> tuple[ReviewPacket, OperationRecord, LoadedRules, LedgerInspector] | int:
    loaded = load_rules_or_report(command, args, err)
    if loaded is None:
        return 2
    inspector = open_inspector(command, args.database_url, err)
    if inspector is None:
        return 2
    try:
        record = inspector.operation_record(args.operation_id)
        packet = assemble_packet(record, loaded, datetime.now(UTC))
    except UnknownOperation as exc:
        inspector.close()
        print(f"recoveryctl {command}: {exc}; list them with `recoveryctl ops list`", file=err)
        return 2
    except (LedgerError, PacketError) as exc:
        inspector.close()
        print(f"recoveryctl {command}: {exc}", file=err)
        return 2
    return packet, record, loaded, inspector


def run_review(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Print the packet; 0 shown, 2 unusable database, rules or operation."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    found = _packet_for("review", args, err)
    if isinstance(found, int):
        return found
    packet, _, _, inspector = found
    inspector.close()
    if args.json:
        print_json(packet.to_dict(), out)
    else:
        print(render_packet(packet), file=out)
    return 0


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file `path`; raises `ValueError` saying why not."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"cannot read private key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key; make one with `keys generate`")
    return key


def _approver_for(policy: Policy, key: Ed25519PrivateKey, wanted: str | None) -> str:
    public = public_key_b64(key)
    holders = [a.id for a in policy.approvers if a.public_key == public]
    if not holders:
        raise ValueError(
            f"the key's public half {public} is not in policy {policy.id}'s approver roster; "
            "add it (`recoveryctl keys show FILE` prints the entry) and restart the controller"
        )
    if wanted is not None and wanted not in holders:
        raise ValueError(f"the key belongs to approver {holders[0]} in the roster, not {wanted}")
    return wanted or holders[0]


def run_decide(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Re-assemble the packet, compare digests, sign and publish; see the module doc."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    verb: str = args.verb
    found = _packet_for(verb, args, err)
    if isinstance(found, int):
        return found
    packet, record, loaded, inspector = found
    try:
        return _decide(args, verb, packet, record, loaded, inspector, out, err)
    finally:
        inspector.close()


def _decide(
    args: argparse.Namespace,
    verb: str,
    packet: ReviewPacket,
    record: OperationRecord,
    loaded: LoadedRules,
    inspector: LedgerInspector,
    out: TextIO,
    err: TextIO,
) -> int:
    op = packet.operation_id
    if packet.digest != args.packet_digest:
        print(
            f"recoveryctl {verb}: operation {op}: the review packet changed since it was shown "
            f"(shown {args.packet_digest}, now {packet.digest}; state "
            f"{record.view.state}, {len(record.decisions)} decision(s)); nothing was signed: "
            f"review it again with `recoveryctl review {op}`",
            file=err,
        )
        return 1
    event_type = _EVENT[verb]
    proposal = packet.proposal(event_type)
    if proposal is None:
        print(
            f"recoveryctl {verb}: operation {op} is in state {record.view.state}, which does "
            f"not accept {event_type}; nothing was signed",
            file=err,
        )
        return 1
    try:
        key = load_private_key(args.key_file)
        approver = _approver_for(loaded.rules.policy, key, args.approver)
    except ValueError as exc:
        print(f"recoveryctl {verb}: {exc}", file=err)
        return 2 if "cannot read" in str(exc) or "not an Ed25519" in str(exc) else 1
    bootstrap = resolve_bootstrap(args.bootstrap, err, verb)
    if bootstrap is None:
        return 2
    expires_at = datetime.now(UTC) + args.expires_in
    row = record.row
    lineage = Lineage(
        agent=row["agent"],
        task=row["task"],
        initiating_principal=row["initiating_principal"],
        origin_operation=row["origin_operation"],
        parent_operation=row["parent_operation"],
        delegated_credentials=tuple(row["delegated_credentials"]),
    )
    try:
        # The approver signs the record as its producer with the same key (the roster lists
        # the approver with role `approver`), and the decision inside it.
        signer = RecordSigner(approver, key)
        with EventPublisher(
            bootstrap, signer=signer, topics=topics_with(args.events_topic)
        ) as publisher:
            event = RecoveryClient(publisher, approver).publish_human_decision(
                private_key=key,
                verdict=_VERDICT[verb],
                operation_id=op,
                correlation_id=row["correlation_id"],
                machine_name=row["machine_name"],
                machine_version=row["machine_version"],
                machine_digest=record.view.machine_digest,
                state=str(proposal["state"]),
                transition=str(proposal["transition"]),
                lineage=lineage,
                expires_at=expires_at,
                reviewed_digest=str(proposal.get("reviewed_digest", "")),
            )
    except (DeliveryFailed, ProducersError, WireError) as exc:
        print(f"recoveryctl {verb}: operation {op}: could not publish: {exc}", file=err)
        return 1
    report: dict[str, Any] = {
        "operation_id": op,
        "event_type": event_type,
        "event_id": event.event_id,
        "approver": approver,
        "state": proposal["state"],
        "transition": proposal["transition"],
        "expires_at": expires_at.isoformat(),
        "packet_digest": packet.digest,
        "decision": None,
    }
    if args.wait > 0:
        report["decision"] = _await_decision(inspector, op, event.event_id, args.wait)
    if args.json:
        print_json(report, out)
    else:
        print(
            f"published {event_type} {event.event_id} for {op} by {approver}: "
            f"{proposal['state']} -> {proposal['transition']}, valid until "
            f"{expires_at.isoformat()}",
            file=out,
        )
        if report["decision"] is not None:
            d = report["decision"]
            print(
                f"controller decided #{d['sequence']}: {d['outcome']}, {d['state_before']} -> "
                f"{d['state_after']}" + "".join(f"; refused {r['code']}" for r in d["refusals"]),
                file=out,
            )
    return _exit_status(args.wait, report["decision"], verb, op, err)


def _exit_status(
    wait: float, decision: Mapping[str, Any] | None, verb: str, op: str, err: TextIO
) -> int:
    if wait <= 0:
        return 0
    if decision is None:
        print(
            f"recoveryctl {verb}: operation {op}: no decision within {wait:.0f}s; check that "
            f"the controller runs (`recoveryctl ops show {op}`)",
            file=err,
        )
        return 1
    return 0 if decision["outcome"] == "transitioned" else 1


def _await_decision(
    inspector: LedgerInspector, op: str, event_id: str, wait: float
) -> dict[str, Any] | None:
    deadline = time.monotonic() + wait
    while True:
        for decision in inspector.operation_record(op).decisions:
            if decision["event"]["id"] == event_id:
                return {
                    "sequence": decision["sequence"],
                    "outcome": decision["outcome"],
                    "state_before": decision["state_before"],
                    "state_after": decision["state_after"],
                    "refusals": decision["refusals"],
                }
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


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
    for verb in ("approve", "reject"):
        lines += _consequence_lines(verb, c["consequences"][verb], packet.proposal(_EVENT[verb]))
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
