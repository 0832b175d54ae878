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
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import LedgerError, LedgerInspector, OperationRecord, UnknownOperation
from machines import Event, Machine, public_key_text
from ops.commands.db import add_ledger_options
from ops.commands.output import open_inspector, print_json, resolve_bootstrap, table, topics_with
from ops.commands.review import load_private_key
from ops.commands.rules import LoadedRules, add_rules_options, load_rules_or_report
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
from producers import DeliveryFailed, EventPublisher, ProducersError
from schemas import DRILL_OPERATION_PREFIX, RecordSigner, WireError

__all__ = ["register", "run_drill"]


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
    parser.set_defaults(handler=run_drill)


def run_drill(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Play the drill and report its verdict; see the module docstring."""
    out, err = out or sys.stdout, err or sys.stderr
    prepared = _prepare(args, err)
    if prepared is None:
        return 2
    scenario, loaded, machine, key = prepared
    bootstrap = resolve_bootstrap(args.bootstrap, err, "drill")
    if bootstrap is None:
        return 2
    inspector = open_inspector("drill", args.database_url, err)
    if inspector is None:
        return 2
    run_id = uuid.uuid4().hex[:8]
    op = operation_id_for(scenario, run_id, prefix=DRILL_OPERATION_PREFIX)
    lineage = drill_lineage(run_id, scenario)
    opening = opening_event(
        scenario, machine, op, run_id, args.producer, lineage, datetime.now(UTC)
    )
    topics = topics_with(args.events_topic)
    commands_topic = args.commands_topic or topics.commands
    try:
        with EventPublisher(
            bootstrap, signer=RecordSigner(args.producer, key), topics=topics
        ) as publisher:
            publisher.publish(opening)
        print(
            f"drill {args.scenario}: published {opening.event_type} for {op} as "
            f"{args.producer}; waiting for the deployment (at most {args.timeout:.0f}s)",
            file=err,
        )
        report = _await(inspector, loaded, machine, scenario, opening, commands_topic, args, err)
    except (DeliveryFailed, ProducersError, WireError) as exc:
        print(f"recoveryctl drill: could not publish the drill's event: {exc}", file=err)
        return 2
    except LedgerError as exc:
        print(f"recoveryctl drill: {exc}", file=err)
        return 2
    finally:
        inspector.close()
    report["scenario"] = args.scenario
    report["story"] = scenario.story
    if args.json:
        print_json(report, out)
    else:
        _render(report, out)
    return 0 if report["verdict"] == "pass" else 1


def _prepare(
    args: argparse.Namespace, err: TextIO
) -> tuple[Scenario, LoadedRules, Machine, Ed25519PrivateKey] | None:
    """The scenario, rules, machine and signing key, or None after saying what is wrong."""
    scenario = DRILL_SCENARIOS.get(args.scenario)
    if scenario is None:
        print(
            f"recoveryctl drill: unknown scenario {args.scenario!r}; one of "
            f"{', '.join(DRILL_SCENARIOS)}",
            file=err,
        )
        return None
    loaded = load_rules_or_report("drill", args, err)
    if loaded is None:
        return None
    machine = _machine(loaded, scenario.machine)
    if machine is None:
        print(f"recoveryctl drill: no pinned machine {scenario.machine}", file=err)
        return None
    try:
        key = load_private_key(args.key_file)
    except ValueError as exc:
        print(f"recoveryctl drill: {exc}", file=err)
        return None
    refusal = _roster_refusal(loaded, args.producer, public_key_text(key.public_key()))
    if refusal is not None:
        print(f"recoveryctl drill: {refusal}; nothing was published", file=err)
        return None
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
    inspector: LedgerInspector,
    loaded: LoadedRules,
    machine: Machine,
    scenario: Scenario,
    opening: Event,
    commands_topic: str,
    args: argparse.Namespace,
    err: TextIO,
) -> dict[str, Any]:
    """Poll the ledger until the drill has every required step and its commands are
    published, or the timeout; then compare (see the module docstring)."""
    op = opening.operation_id
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
            print(f"{line} ({elapsed:.0f}s)", file=err)
            shown = line
        complete = len(recorded) >= len(predicted) and unpublished == 0
        if complete or elapsed > args.timeout:
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


def _render(report: dict[str, Any], out: TextIO) -> None:
    print(f"drill {report['scenario']}: {report['story']}", file=out)
    print(f"operation {report['operation_id']} (a drill: workers answer, never act)", file=out)
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
    print(table(["#", "event", "transition", "commands", "vs machine"], rows), file=out)
    print(f"path: {' -> '.join(report['path']) or '(none)'}", file=out)
    for problem in report["problems"]:
        print(f"  - {problem}", file=out)
    verdict = "PASS" if report["verdict"] == "pass" else "FAIL"
    print(
        f"{verdict}: the deployment "
        + (
            "responded as its machine requires"
            if verdict == "PASS"
            else "did not respond as required"
        )
        + f" ({report['elapsed_seconds']}s)",
        file=out,
    )
