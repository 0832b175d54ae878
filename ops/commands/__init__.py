"""The subcommands of `recoveryctl`, each a module with `register(subparsers)`.

A subcommand's handler takes the `ops.context.Context` of the invocation and returns the
exit code, or raises; `ops.cli.execute` maps what it raises (`ops.errors.exit_status`):
0 success, 1 the checked thing failed (invalid machine, broken chain), 2 usage or
configuration. Every command that prints for people also accepts `--json`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ops.commands import (
    acls,
    audit,
    config,
    console,
    db,
    demo,
    dlq,
    drill,
    incidents,
    kafka_tool,
    keys,
    lineage,
    machines,
    offsets,
    operations,
    outbox,
    policy,
    replay,
    review,
    roster,
    run,
    simulate,
    stack,
    test,
    topics,
    validate,
)

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

COMMANDS: list[Register] = [
    stack.register,
    test.register,
    simulate.register,
    validate.register,
    machines.register,
    topics.register,
    acls.register,
    run.register,
    db.register,
    audit.register,
    demo.register,
    lineage.register,
    outbox.register,
    operations.register,
    review.register,
    keys.register,
    roster.register,
    dlq.register,
    incidents.register,
    policy.register,
    replay.register,
    console.register,
    offsets.register,
    kafka_tool.register,
    drill.register,
    config.register,
]
