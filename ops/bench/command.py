"""`ops/dev bench` (`python -m ops.bench`): how many events per second one controller
decides, how long from an event to its command, and how much memory it takes, next to
the bare pipeline. A developer's tool: it lives beside the tests, not in the wheel.

Runs against `--bootstrap` / `--database-url`, else RECOVERY_KAFKA_BOOTSTRAP /
RECOVERY_DATABASE_URL, else the local stack (started for the run if none is running,
and stopped after). Everything the run creates (a scratch database, its own topics) is
removed at the end. See docs/PERFORMANCE.md for what each figure means and the results.

Exit status: 0 when the run completed (whether or not the targets held; the table and
the JSON say), 1 when a phase failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import TextIO

from ledger import LedgerError
from ops.bench.report import (
    Progress,
    code_version,
    machine_description,
    render_table,
    write_json,
)
from ops.bench.roles import BenchError
from ops.bench.runner import BenchConfig, run_bench
from ops.context import Context
from ops.errors import NotConfigured, OpsError
from ops.stack import LocalStack, read_state, stack_up
from producers import ProducersError, provision_acls
from schemas import ENV_KAFKA_CONFIG_FILE, KafkaSecurity

__all__ = ["main"]

_QUICK_EVENTS = 300


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="ops/dev bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _arguments(parser)
    return _bench(parser.parse_args(argv))


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=20_000, help="saturation backlog")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--rates", default="200,500,1000", help="offered rates for latency, events/s"
    )
    parser.add_argument(
        "--latency-seconds", type=float, default=15.0, help="how long each rate is offered"
    )
    parser.add_argument(
        "--memory-backlogs",
        default="10000,50000",
        help="backlog sizes for the memory phase (comma-separated)",
    )
    parser.add_argument(
        "--full-memory",
        action="store_true",
        help="add the 200,000-event backlog to the memory phase (several minutes)",
    )
    parser.add_argument(
        "--members",
        default="",
        metavar="N,N,...",
        help="for each N, N controller processes of one group drain a fresh --events "
        "backlog: throughput and CPU per record by number of members (default: none)",
    )
    parser.add_argument(
        "--timers",
        type=int,
        default=100_000,
        metavar="N",
        help="N timers due at once, drained with a fresh backlog (--quick: 300; 0: skip)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record py-spy profiles of the controller and relay during saturation and "
        "rank the statements with pg_stat_statements",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --profile: py-spy unwinds native frames too, and each process's "
        "samples are split by kind of code (Python, the interpreter's runtime, each "
        "native library); py-spy then pauses the processes to sample them, so read "
        "the split, not the rates",
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "recovery-bench" / "bench.json",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run: {_QUICK_EVENTS} events, short phases"
    )
    parser.add_argument(
        "--keep-on-failure",
        action="store_true",
        help="keep the scratch database and topics when a phase fails (for a post-mortem)",
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT")
    parser.add_argument("--database-url", metavar="URL")


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise ValueError(f"{flag} {text!r}: give comma-separated whole numbers") from exc
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: give at least one positive number")
    return values


def _config(args: argparse.Namespace, bootstrap: str, database_url: str) -> BenchConfig:
    rates = _ints(args.rates, "--rates")
    backlogs = _ints(args.memory_backlogs, "--memory-backlogs")
    members = _ints(args.members, "--members") if args.members.strip() else ()
    # A member beyond the partitions would sit idle; --quick uses at most 3.
    partitions = min(args.partitions, 3) if args.quick else args.partitions
    if members and max(members) > partitions:
        raise ValueError(f"--members {args.members}: at most the partitions ({partitions})")
    if args.native and not args.profile:
        raise ValueError("--native: only with --profile")
    if args.full_memory and 200_000 not in backlogs:
        backlogs = (*backlogs, 200_000)
    if args.quick:
        return BenchConfig(
            bootstrap,
            database_url,
            events=_QUICK_EVENTS,
            partitions=partitions,
            rates=rates,
            latency_seconds=1.0,
            memory_backlogs=(150, 300),
            interleave=8,
            phase_timeout=20.0,
            settle_seconds=2.0,
            keep_on_failure=args.keep_on_failure,
            members=members,
            profile=args.profile,
            profile_native=args.native,
            # A quick saturation drain lasts well under a second: the relay's share of
            # it is a few dozen milliseconds of CPU, a handful of samples at 100 a
            # second.
            profile_rate=1000,
            timers=min(args.timers, 300),
        )
    if args.events < 1 or args.partitions < 1:
        raise ValueError("--events and --partitions must be at least 1")
    return BenchConfig(
        bootstrap,
        database_url,
        events=args.events,
        partitions=args.partitions,
        rates=rates,
        latency_seconds=args.latency_seconds,
        memory_backlogs=backlogs,
        keep_on_failure=args.keep_on_failure,
        members=members,
        profile=args.profile,
        profile_native=args.native,
        timers=args.timers,
    )


def _use_bench_principal(bootstrap: str) -> None:
    """On the local stack's secured broker, every client of the benchmark and of the
    role processes it starts (they inherit the environment) connects as `bench`, whose
    ACLs cover the `bench-*` topics and groups it creates. `stack up` makes the
    principals but not their ACLs (`topics create` does), so they are provisioned here
    first, as the stack's admin (idempotent): a fresh stack is benchmarked as it is."""
    state = read_state()
    path = None if state is None else state.kafka.client_files.get("bench")
    if state is None or path is None:
        return
    provision_acls(bootstrap, security=state.kafka.client("admin"))
    os.environ[ENV_KAFKA_CONFIG_FILE] = path


