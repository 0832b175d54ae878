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
import os
import sys
from pathlib import Path
from typing import TextIO

from machines import (
    DEFAULT_REGISTRY,
    MachineError,
    Policy,
    PolicyError,
    check_policy_against_registry,
    load_policy,
    load_registry,
)
from ops.commands.output import print_json, table

__all__ = ["register", "run_policy"]

POLICY_SETTING = "RECOVERY_CONTROLLER_POLICY_PATH"


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
        child.set_defaults(handler=run_policy, policy_action=name)


def _source(args: argparse.Namespace) -> Path | None:
    if args.file is not None:
        return Path(args.file)
    configured = os.environ.get(POLICY_SETTING)
    return Path(configured) if configured else None


def run_policy(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Load the policy and act; see the module docstring for exit codes."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    source = _source(args)
    where = str(source) if source is not None else "<built-in default>"
    try:
        policy = load_policy(source) if source is not None else Policy(id="default")
    except OSError as exc:
        print(f"recoveryctl policy {args.policy_action}: cannot read {where}: {exc}", file=err)
        return 2
    except PolicyError as exc:
        print(f"recoveryctl policy {args.policy_action}: INVALID {exc}", file=err)
        return 1
    registry_path = args.registry or os.environ.get("RECOVERY_CONTROLLER_REGISTRY_PATH")
    try:
        registry = load_registry(registry_path or DEFAULT_REGISTRY)
    except (MachineError, OSError) as exc:
        print(f"recoveryctl policy {args.policy_action}: cannot load the registry: {exc}", file=err)
        return 2
    try:
        check_policy_against_registry(policy, registry)
    except PolicyError as exc:
        print(f"recoveryctl policy {args.policy_action}: INVALID {exc}", file=err)
        return 1
    action = args.policy_action
    if action == "digest":
        if args.json:
            print_json({"source": where, "id": policy.id, "digest": policy.digest}, out)
        else:
            print(policy.digest, file=out)
    elif action == "validate":
        if args.json:
            print_json({"source": where, "valid": True, "digest": policy.digest}, out)
        else:
            print(f"{where}: valid policy {policy.id} {policy.digest}", file=out)
    elif args.json:
        print_json(
            {"source": where, "digest": policy.digest, "policy": policy.model_dump(mode="json")},
            out,
        )
    else:
        print(_render(policy, where), file=out)
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
