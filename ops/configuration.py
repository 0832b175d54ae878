"""Every setting of every role, in one list, and the reference page generated from it.

Each role declares its settings once, beside the role (`schemas.Settings` subclasses);
this module only lists them, in the order the reference page shows them, and renders
`docs/configuration.md` from their declarations (`recoveryctl config docs`). A unit test
fails when the committed page is not what the declarations render.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from pydantic import SecretStr

from consumer import ControllerSettings, ProcessSettings, RulesSettings, TelemetrySettings
from ops.settings import (
    ConsoleSettings,
    DatabasePasswordSettings,
    KafkaPasswordSettings,
    StackSettings,
)
from producers import RelaySettings, WorkerSettings
from schemas import (
    ConfigurationError,
    IdentitySettings,
    KafkaClientSettings,
    ServiceSettings,
    Settings,
    TopicNames,
)

__all__ = ["ROLES", "SETTINGS", "effective", "reference_page"]

# (settings class, the roles that read it), in reference order.
SETTINGS: Final[tuple[tuple[type[Settings], str], ...]] = (
    (ServiceSettings, "every role"),
    (KafkaClientSettings, "every Kafka client"),
    (TopicNames, "every role"),
    (IdentitySettings, "the client library, workers, approvers; `recoveryctl audit`"),
    (RulesSettings, "the controller; `recoveryctl` commands that read operations"),
    (ControllerSettings, "the controller (`recoveryctl run`, `python -m consumer`)"),
    (RelaySettings, "the outbox relay (`recoveryctl run`)"),
    (ProcessSettings, "`recoveryctl run`, `python -m consumer`"),
    (TelemetrySettings, "the controller and the relay"),
    (WorkerSettings, "capability workers (`producers.CapabilityWorker`)"),
    (ConsoleSettings, "`recoveryctl console`"),
    (StackSettings, "the local stack (`ops/dev up`, `recoveryctl stack`, the demo)"),
    (DatabasePasswordSettings, "`recoveryctl db roles`, the local stack"),
    (KafkaPasswordSettings, "the local stack's broker"),
)
ROLES: Final = {cls.__name__: cls for cls, _ in SETTINGS}

_HEADER = """\
# Configuration reference

Every setting of every role, with its environment variable, type, default and meaning.
This page is generated from the declarations in the code (`recoveryctl config docs >
docs/configuration.md`); a test fails when it is stale. Nothing else reads the
environment. Command-line flags, where a command has one, win over the variable; the
operator commands fall back to the running local stack for the database and the broker
(ARCHITECTURE.md, "One configuration").

An empty variable counts as unset. An invalid value stops the process that reads it
with a message naming the variable. `recoveryctl config show [--json]` prints what the
current environment resolves to, secrets masked.
"""


def reference_page() -> str:
    """docs/configuration.md as the declarations render it."""
    parts = [_HEADER]
    for cls, readers in SETTINGS:
        rows = list(cls.declarations())
        if not rows:
            continue
        doc = " ".join((cls.__doc__ or "").split())
        parts.append(f"## {cls.section or cls.__name__}\n\n{doc}\n\nRead by {readers}.\n")
        parts.append("| variable | type | default | meaning |\n|---|---|---|---|")
        for row in rows:
            names = " or ".join(f"`{v}`" for v in row.variables)
            parts.append(f"| {names} | {row.type} | {row.default} | {_cell(row.help)} |")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def effective(cls: type[Settings]) -> Iterator[tuple[str, str]]:
    """`(variable, value)` of each setting `cls` declares, as the environment resolves
    it now (secrets masked; an invalid value shows why)."""
    for name in cls.declared_fields():
        try:
            value = cls.value_of(name)
        except ConfigurationError as exc:
            yield cls.variable(name), f"INVALID: {exc}"
            continue
        shown = "***" if isinstance(value, SecretStr) else ("-" if value is None else str(value))
        yield cls.variable(name), shown
