"""`recoveryctl demo`: play an incident through the whole system and show what happened.

Starts the local stack (`recoveryctl stack up`, or uses the services named by
--bootstrap/--database-url or RECOVERY_KAFKA_BOOTSTRAP/RECOVERY_DATABASE_URL), applies
the ledger migrations, creates the topics, starts the controller (in demo mode, under
ops/demo_policy.yaml, whose approver key is derived from a public name: a WARNING says
so; never run a deployment like this), the outbox relay and the example capability
worker, and plays seven failed agent operations through the
catalogue machines, with a signed human approval and rejection. Then it prints each
operation's path through its states, the commands the controller emitted (read back
from the commands topic) and whether its audit chain verifies. The stack keeps running
afterwards (`recoveryctl stack down` stops it). Exit 0 only if everything matched the
expected outcome, 1 otherwise, 2 when the services could not be started.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from ledger import LedgerError
from ops.commands.run import Services
from ops.demo import DemoError, DemoReport, run_demo
from ops.errors import OpsError
from ops.stack import stack_up
from producers import ProducersError

__all__ = ["register", "render"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `demo` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="play an incident end to end on the local stack and show what happened",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="use this Kafka broker")
    parser.add_argument("--database-url", metavar="URL", help="use this PostgreSQL database")
    parser.add_argument(
        "--timeout", type=float, default=120.0, metavar="S", help="wait at most S seconds"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=_run)


def _services(args: argparse.Namespace, progress: TextIO) -> Services:
    if args.bootstrap and args.database_url:
        return Services(args.bootstrap, args.database_url)
    stack = stack_up(progress=progress)
    # On the stack's own broker each component connects as its principal; a broker
    # named by --bootstrap is reached with the environment's Kafka security settings.
    kafka = (
        {} if args.bootstrap else {c: stack.kafka_client(c) for c in stack.state.kafka.client_files}
    )
    if args.database_url:
        return Services(args.bootstrap or stack.bootstrap, args.database_url, kafka=kafka)
    roles = stack.state.postgres.role_urls
    return Services(
        args.bootstrap or stack.bootstrap,
        stack.database_url,
        roles.get("controller"),
        roles.get("relay"),
        kafka,
    )


def _run(args: argparse.Namespace) -> int:
    # Looked up now, not at import: tests and callers may have replaced the streams.
    out, err = sys.stdout, sys.stderr
    try:
        services = _services(args, err)
    except OpsError as exc:
        print(f"recoveryctl demo: the services did not start: {exc}", file=err)
        return 2
    try:
        report = run_demo(services, err, timeout=args.timeout)
    except (DemoError, LedgerError, ProducersError) as exc:
        print(f"recoveryctl demo: {exc}", file=err)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
    else:
        render(report, out)
    return 0 if report.ok else 1


def render(report: DemoReport, out: TextIO) -> None:
    """The report for people: per operation its story, path, commands and audit."""
    mark = {True: "ok  ", False: "FAIL"}
    print(f"\nIncident {report.run_id}: {len(report.operations)} operations", file=out)
    for op in report.operations:
        print(f"\n{mark[op.ok]} {op.scenario} ({op.machine}, {op.operation_id})", file=out)
        print(f"     {op.story}", file=out)
        print(f"     path:     {' -> '.join(op.path) or '(never opened)'}", file=out)
        if op.path != op.expected_path:
            print(f"     expected: {' -> '.join(op.expected_path)}", file=out)
        for step in op.steps:
            print(
                f"       {step.event_type:<24} {step.state_before} -> {step.state_after}"
                f" ({step.outcome})",
                file=out,
            )
        print(f"     commands: {', '.join(sorted(op.commands)) or '(none)'}", file=out)
        if sorted(op.commands) != sorted(op.expected_commands):
            print(f"     expected: {', '.join(sorted(op.expected_commands))}", file=out)
        chain = "verified" if op.audit_intact else "BROKEN"
        print(f"     audit:    {op.audit_records} chained records, chain {chain}", file=out)
    for failure in report.failures:
        print(f"\nFAIL {failure}", file=out)
    if report.timed_out:
        print("\nFAIL timed out before every operation reached its final state", file=out)
    verdict = "everything matched" if report.ok else "some operations did not match"
    print(f"\n{verdict} ({report.elapsed_seconds:.1f}s)", file=out)
