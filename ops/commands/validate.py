"""`recoveryctl validate PATH...`: validate machine packages and print their digests.

PATH is a package folder or a RECOVERY.yaml file. Every problem of every machine is
reported at once, each with its code, location and a hint. Exit status: 0 when all are
valid, 1 when any is invalid, 2 on usage errors (unreadable registry, missing path).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from machines import (
    DEFAULT_REGISTRY,
    Problem,
    Registry,
    RegistryInvalid,
    ValidationReport,
    overlap_warning,
    overlapping_pairs,
    validate_path,
)
from machines import (
    load_registry as read_registry,
)
from ops.context import Context, register_command
from ops.errors import UsageError

__all__ = ["load_registry", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `validate` subcommand."""
    parser = subparsers.add_parser(
        "validate",
        help="validate RECOVERY.yaml machine packages; print digests or every problem",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    parser.add_argument(
        "--registry",
        type=Path,
        default=DEFAULT_REGISTRY,
        metavar="FILE",
        help=f"administrator registry to resolve guards and actions (default: {DEFAULT_REGISTRY})",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of results")
    register_command(parser, _validate)


def load_registry(path: Path) -> Registry:
    """The registry at `path`; `UsageError` listing every problem when it is refused."""
    try:
        return read_registry(path)
    except RegistryInvalid as exc:
        problems = "".join(f"\n  {problem}" for problem in exc.problems)
        raise UsageError(f"registry {path} refused:{problems}") from exc


def _print_problem(problem: Problem, kind: str, out: TextIO) -> None:
    print(f"  {kind} {problem.location}: {problem.code}: {problem.message}", file=out)
    if problem.hint:
        print(f"      hint: {problem.hint}", file=out)


def _print_human(report: ValidationReport, out: TextIO) -> None:
    if report.valid:
        print(f"{report.path}: valid {report.name}@{report.version} {report.digest}", file=out)
    else:
        count = len(report.errors)
        print(f"{report.path}: INVALID ({count} error{'s' if count != 1 else ''})", file=out)
    for problem in report.errors:
        _print_problem(problem, "error", out)
    for problem in report.warnings:
        _print_problem(problem, "warning", out)


def _with_overlaps(reports: list[ValidationReport]) -> list[ValidationReport]:
    """Warn on each valid machine whose applies_to overlaps another's: the controller
    would refuse an operation that both govern."""
    by_digest = {r.machine.digest: r for r in reports if r.machine is not None}
    machines = [r.machine for r in by_digest.values() if r.machine is not None]
    extra: dict[str, list[Problem]] = {}
    for a, b in overlapping_pairs(machines):
        extra.setdefault(a.digest, []).append(overlap_warning(a, b, by_digest[a.digest].path))
        extra.setdefault(b.digest, []).append(overlap_warning(b, a, by_digest[b.digest].path))
    return [replace(r, warnings=(*r.warnings, *extra.get(r.digest or "", []))) for r in reports]


def _validate(ctx: Context) -> int:
    """Validate every path; print human or JSON output; return the exit status."""
    args, out = ctx.args, ctx.out
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        raise UsageError("; ".join(f"no such file or folder: {path}" for path in missing))
    registry = load_registry(args.registry)
    reports = _with_overlaps([validate_path(path, registry) for path in args.paths])
    if ctx.json:
        json.dump([r.as_dict() for r in reports], out, indent=2, ensure_ascii=False)
        out.write("\n")
    else:
        for report in reports:
            _print_human(report, out)
    return 0 if all(r.valid for r in reports) else 1
