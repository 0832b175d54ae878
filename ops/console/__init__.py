"""The reviewer console (`recoveryctl console`): escalation queue, timelines, review
packets, dead letters and audit status in the browser, with decisions signed there."""

from __future__ import annotations

from ops.console.app import COOKIE, ConsoleConfig, console_app
from ops.console.sessions import Session, Sessions
from ops.console.signing import (
    CHECK_DOMAIN,
    PendingDecision,
    SigningRefused,
    pending,
    submitted_decision,
)
from ops.console.tokens import TOKENS_FORMAT, IssuedToken, TokenError, TokenFile

__all__ = [
    "CHECK_DOMAIN",
    "COOKIE",
    "TOKENS_FORMAT",
    "ConsoleConfig",
    "IssuedToken",
    "PendingDecision",
    "Session",
    "Sessions",
    "SigningRefused",
    "TokenError",
    "TokenFile",
    "console_app",
    "pending",
    "submitted_decision",
]
