"""Reviewers' login tokens for the console: issued per approver, stored as hashes.

`recoveryctl console token --approver ID` makes a random token (256 bits, printed once)
for an approver of the policy roster and appends its SHA-256 to the tokens file (JSON,
mode 0600, written atomically); the console accepts a token whose hash is in the file,
not expired, for an approver still in the roster. The file never holds a usable token,
so reading it does not let anyone sign in. `--revoke` removes an approver's tokens; the
console reads the file at every login, so issuing and revoking need no restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ops.errors import UsageError

__all__ = ["TOKENS_FORMAT", "IssuedToken", "TokenError", "TokenFile"]

TOKENS_FORMAT = "recovery-console-tokens/1"
_PREFIX = "rct_"


class TokenError(UsageError):
    """The console's tokens file cannot be read or written (named in the message)."""


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A token just issued: `token` is shown once and stored only as its hash."""

    approver: str
    token: str
    token_id: str
    expires_at: datetime


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenFile:
    """The tokens file at `path`: entries of approver, token id, hash and expiry."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _entries(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise TokenError(f"cannot read console tokens file {self.path}: {exc}") from exc
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise TokenError(
                f"console tokens file {self.path} is not JSON ({exc}); remove it and issue "
                "tokens again with `recoveryctl console token --approver ID`"
            ) from exc
        if not isinstance(body, dict) or body.get("format") != TOKENS_FORMAT:
            raise TokenError(f"{self.path} is not a console tokens file ({TOKENS_FORMAT})")
        entries = body.get("tokens", [])
        if not isinstance(entries, list):
            raise TokenError(f"console tokens file {self.path}: `tokens` is not a list")
        return [e for e in entries if isinstance(e, dict)]

    def _write(self, entries: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        body = json.dumps({"format": TOKENS_FORMAT, "tokens": entries}, indent=2) + "\n"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(body)
            os.replace(temporary, self.path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise TokenError(f"cannot write console tokens file {self.path}: {exc}") from exc

    def issue(self, approver: str, now: datetime, valid_for: timedelta) -> IssuedToken:
        """A new token for `approver`, valid until `now + valid_for`; its hash is added
        to the file (expired entries are dropped on the way)."""
        secret = secrets.token_urlsafe(32)
        token = f"{_PREFIX}{secret}"
        digest = _hash(token)
        expires_at = now + valid_for
        entries = [e for e in self._entries() if not _expired(e, now)]
        entries.append(
            {
                "approver": approver,
                "token_id": digest[:12],
                "sha256": digest,
                "issued_at": now.isoformat(),
                "expires_at": expires_at.isoformat(),
            }
        )
        self._write(entries)
        return IssuedToken(approver, token, digest[:12], expires_at)

    def revoke(self, approver: str) -> int:
        """Remove every token of `approver`; returns how many were removed."""
        entries = self._entries()
        kept = [e for e in entries if e.get("approver") != approver]
        if len(kept) != len(entries):
            self._write(kept)
        return len(entries) - len(kept)

    def active(self, digest: str, now: datetime) -> bool:
        """Whether the token whose SHA-256 is `digest` is still in the file and not
        expired: a revoked token ends the sessions it opened at their next request."""
        return any(
            hmac.compare_digest(str(entry.get("sha256", "")), digest) and not _expired(entry, now)
            for entry in self._entries()
        )

    @staticmethod
    def digest_of(token: str) -> str:
        """The SHA-256 a token is kept as."""
        return _hash(token.strip())

    def approver_for(self, token: str, now: datetime) -> str | None:
        """The approver whose unexpired token this is, or None."""
        digest = _hash(token.strip())
        found = None
        for entry in self._entries():
            # Compare every entry in constant time; no early exit on a match.
            if hmac.compare_digest(str(entry.get("sha256", "")), digest) and not _expired(
                entry, now
            ):
                found = str(entry.get("approver"))
        return found


def _expired(entry: dict[str, Any], now: datetime) -> bool:
    try:
        return datetime.fromisoformat(str(entry["expires_at"])) <= now
    except (KeyError, ValueError):
        return True
