"""`recoveryctl`: the operator command line.

Each subcommand lives in `ops/commands/<name>.py` and exposes `register(subparsers)`;
they are listed here explicitly (no discovery by name pattern).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ops.commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="recoveryctl",
        description="Operate the agent recovery controller: machines, stack, ledger, audit.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
