"""The runtime's roles as child processes of a test: what to run and with what.

Both the fault tests (`tests/faults/processes.py`) and the lineage end-to-end test
(`tests/integration/lineage/children.py`) run `python -m consumer` (a controller) and
`python -m ops.cli run --role relay` (an outbox relay) as real processes, wait for them
with bounded polls and quote their logs when a wait fails; this module holds what they
share. How each keeps its child's stderr differs (a copier thread that also spots the
assignment, or the log file itself), so the process classes stay with their tests.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from schemas import (
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_CONFIG_FILE,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_PASSWORD_FILE,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SSL_CA_LOCATION,
)
from tests.support.db import with_user
from tests.support.keys import ensure_controller_key

__all__ = ["ROLE_COMMANDS", "log_tail", "poll_until", "role_argv", "role_env"]

ROLE_COMMANDS: Final[Mapping[str, tuple[str, ...]]] = {
    "controller": ("-m", "consumer"),
    "relay": ("-m", "ops.cli", "run", "--role", "relay"),
}


def role_argv(role: str) -> list[str]:
    """The command line of `role` ("controller" or "relay") under this interpreter."""
    return [sys.executable, *ROLE_COMMANDS[role]]


_KAFKA_SECURITY: Final = frozenset(
    {
        ENV_KAFKA_CONFIG_FILE,
        ENV_KAFKA_SECURITY_PROTOCOL,
        ENV_KAFKA_SASL_MECHANISM,
        ENV_KAFKA_SASL_USERNAME,
        ENV_KAFKA_SASL_PASSWORD,
        ENV_KAFKA_SASL_PASSWORD_FILE,
        ENV_KAFKA_SSL_CA_LOCATION,
    }
)


def role_env(env: Mapping[str, str], role: str | None = None) -> dict[str, str]:
    """A child's environment: ours (PATH, the venv) without our RECOVERY_* settings,
    which must not leak into a child, but with the Kafka client security settings (how
    to reach the session's broker: its admin, `tests.support.services`), plus `env` and
    unbuffered output, so its log is complete when the test reads it. For a `role`
    ("controller", "relay") the ledger URL connects as that role's login
    (`recovery_controller`, `recovery_relay`), as a deployment runs it; the test keeps
    the administrative URL for its own checks."""
    child = {**env}
    if role in ROLE_COMMANDS and ENV_DATABASE_URL in child:
        child[ENV_DATABASE_URL] = with_user(child[ENV_DATABASE_URL], f"recovery_{role}")
    # Any child may run a controller (`python -m consumer`, `recoveryctl run`, the demo):
    # each signs with the session's key unless the test names another.
    child.setdefault(ENV_CONTROLLER_SIGNING_KEY_FILE, str(ensure_controller_key()))
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("RECOVERY_") or k in _KAFKA_SECURITY
    }
    return {**base, **child, "PYTHONUNBUFFERED": "1"}


def log_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file, for failure messages."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def poll_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    every: float = 0.1,
    detail: Callable[[], str] | None = None,
    error: type[AssertionError] = AssertionError,
) -> None:
    """Poll `condition` until it holds; raise `error` naming `what` (and whatever
    `detail()` adds: progress so far, a log tail) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    extra = f"\n{detail()}" if detail is not None else ""
    raise error(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
