"""`recoveryctl test PATH...`: run machine test cases through the decision core.

Each case file in a package's `tests/` folder is run against that package's machine
by `machines.Simulation`, through the same fold (`machines.BatchFold`: open, `decide`,
`apply`) the controller runs over each batch. Exit 0 when every case passes, 1 when one
fails (with a readable expected-vs-actual diff), 2 when a path, case file, machine or
registry is unusable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from machines import (
    DEFAULT_REGISTRY,
    SCENARIOS,
    CaseError,
    CaseResult,
    Machine,
    MachineError,
    SuiteResult,
    discover,
    load_case,
    load_machine,
    load_registry,
    run_case,
)
from ops.context import Context, register_command
from ops.errors import UsageError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `test` subcommand."""
    parser = subparsers.add_parser(
        "test",
        help="run machine test cases (package tests/*.yaml) through the decision core",
        description=(
            "Run the test cases of machine packages. PATH may be a case file, a package "
            "folder or a folder of packages. Exit 0 when all pass, 1 on a failing case, "
            "2 when an input is unusable."
        ),
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    parser.add_argument(
        "--registry",
        type=Path,
        default=DEFAULT_REGISTRY,
        help="administrator registry (default: the shipped one)",
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    register_command(parser, _run)


def _run(ctx: Context) -> int:
    try:
        suite = _suite(ctx.args.paths, ctx.args.registry)
    except (CaseError, MachineError) as exc:
        raise UsageError(str(exc)) from exc
    if ctx.json:
        ctx.say(json.dumps(suite.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        _print_human(ctx, suite)
    return 0 if suite.passed else 1


def _suite(paths: list[Path], registry_path: Path) -> SuiteResult:
    registry = load_registry(registry_path)
    machines: dict[Path, Machine] = {}
    results: list[CaseResult] = []
    pairs = discover(paths)
    if not pairs:
        raise CaseError(f"no case files found under {', '.join(map(str, paths))}")
    for package, case_path in pairs:
        if package not in machines:
            machines[package] = load_machine(package, registry)
        results.append(run_case(case_path, load_case(case_path), machines[package], registry))
    return SuiteResult(tuple(results))


def _show(value: Any) -> str:
    return json.dumps(value, default=str)


def _print_human(ctx: Context, suite: SuiteResult) -> None:
    for result in suite.results:
        mark = "PASS" if result.passed else "FAIL"
        ctx.say(f"{mark} {result.path} :: {result.name}  [{'; '.join(result.scenarios)}]")
        last_step = None
        for m in result.mismatches:
            if m.step != last_step:
                ctx.say(f"    step {m.step} ({m.label}):")
                last_step = m.step
            ctx.say(f"      {m.field}:")
            ctx.say(f"        expected {_show(m.expected)}")
            ctx.say(f"        actual   {_show(m.actual)}")
        if not result.passed:
            _print_context(ctx, result)
    data = suite.to_dict()
    counts = data["counts"]
    ctx.say(
        f"{counts['cases']} cases: {counts['passed']} passed, {counts['failed']} failed; "
        f"scenarios covered {len(data['scenarios_covered'])}/{len(SCENARIOS)}"
    )
    if data["scenarios_missing"]:
        ctx.say("missing scenarios: " + "; ".join(data["scenarios_missing"]))


def _print_context(ctx: Context, result: CaseResult) -> None:
    # The decisions of the failing steps explain the diff: what was refused and why.
    failing = {m.step for m in result.mismatches}
    for index, decisions in enumerate(result.steps, start=1):
        if index not in failing:
            continue
        for decision in decisions:
            notes = [f"{n.code}: {n.message}" for n in (*decision.refusals, *decision.errors)]
            guards = ", ".join(f"{g.guard}={g.value}" for g in decision.guards)
            ctx.say(
                f"    step {index} decided {decision.event_type} {decision.outcome} "
                f"{decision.state_before} -> {decision.state_after}; guards [{guards}]"
            )
            for note in notes:
                ctx.say(f"      note {note}")
