"""What operator commands decide under: the controller's machines and policy.

`recoveryctl ops`, `review`, `approve`, `reject` and `policy` load the pinned machines
(lock file, trusted publishers, registry) and the policy exactly as the controller does
(`consumer.load_rules`), from the same settings: `--lock`, `--trust`, `--registry`,
`--policy`, else the controller's `RECOVERY_CONTROLLER_LOCK_PATH`,
`_TRUSTED_PUBLISHERS_PATH`, `_REGISTRY_PATH`, `_POLICY_PATH`, else its defaults. A review
packet computed under other rules than the controller's would show consequences the
controller would not produce, so the packet names the policy digest it was computed
under next to the operation's.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from consumer import ControllerError, ControllerSettings, SettingsError, load_rules
from machines import Machine, Rules

__all__ = ["LoadedRules", "add_rules_options", "load_rules_or_report", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass(frozen=True, slots=True)
class LoadedRules:
    """The pinned machines by `name@version` and the rules (policy, registry)."""

    machines: dict[str, Machine]
    rules: Rules

    def machine_for(self, name: str, version: str, digest: str) -> Machine | None:
        """The pinned machine `name@version`, if its digest is `digest`."""
        machine = self.machines.get(f"{name}@{version}")
        return machine if machine is not None and machine.digest == digest else None


def add_rules_options(parser: argparse.ArgumentParser) -> None:
    """Add `--lock`, `--trust`, `--registry` and `--policy` (see the module docstring)."""
    group = parser.add_argument_group("rules (default: the controller's settings)")
    group.add_argument("--lock", type=Path, metavar="FILE", help="machines lock file")
    group.add_argument("--trust", type=Path, metavar="FILE", help="trusted publishers file")
    group.add_argument("--registry", type=Path, metavar="FILE", help="guard/action registry")
    group.add_argument("--policy", type=Path, metavar="FILE", help="operator policy file")


def load_rules_or_report(command: str, args: argparse.Namespace, err: TextIO) -> LoadedRules | None:
    """The controller's machines and policy, or None after saying on `err` what failed."""
    overrides: dict[str, Any] = {"bootstrap": "unused", "database_url": "unused"}
    for option, setting in (
        ("lock", "lock_path"),
        ("trust", "trusted_publishers_path"),
        ("registry", "registry_path"),
        ("policy", "policy_path"),
    ):
        value = getattr(args, option, None)
        if value is not None:
            overrides[setting] = value
    try:
        machines, rules = load_rules(ControllerSettings.from_env(**overrides))
    except (ControllerError, SettingsError) as exc:
        print(f"recoveryctl {command}: {exc}", file=err)
        return None
    return LoadedRules(machines, rules)


def parse_duration(text: str) -> timedelta:
    """`90s`, `15m`, `2h` or `7d` as a timedelta; raises `argparse.ArgumentTypeError`."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"duration {text!r} is not a number with a unit s, m, h or d (e.g. 15m)"
        )
    amount, unit = int(match.group(1)), match.group(2)
    if amount <= 0:
        raise argparse.ArgumentTypeError(f"duration {text!r} must be positive")
    return timedelta(**{_UNITS[unit]: amount})
