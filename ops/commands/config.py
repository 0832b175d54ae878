"""`recoveryctl config show|docs`: every setting of every role, from one set of declarations.

- `show [ROLE...]` prints, per settings class (all, or the ones named: `ControllerSettings`,
  `RelaySettings`, ...), each variable and the value the current environment resolves it
  to; secrets are masked, an invalid value says why. `--json` for machines.
- `docs` prints docs/configuration.md as the declarations render it (a test keeps the
  committed page equal to it).

Exit status: 0 shown (1 `show`: a value is invalid), 2 an unknown class name.
"""

from __future__ import annotations

import argparse

from ops.configuration import ROLES, SETTINGS, effective, reference_page
from ops.context import Context, register_command, table
from ops.errors import UsageError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `config` subcommand and its `show` and `docs` actions."""
    parser = subparsers.add_parser(
        "config",
        help="show the settings every role reads, or print their reference page",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="each variable and what it resolves to now")
    show.add_argument("roles", nargs="*", metavar="CLASS", help=", ".join(ROLES))
    show.add_argument("--json", action="store_true", help="print a JSON object")
    register_command(show, _show)
    docs = actions.add_parser("docs", help="print docs/configuration.md")
    register_command(docs, _docs)


def _show(ctx: Context) -> int:
    unknown = [name for name in ctx.args.roles if name not in ROLES]
    if unknown:
        raise UsageError(f"no settings class {', '.join(unknown)}; one of {', '.join(ROLES)}")
    chosen = [cls for cls, _ in SETTINGS if not ctx.args.roles or cls.__name__ in ctx.args.roles]
    found = {cls.__name__: dict(effective(cls)) for cls in chosen}
    invalid = any(v.startswith("INVALID:") for values in found.values() for v in values.values())
    if ctx.json:
        ctx.print_json(found)
    else:
        for cls in chosen:
            ctx.say(f"{cls.section} ({cls.__name__})")
            ctx.say(table(("variable", "value"), list(found[cls.__name__].items())))
            ctx.say("")
    return 1 if invalid else 0


def _docs(ctx: Context) -> int:
    ctx.out.write(reference_page())
    return 0
