"""`recoveryctl policy show|validate|digest [FILE]`: the operator policy the controller runs.

FILE defaults to the controller's RECOVERY_CONTROLLER_POLICY_PATH, else the built-in
default policy (`id: default`).

- `show` prints the policy as the controller reads it (every default filled in), with
  its digest and the approver roster;
- `validate` loads it and checks it against the registry (`--registry`) as the
  controller does at start-up; exit 1 names each problem;
- `digest` prints only the digest (what checkpoints and resumption bind, and what each
  operation row records as `policy_digest`).

Exit status: 0 valid, 1 invalid, 2 unreadable file or registry.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from machines import (
    Policy,
    PolicyError,
    check_policy_against_registry,
    load_policy,
    load_registry,
)
from ops.context import Context, register_command, table
from ops.errors import CheckFailed, UsageError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `policy` subcommand and its `show`, `validate` and `digest` actions."""
    parser = subparsers.add_parser(
        "policy",
        help="show, validate and digest the operator policy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="policy_action", metavar="ACTION", required=True)
    for name, text in (
        ("show", "print the policy with defaults filled in, and its digest"),
        ("validate", "check the policy as the controller does at start-up"),
        ("digest", "print the policy digest"),
    ):
        child = actions.add_parser(name, help=text)
        child.add_argument("file", type=Path, nargs="?", metavar="FILE")
        child.add_argument("--registry", type=Path, default=None, metavar="FILE")
        child.add_argument("--json", action="store_true", help="print JSON")
        register_command(child, _policy)


def _load(ctx: Context) -> tuple[Policy, str]:
    """The policy FILE (else the controller's) names and where it came from; raises
    `CheckFailed` when it is invalid, `UsageError` when it cannot be read."""
    source = ctx.args.file or ctx.rules_settings.policy_path
    where = str(source) if source is not None else "<built-in default>"
    try:
        policy = load_policy(source) if source is not None else Policy(id="default")
    except OSError as exc:
        raise UsageError(f"cannot read {where}: {exc}") from exc
    except PolicyError as exc:
        raise CheckFailed(f"INVALID {exc}") from exc
    try:
        registry = load_registry(ctx.rules_settings.registry_path)
    except OSError as exc:
        raise UsageError(f"cannot load the registry: {exc}") from exc
    try:
        check_policy_against_registry(policy, registry)
    except PolicyError as exc:
        raise CheckFailed(f"INVALID {exc}") from exc
    return policy, where


def _policy(ctx: Context) -> int:
    """Load the policy and act; see the module docstring for exit codes."""
    policy, where = _load(ctx)
    action = ctx.args.policy_action
    if action == "digest":
        if ctx.json:
            ctx.print_json({"source": where, "id": policy.id, "digest": policy.digest})
        else:
            ctx.say(policy.digest)
    elif action == "validate":
        if ctx.json:
            ctx.print_json({"source": where, "valid": True, "digest": policy.digest})
        else:
            ctx.say(f"{where}: valid policy {policy.id} {policy.digest}")
    elif ctx.json:
        ctx.print_json(
            {"source": where, "digest": policy.digest, "policy": policy.model_dump(mode="json")}
        )
    else:
        ctx.say(_render(policy, where))
    return 0


def _render(policy: Policy, where: str) -> str:
    data = policy.model_dump(mode="json")
    roster = data.pop("approvers")
    lines = [f"policy {policy.id} from {where}", f"digest {policy.digest}", ""]
    lines.append(table(("setting", "value"), [(k, _value(v)) for k, v in sorted(data.items())]))
    lines += ["", "approvers"]
    lines.append(
        table(
            ("id", "roles", "public key"),
            [(a["id"], ", ".join(a["roles"]) or "-", a["public_key"]) for a in roster],
        )
    )
    return "\n".join(lines)


def _value(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in sorted(value.items())) or "-"
    return str(value)
