"""The subcommands of `recoveryctl`, each a module with `register(subparsers)`.

A subcommand's handler takes the parsed namespace and returns the exit code:
0 success, 1 the checked thing failed (invalid machine, broken chain), 2 usage error.
Every command that prints for people also accepts `--json`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ops.bench import command as bench
from ops.commands import (
    acls,
    audit,
    console,
    db,
    demo,
    dlq,
    drill,
    keys,
    lineage,
    machines,
    offsets,
    operations,
    outbox,
    policy,
    replay,
    review,
    run,
    simulate,
    stack,
    test,
    topics,
    validate,
)

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

COMMANDS: list[Register] = []
# Each issue's work appends its subcommand module's `register` here, e.g.:
#   from ops.commands import stack
#   COMMANDS.append(stack.register)
COMMANDS.append(stack.register)
COMMANDS.extend([test.register, simulate.register])
COMMANDS.extend([validate.register, machines.register])
COMMANDS.extend([topics.register, acls.register])
COMMANDS.append(run.register)
COMMANDS.extend([db.register, audit.register])
COMMANDS.append(demo.register)
COMMANDS.append(bench.register)
COMMANDS.append(lineage.register)
COMMANDS.append(outbox.register)
COMMANDS.extend([operations.register, review.register, keys.register])
COMMANDS.extend([dlq.register, policy.register, replay.register])
COMMANDS.append(console.register)
COMMANDS.append(offsets.register)
COMMANDS.append(drill.register)
