"""The scope a test's tool puts on its events: one the catalogue machine's `applies_to`
admits (SPEC §8 step 2: an operation opens only with a scope its machine matches)."""

from __future__ import annotations

from functools import cache

from consumer import ControllerSettings, load_rules
from machines import Scope, matching_scope


@cache
def _catalogue() -> dict[str, Scope]:
    machines, _ = load_rules(
        ControllerSettings(bootstrap="unused", database_url="unused", demo_mode=True)
    )
    return {m.name: matching_scope(m.applies_to) for m in machines.values()}


def catalogue_scope(machine: str) -> Scope | None:
    """A scope the catalogue machine `machine` applies to, or None for a name it lacks."""
    return _catalogue().get(machine)
