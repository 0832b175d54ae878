"""Output shared by the operator commands: aligned tables for people, JSON for machines,
and opening the ledger's read-only inspector."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, TextIO

from ledger import LedgerInspector, LedgerUnavailable
from ops.commands.db import resolved_url_or_report
from ops.errors import StackError
from ops.stack import read_state
from schemas import ENV_KAFKA_BOOTSTRAP, TopicNames

__all__ = ["open_inspector", "print_json", "resolve_bootstrap", "table", "topics_with"]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """`rows` under `headers`, each column as wide as its widest cell; `None` shows as
    `-`. A table without rows is the header line alone."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def print_json(payload: Any, out: TextIO) -> None:
    """`payload` as indented JSON with sorted keys (datetimes as ISO-8601 strings)."""
    print(json.dumps(payload, indent=2, sort_keys=True, default=_default), file=out)


def _default(value: Any) -> Any:
    iso = getattr(value, "isoformat", None)
    if iso is not None:
        return iso()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def open_inspector(command: str, flag: str | None, err: TextIO) -> LedgerInspector | None:
    """A one-connection `LedgerInspector` on the database `flag` (or the environment, or
    the local stack) names, or None after saying on `err` why there is none."""
    url = resolved_url_or_report(command, flag, err)
    if url is None:
        return None
    try:
        return LedgerInspector(url, max_size=1, retries=1)
    except LedgerUnavailable as exc:
        print(f"recoveryctl {command}: {exc}", file=err)
        return None


def resolve_bootstrap(flag: str | None, err: TextIO, command: str) -> str | None:
    """The Kafka bootstrap `flag` names, else RECOVERY_KAFKA_BOOTSTRAP, else the running
    local stack's; None after saying on `err` how to name one."""
    bootstrap = flag or os.environ.get(ENV_KAFKA_BOOTSTRAP) or None
    if bootstrap is None:
        try:
            state = read_state()
        except StackError:
            state = None
        bootstrap = state.kafka.bootstrap if state is not None else None
    if bootstrap is None:
        print(
            f"recoveryctl {command}: no broker: pass --bootstrap, set {ENV_KAFKA_BOOTSTRAP}, "
            "or run `recoveryctl stack up`",
            file=err,
        )
    return bootstrap


def topics_with(events: str | None) -> TopicNames:
    """The deployment's topic names (RECOVERY_TOPIC_*), with `events` if given."""
    topics = TopicNames.from_env()
    return topics if events is None else topics.model_copy(update={"events": events})
