"""`recoveryctl drill SCENARIO --producer ID --key-file PEM`: a response drill against a
running deployment (CONFORMANCE L4.6), and whether it responded as its machine requires.

The drill publishes the scenario's failure report (`ops/drill.py`, `DRILL_SCENARIOS`)
for a fresh operation whose id starts with `drill-`, signed by `--producer` (a producer
of the controller's roster, with the tool grant the scenario's capability needs) with
its key. The controller decides it like any other operation; every command it emits
carries the drill operation's id, and capability workers answer such commands with
their drill answer without calling their handlers (docs/capability-worker.md). The
drill then reads the operation back from the ledger until it has as many decisions as
the machine requires, or `--timeout` passes (progress on stderr), and compares each
step (event, state before and after, capabilities commanded) with what the decision
core predicts under the controller's machine and policy, and the path with the
scenario's; every answer must be a drill answer, and every command published.

A table, or JSON with `--json`. Exit status: 0 the deployment responded as required
(`pass`), 1 it did not (`fail`: each difference named), 2 usage: an unknown scenario,
no database, broker or rules, an unreadable key.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import OperationRecord, UnknownOperation
from machines import Event, Machine, load_private_key, public_key_text
from ops.commands.db import add_ledger_options
from ops.context import Context, LoadedRules, add_rules_options, register_command, table
from ops.demo_scenarios import Scenario, operation_id_for
from ops.drill import (
    DRILL_SCENARIOS,
    DrillStep,
    compare,
    drill_lineage,
    opening_event,
    path_of,
    predict,
    recorded_steps,
)
from ops.errors import UsageError
from producers import DeliveryFailed, EventPublisher, ProducersError
from schemas import DRILL_OPERATION_PREFIX, RecordSigner, WireError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `drill` subcommand."""
    parser = subparsers.add_parser(
        "drill",
        help="play a failure scenario against the deployment and check its response",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", metavar="SCENARIO", help=", ".join(DRILL_SCENARIOS))
    parser.add_argument(
        "--producer", required=True, metavar="ID", help="the roster producer the drill signs as"
    )
    parser.add_argument(
        "--key-file", type=Path, required=True, metavar="PEM", help="that producer's key"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the deployment (default 60)",
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    parser.add_argument("--events-topic", metavar="TOPIC", help="default: RECOVERY_TOPIC_EVENTS")
    parser.add_argument(
        "--commands-topic", metavar="TOPIC", help="default: RECOVERY_TOPIC_COMMANDS"
    )
    add_ledger_options(parser, json_help="print the verdict as JSON")
    add_rules_options(parser)
    register_command(parser, _drill)


def _drill(ctx: Context) -> int:
    """Play the drill and report its verdict; see the module docstring."""
    args = ctx.args
    scenario, loaded, machine, key = _prepare(ctx)
    ctx.inspector()  # opened first: an unreadable ledger stops the drill before it publishes
    run_id = uuid.uuid4().hex[:8]
    op = operation_id_for(scenario, run_id, prefix=DRILL_OPERATION_PREFIX)
    lineage = drill_lineage(run_id, scenario)
    opening = opening_event(
        scenario, machine, op, run_id, args.producer, lineage, datetime.now(UTC)
    )
    commands_topic = args.commands_topic or ctx.topics.commands
    try:
        with EventPublisher(
            ctx.bootstrap(),
            signer=RecordSigner(args.producer, key),
            topics=ctx.topics,
            security=ctx.kafka("tool"),
        ) as publisher:
            publisher.publish(opening)
    except (DeliveryFailed, ProducersError, WireError) as exc:
        raise UsageError(f"could not publish the drill's event: {exc}") from exc
    ctx.note(
        f"{args.scenario}: published {opening.event_type} for {op} as {args.producer}; "
        f"waiting for the deployment (at most {args.timeout:.0f}s)"
    )
    report = _await(ctx, loaded, machine, scenario, opening, commands_topic)
    report["scenario"] = args.scenario
    report["story"] = scenario.story
    if ctx.json:
        ctx.print_json(report)
    else:
        _render(ctx, report)
    return 0 if report["verdict"] == "pass" else 1


def _prepare(ctx: Context) -> tuple[Scenario, LoadedRules, Machine, Ed25519PrivateKey]:
    """The scenario, rules, machine and signing key; raises saying what is wrong."""
    args = ctx.args
    scenario = DRILL_SCENARIOS.get(args.scenario)
    if scenario is None:
        raise UsageError(f"unknown scenario {args.scenario!r}; one of {', '.join(DRILL_SCENARIOS)}")
    loaded = ctx.rules
    machine = _machine(loaded, scenario.machine)
    if machine is None:
        raise UsageError(f"no pinned machine {scenario.machine}")
    key = load_private_key(args.key_file)
    refusal = _roster_refusal(loaded, args.producer, public_key_text(key.public_key()))
    if refusal is not None:
        raise UsageError(f"{refusal}; nothing was published")
    return scenario, loaded, machine, key


def _roster_refusal(loaded: LoadedRules, producer: str, public_key: str) -> str | None:
    """Why the controller would refuse the drill's signer, checked before publishing."""
    entry = loaded.rules.policy.roster.producer(producer)
    if entry is None:
        return (
            f"producer {producer} is not in the controller's roster; the drill's event must "
            "be signed by a roster producer with the scenario's tool grant"
        )
    if all(k.public_key != public_key for k in entry.keys):
        return f"the key file's public key is not one of roster producer {producer}'s keys"
    return None


def _machine(loaded: LoadedRules, name: str) -> Machine | None:
    found = [m for m in loaded.machines.values() if m.name == name]
    return max(found, key=lambda m: m.version) if found else None


def _await(
    ctx: Context,
    loaded: LoadedRules,
    machine: Machine,
    scenario: Scenario,
    opening: Event,
    commands_topic: str,
) -> dict[str, Any]:
    """Poll the ledger until the drill has every required step and its commands are
    published, or the timeout; then compare (see the module docstring)."""
    op, inspector, timeout = opening.operation_id, ctx.inspector(), ctx.args.timeout
    started = time.monotonic()
    shown = ""
    record: OperationRecord | None = None
    predicted: tuple[DrillStep, ...] = ()
    recorded: tuple[DrillStep, ...] = ()
    while True:
        try:
            record = inspector.operation_record(op)
        except UnknownOperation:
            record = None
        decisions = record.decisions if record is not None else ()
        reporters = {
            str(d["event"]["causation"]): str(d["event"]["producer"])
            for d in decisions
            if d["event"].get("causation")
        }
        predicted = predict(machine, loaded.rules, opening, reporters)
        recorded = recorded_steps(decisions)
        unpublished = _unpublished(record, commands_topic)
        elapsed = time.monotonic() - started
        line = (
            f"drill {op}: {len(recorded)}/{len(predicted)} decision(s), state "
            f"{record.view.state if record else 'not opened yet'}, "
            f"{unpublished} command(s) unpublished"
        )
        if line != shown:
            ctx.note(f"{line} ({elapsed:.0f}s)")
            shown = line
        complete = len(recorded) >= len(predicted) and unpublished == 0
        if complete or elapsed > timeout:
            break
        time.sleep(0.5)
    problems = compare(scenario, predicted, recorded, decisions)
    if unpublished:
        problems.append(f"{unpublished} command(s) of {op} not published by the relay")
    return {
        "operation_id": op,
        "verdict": "fail" if problems else "pass",
        "state": record.view.state if record is not None else None,
        "path": list(path_of(recorded)),
        "expected_path": list(scenario.path),
        "recorded": [s.to_dict() for s in recorded],
        "predicted": [s.to_dict() for s in predicted],
        "problems": problems,
        "elapsed_seconds": round(time.monotonic() - started, 1),
    }


def _unpublished(record: OperationRecord | None, commands_topic: str) -> int:
    if record is None:
        return 0
    return sum(1 for o in record.outbox if o.topic == commands_topic and o.published_at is None)


def _render(ctx: Context, report: dict[str, Any]) -> None:
    ctx.say(f"drill {report['scenario']}: {report['story']}")
    ctx.say(f"operation {report['operation_id']} (a drill: workers answer, never act)")
    rows = []
    predicted, recorded = report["predicted"], report["recorded"]
    for n in range(max(len(predicted), len(recorded))):
        want = predicted[n] if n < len(predicted) else None
        got = recorded[n] if n < len(recorded) else None
        shown = got or want or {}
        rows.append(
            [
                n + 1,
                shown.get("event_type", ""),
                f"{shown.get('state_before', '')} -> {shown.get('state_after', '')}",
                ", ".join(shown.get("commands", ())) or "-",
                "ok" if want == got else ("missing" if got is None else "DIFFERS"),
            ]
        )
    ctx.say(table(["#", "event", "transition", "commands", "vs machine"], rows))
    ctx.say(f"path: {' -> '.join(report['path']) or '(none)'}")
    for problem in report["problems"]:
        ctx.say(f"  - {problem}")
    passed = report["verdict"] == "pass"
    ctx.say(
        f"{'PASS' if passed else 'FAIL'}: the deployment "
        + ("responded as its machine requires" if passed else "did not respond as required")
        + f" ({report['elapsed_seconds']}s)"
    )
