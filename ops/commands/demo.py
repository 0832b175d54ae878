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
afterwards (`recoveryctl stack down` stops it). On the local stack the demo plays in a
sandbox of its own, database `recovery_demo` and topics `recovery-demo.*`, so that a
real controller run on the stack afterwards never reads (and dead-letters) the demo's
events; `eval "$(recoveryctl stack env demo)"` points a shell at the sandbox. Exit 0 only
if everything matched the expected outcome, 1 otherwise, 2 when the services could not
be started.
"""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from ops.context import Context, register_command
from ops.demo import DEMO_DATABASE, DemoReport, demo_sandbox, run_demo
from ops.errors import OpsError, UsageError
from ops.stack import stack_up

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
    register_command(parser, _run)


def _run(ctx: Context) -> int:
    if ctx.services.kafka_bootstrap is None or ctx.services.database_url is None:
        try:
            stack_up(progress=ctx.err)
        except OpsError as exc:
            raise UsageError(f"the services did not start: {exc}") from exc
    services, topics = ctx.runtime_services(), None
    if ctx.stack_home() is not None and ctx.stack is not None:
        admin = ctx.stack.postgres.admin_url or ctx.stack.postgres.url
        services, topics = demo_sandbox(services, admin)
        ctx.note(
            f"playing in the demo's sandbox: database {DEMO_DATABASE}, topics "
            f"{topics.events} ...; a controller on the stack's own topics never sees it"
        )
    report = run_demo(services, ctx.err, topics=topics, timeout=ctx.args.timeout)
    if ctx.json:
        ctx.say(json.dumps(report.to_dict(), indent=2))
    else:
        render(report, ctx.out)
        if topics is not None:
            ctx.say(
                "\nThe demo played in a sandbox of its own (database "
                f"{DEMO_DATABASE}, topics {topics.events}, ...), apart from what a real "
                "controller on this stack reads. Look at it with the CLI or the console:"
            )
            ctx.say('  eval "$(.venv/bin/recoveryctl stack env demo)"')
            ctx.say("  .venv/bin/recoveryctl ops list; .venv/bin/recoveryctl console")
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
            timer = " [timer]" if step.timer else ""
            print(
                f"       {step.event_type:<24} {step.state_before} -> {step.state_after}"
                f" ({step.outcome}){timer}",
                file=out,
            )
        print(f"     commands: {', '.join(sorted(op.commands)) or '(none)'}", file=out)
        if sorted(op.commands) != sorted(op.expected_commands):
            print(f"     expected: {', '.join(sorted(op.expected_commands))}", file=out)
        chain = "verified" if op.audit_intact else "BROKEN"
        print(f"     audit:    {op.audit_records} chained records, chain {chain}", file=out)
        print(f"               {' > '.join(op.audit_chain)}", file=out)
    for failure in report.failures:
        print(f"\nFAIL {failure}", file=out)
    if report.timed_out:
        print("\nFAIL timed out before every operation reached its final state", file=out)
    verdict = "everything matched" if report.ok else "some operations did not match"
    print(f"\n{verdict} ({report.elapsed_seconds:.1f}s)", file=out)
