"""Signed-in reviewers: server-side sessions, each with its own CSRF token.

A session is a random id (the cookie's value, HttpOnly, SameSite=Strict) mapped to the
approver it signed in as, the digest of the token it signed in with (a session lives no
longer than its token: the console checks the token at every request, so revoking it,
or its expiry, signs the session out), a CSRF token every POST must carry, the
key-check challenge the page signs after importing a key, and an expiry. Sessions live
in this process's memory, bounded in number: restarting the console signs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

__all__ = ["Session", "Sessions"]


@dataclass(slots=True)
class Session:
    """One signed-in reviewer."""

    session_id: str
    approver: str
    token_digest: str
    csrf: str
    expires: float
    key_challenge: str = field(default_factory=lambda: secrets.token_hex(16))

    def csrf_ok(self, presented: str | None) -> bool:
        """Whether `presented` is this session's CSRF token (constant time)."""
        return presented is not None and hmac.compare_digest(presented, self.csrf)


class Sessions:
    """At most `limit` sessions, each valid for `ttl` seconds from sign-in."""

    def __init__(self, ttl: float, limit: int = 1000) -> None:
        self.ttl = ttl
        self.limit = limit
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, approver: str, token_digest: str) -> Session:
        """A new session for `approver`, signed in with the token whose SHA-256 is
        `token_digest`; the oldest is dropped when the table is full."""
        now = time.monotonic()
        session = Session(
            session_id=secrets.token_urlsafe(32),
            approver=approver,
            token_digest=token_digest,
            csrf=secrets.token_urlsafe(32),
            expires=now + self.ttl,
        )
        with self._lock:
            self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
            while len(self._sessions) >= self.limit:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id, or None."""
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires <= time.monotonic():
                del self._sessions[session_id]
                return None
        return session

    def close(self, session_id: str | None) -> None:
        """Sign out: forget the session."""
        if session_id:
            with self._lock:
                self._sessions.pop(session_id, None)
