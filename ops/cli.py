"""`recoveryctl`: the operator command line.

Each subcommand lives in `ops/commands/<name>.py` and exposes `register(subparsers)`;
they are listed in `ops.commands.COMMANDS` explicitly (no discovery by name pattern).
Every command receives one `ops.context.Context` and returns its exit status or raises;
`execute` is the one place a failure becomes a message and an exit status
(`ops.errors.exit_status`: 0 done, 1 failed, 2 usage or configuration).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from ops.commands import COMMANDS
from ops.context import Context
from ops.errors import exit_status


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="recoveryctl",
        description="Operate the agent recovery controller: machines, stack, ledger, audit.",
    )
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def execute(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the parsed command with its context; map what it raises to a message on
    `err` and an exit status. An exception no mapping knows is a bug and propagates."""
    context = Context(args, out or sys.stdout, err or sys.stderr)
    try:
        with context:
            code: int = args.handler(context)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        print(f"{context.command}: {exc}", file=context.err)
        return status
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    return execute(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