def _services(args: argparse.Namespace, err: TextIO) -> tuple[str, str, bool, LocalStack | None]:
    """The broker and database the flags, the environment or a running local stack
    name (and whether the broker is the stack's, reached as its principals), else a
    local stack started for this run (and stopped after it)."""
    context = Context(args, err=err)
    try:
        bootstrap, database_url = context.bootstrap(), context.database_url()
    except NotConfigured:
        stack = stack_up(progress=err)
        return stack.bootstrap, stack.database_url, True, stack
    on_stack = context.kafka("bench") != KafkaSecurity.from_env()
    return bootstrap, database_url, on_stack, None


def _bench(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    bootstrap, database_url, on_stack, stack = _services(args, err)
    try:
        config = _config(args, bootstrap, database_url)
        if on_stack:
            _use_bench_principal(bootstrap)
    except (ValueError, ProducersError) as exc:
        print(f"ops/dev bench: {exc}", file=err)
        if stack is not None and not stack.reused:
            stack.stop()
        return 2 if isinstance(exc, ValueError) else 1
    progress = Progress(err)
    # The code measured is the code at the start: the tree may change during a long run.
    commit, load_at_start = code_version(), os.getloadavg()
    # SIGTERM unwinds like Ctrl-C, so the role processes, the scratch database and the
    # topics are cleaned up rather than orphaned.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = run_bench(config, progress)
        machine = machine_description(database_url, commit, load_at_start)
    except (BenchError, LedgerError, ProducersError, OpsError) as exc:
        progress.done()
        print(f"ops/dev bench: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        progress.done()
        print("ops/dev bench: interrupted; cleaned up", file=err)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if stack is not None and not stack.reused:
            stack.stop()
    progress.done()
    render_table(result, out)
    write_json(result, machine, _command_line(args), args.json_out)
    print(f"figures written to {args.json_out}", file=out)
    return 0


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (services left out: they are per machine)."""
    parts = ["ops/dev", "bench"]
    if args.quick:
        parts.append("--quick")
    else:
        parts += ["--events", str(args.events), "--partitions", str(args.partitions)]
        parts += ["--latency-seconds", f"{args.latency_seconds:g}"]
        parts += ["--memory-backlogs", args.memory_backlogs]
        if args.full_memory:
            parts.append("--full-memory")
    parts += ["--rates", args.rates]
    if args.members.strip():
        parts += ["--members", args.members]
    parts += ["--timers", str(args.timers)]
    if args.profile:
        parts.append("--profile")
    if args.native:
        parts.append("--native")
    parts += ["--json-out", str(args.json_out)]
    return shlex.join(parts)
