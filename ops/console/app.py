"""The reviewer console: a Starlette application with server-rendered pages.

Pages (each needs a signed-in reviewer; everything is read through one read-only
`ledger.LedgerInspector`, connected as `recovery_reader`):

- `/` the escalation queue (operations whose state waits for a human) and the most
  recently changed operations, with a search box: `/search?q=...` lists the operations
  whose agent, task, initiating principal, correlation id, declared idempotency key or
  operation id is that value (`LedgerInspector.search`);
- `/operations/{id}` one operation's timeline (`ops.usecases.timeline`, as `recoveryctl
  ops show` shows it);
- `/operations/{id}/review` the review packet (SPEC §9) with both consequences, its
  digest, and for each decision the state accepts the exact payload to sign; above it,
  the packet's guidance in plain sentences (`ops.guidance`, as `recoveryctl review`);
- `/dead-letters` and `/audit` (every operation's audit chain, verified now);
- `/key` imports the reviewer's Ed25519 private key into the browser (WebCrypto,
  non-extractable, kept in IndexedDB) and checks it against the roster.

`POST /operations/{id}/decision` takes the payload the page signed, the signature and
the packet digest shown; it assembles the packet again and refuses when the digest
moved, checks the signature and binding exactly as the controller will
(`machines.check_decision`), and publishes the signed decision through the client
library: the same use cases (`ops.usecases`) as `recoveryctl approve` and `reject`.
The server never sees a private key. Every POST carries the session's CSRF token (form
field or `X-CSRF-Token`) and, when the browser sends one, an Origin equal to the
console's own.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ledger import LedgerError, LedgerInspector, UnknownOperation
from machines import HumanDecision, Verdict, ed25519_verify, public_key_bytes
from ops.audit_topic import verify_authors
from ops.console.sessions import Session, Sessions
from ops.console.signing import (
    CHECK_DOMAIN,
    SigningRefused,
    pending,
    submitted_decision,
)
from ops.console.tokens import TokenError, TokenFile
from ops.context import LoadedRules
from ops.errors import OpsError
from ops.guidance import guidance_heading, guidance_sentences
from ops.usecases import (
    VERDICT_EVENTS,
    DecisionRefused,
    await_decision,
    review,
    submit_decision,
    timeline,
    waiting_for_human,
)
from producers import DeliveryFailed, EventPublisher, ProducersError, RecoveryClient
from schemas import KafkaSecurity, TopicNames, WireError

__all__ = ["ConsoleConfig", "console_app"]

COOKIE = "recovery_console"
_HERE = Path(__file__).resolve().parent
_MAX_BODY = 16 * 1024
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """What the console serves from: the controller's rules, the read-only database,
    the broker and topics decisions go to, and the tokens file."""

    rules: LoadedRules
    database_url: str
    bootstrap: str
    topics: TopicNames
    tokens: TokenFile
    security: KafkaSecurity | None = None
    decision_ttl: timedelta = timedelta(minutes=15)
    session_ttl: timedelta = timedelta(hours=8)
    decision_wait: float = 10.0


class _Console:
    """The application's state and handlers (one per `console_app`)."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.sessions = Sessions(config.session_ttl.total_seconds())
        self.inspector: LedgerInspector | None = None
        self.publisher: EventPublisher | None = None
        self.producer = ""
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates = Jinja2Templates(env=env)

    # -- lifecycle -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self.inspector = await run_in_threadpool(
            LedgerInspector, self.config.database_url, max_size=2, retries=1
        )
        # The console forwards decisions signed in the browser under its own producer
        # identity (RECOVERY_PRODUCER_ID / RECOVERY_PRODUCER_KEY_FILE, a roster producer
        # with the `approver` role); it never holds a reviewer's private key.
        self.publisher = EventPublisher(
            self.config.bootstrap, topics=self.config.topics, security=self.config.security
        )
        self.producer = next(iter(self.publisher.signers))
        try:
            yield
        finally:
            await run_in_threadpool(self.publisher.close)
            await run_in_threadpool(self.inspector.close)

    def _ledger(self) -> LedgerInspector:
        if self.inspector is None:
            raise RuntimeError("the console's ledger is not open (lifespan not started)")
        return self.inspector

    # -- helpers ---------------------------------------------------------------------

    def page(
        self,
        request: Request,
        name: str,
        session: Session | None,
        status: int = 200,
        **context: Any,
    ) -> Response:
        response = self.templates.TemplateResponse(
            request,
            name,
            {"session": session, "now": datetime.now(UTC), **context},
            status_code=status,
        )
        response.headers.update(_SECURITY_HEADERS)
        return response

    def session(self, request: Request) -> Session | None:
        """The signed-in session of `request`, while its token is still valid (not
        revoked, not expired) and its approver still in the policy's roster."""
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            return None
        try:
            active = self.config.tokens.active(session.token_digest, datetime.now(UTC))
        except TokenError:
            active = False  # an unreadable tokens file admits nobody
        if not active or self.config.rules.rules.policy.approver(session.approver) is None:
            self.sessions.close(session.session_id)
            return None
        return session

    def error(self, request: Request, session: Session | None, status: int, text: str) -> Response:
        return self.page(request, "error.html", session, status=status, message=text)

    # -- sign in and out -------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self._login_page(request, None, 200)

    def _login_page(self, request: Request, message: str | None, status: int) -> Response:
        csrf = secrets.token_urlsafe(24)
        response = self.page(request, "login.html", None, status, csrf=csrf, message=message)
        # Sign-in CSRF: the form's token must match this cookie (double submit).
        response.set_cookie(
            f"{COOKIE}_login", csrf, httponly=True, samesite="strict", path="/login",
            secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        expected = request.cookies.get(f"{COOKIE}_login")
        if not _same_origin(request) or not expected or form.get("csrf") != expected:
            return self._login_page(request, "the sign-in form expired; sign in again", 403)
        now = datetime.now(UTC)
        try:
            approver = self.config.tokens.approver_for(form.get("token", ""), now)
        except TokenError as exc:
            return self._login_page(request, str(exc), 500)
        if approver is None or self.config.rules.rules.policy.approver(approver) is None:
            return self._login_page(
                request,
                "unknown or expired token; ask an operator for one "
                "(`recoveryctl console token --approver ID`)",
                401,
            )
        session = self.sessions.open(approver, TokenFile.digest_of(form.get("token", "")))
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            session.session_id,
            max_age=int(self.config.session_ttl.total_seconds()),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        response.delete_cookie(f"{COOKIE}_login", path="/login")
        return response

    async def logout(self, request: Request) -> Response:
        session = self.session(request)
        form = await _form(request)
        if session is not None and _same_origin(request) and session.csrf_ok(form.get("csrf")):
            self.sessions.close(session.session_id)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pages -----------------------------------------------------------------------

    async def queue(self, request: Request, session: Session) -> Response:
        rules = self.config.rules
        ops = await run_in_threadpool(self._ledger().operations, limit=200)
        waiting = [
            op
            for op in ops
            if waiting_for_human(
                rules, op.machine_name, op.machine_version, op.machine_digest, op.state
            )
        ]
        recent = sorted(ops, key=lambda o: o.updated_at, reverse=True)[:50]
        return self.page(request, "queue.html", session, waiting=waiting, recent=recent)

    async def search(self, request: Request, session: Session) -> Response:
        term = request.query_params.get("q", "").strip()[:200]
        found = await run_in_threadpool(self._ledger().search, term=term) if term else ()
        return self.page(request, "search.html", session, term=term, found=found)

    async def operation(self, request: Request, session: Session) -> Response:
        op = request.path_params["operation_id"]
        inspector = self._ledger()

        def read() -> dict[str, Any]:
            return timeline(inspector, inspector.operation_record(op), self.config.rules)

        try:
            report = await run_in_threadpool(read)
        except UnknownOperation:
            return self.error(request, session, 404, f"no operation {op} in the ledger")
        return self.page(request, "operation.html", session, report=report)

    async def review(self, request: Request, session: Session) -> Response:
        op = request.path_params["operation_id"]
        try:
            found = await run_in_threadpool(
                review, self._ledger(), self.config.rules, op, datetime.now(UTC)
            )
        except UnknownOperation:
            return self.error(request, session, 404, f"no operation {op} in the ledger")
        except OpsError as exc:
            return self.error(request, session, 409, str(exc))
        packet = found.packet
        decisions = pending(
            packet,
            view=found.record.view,
            approver=session.approver,
            now=datetime.now(UTC),
            ttl=self.config.decision_ttl,
            nonce=secrets.token_hex(16),
        )
        return self.page(
            request,
            "review.html",
            session,
            packet=packet,
            c=packet.content,
            decisions=decisions,
            heading=guidance_heading(packet.content),
            guidance=guidance_sentences(packet.content),
        )

    async def dead_letters(self, request: Request, session: Session) -> Response:
        letters = await run_in_threadpool(self._ledger().dead_letters, self.config.topics.dlq)
        return self.page(request, "dead_letters.html", session, letters=letters)

    async def audit(self, request: Request, session: Session) -> Response:
        inspector = self._ledger()

        # The roster's controllers are the keys every audit row must be signed with.
        roster = self.config.rules.rules.policy.roster

        def read() -> tuple[int, list[str], list[str]]:
            checked = inspector.audit_operation_ids()
            breaks = [b.describe() for b in inspector.verify_audit(None)]
            authors = verify_authors(inspector, roster, self.config.topics)
            return len(checked), breaks, [f.describe() for f in authors]

        checked, breaks, unproven = await run_in_threadpool(read)
        return self.page(
            request, "audit.html", session, checked=checked, breaks=breaks, unproven=unproven
        )

    async def key(self, request: Request, session: Session) -> Response:
        challenge = f"{CHECK_DOMAIN} {session.approver} {session.key_challenge}"
        return self.page(request, "key.html", session, challenge=challenge)

    # -- signed posts ----------------------------------------------------------------

    async def key_check(self, request: Request, session: Session) -> Response:
        body = await _json(request)
        approver = self.config.rules.rules.policy.approver(session.approver)
        challenge = f"{CHECK_DOMAIN} {session.approver} {session.key_challenge}"
        if approver is None:
            return _refusal(403, f"{session.approver} is no longer in the approver roster")
        try:
            public = public_key_bytes(approver.public_key)
            valid = ed25519_verify(public, _b64(body.get("signature")), challenge.encode("utf-8"))
        except ValueError:
            valid = False
        if not valid:
            return _refusal(
                400,
                f"the imported key is not {session.approver}'s: its signature does not "
                "verify against the roster's public key; import the right key file",
            )
        return JSONResponse({"ok": True, "approver": session.approver})

    async def decide(self, request: Request, session: Session) -> Response:
        op = request.path_params["operation_id"]
        body = await _json(request)
        verdict = str(body.get("verdict", ""))
        if verdict not in VERDICT_EVENTS:
            return _refusal(400, f"verdict {verdict!r} is neither approved nor rejected")
        try:
            decision = submitted_decision(
                str(body.get("payload", "")),
                base64.b64encode(_b64(body.get("signature"))).decode("ascii"),
                approver=session.approver,
                verdict=verdict,
            )
        except (SigningRefused, ValueError) as exc:
            return _refusal(400, f"operation {op}: {exc}; nothing was published")
        if decision.operation_id != op:
            return _refusal(400, f"the payload is for operation {decision.operation_id}, not {op}")
        try:
            return await run_in_threadpool(
                self._publish, op, decision, str(body.get("packet_digest", ""))
            )
        except UnknownOperation:
            return _refusal(404, f"no operation {op} in the ledger")
        except (OpsError, LedgerError) as exc:
            return _refusal(409, f"operation {op}: {exc}" if op not in str(exc) else str(exc))

    def _publish(self, op: str, decision: HumanDecision, shown: str) -> Response:
        now = datetime.now(UTC)
        found = review(self._ledger(), self.config.rules, op, now)
        verdict: Verdict = decision.decision
        proposal = found.proposal(verdict, shown)
        if (proposal["state"], proposal["transition"]) != (decision.state, decision.transition):
            return _refusal(
                409,
                f"operation {op} in state {found.record.view.state} does not accept this "
                f"{VERDICT_EVENTS[verdict]}; nothing was published",
            )
        if decision.expires_at > now + self.config.decision_ttl + timedelta(minutes=1):
            return _refusal(400, "the decision's expiry is later than the console allows")
        if self.publisher is None:
            raise RuntimeError("the console's publisher is not open (lifespan not started)")
        client = RecoveryClient(self.publisher, self.producer)
        try:
            event = submit_decision(
                found, decision, client=client, rules=self.config.rules, now=now
            )
        except DecisionRefused as exc:
            return _refusal(400, f"{exc} (reload the packet; check the imported key)")
        except (DeliveryFailed, ProducersError, WireError) as exc:
            return _refusal(409, f"operation {op}: could not publish the decision: {exc}")
        outcome = await_decision(self._ledger(), op, event.event_id, self.config.decision_wait)
        return JSONResponse(
            {
                "published": event.event_id,
                "event_type": VERDICT_EVENTS[verdict],
                "operation_id": op,
                "approver": decision.approver,
                "state": decision.state,
                "transition": decision.transition,
                "decision": outcome,
            }
        )


Handler = Callable[[Request, Session], Awaitable[Response]]


def _same_origin(request: Request) -> bool:
    """Whether a POST comes from the console's own pages: the browser's Fetch Metadata
    says same-origin, else its Origin is ours; a client sending neither (not a browser)
    is left to the CSRF token and SameSite=Strict cookie."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site == "same-origin"
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


def _refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error": message}, status_code=status)


def _b64(value: Any) -> bytes:
    try:
        return base64.b64decode(str(value or ""), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the signature is not base64") from exc


async def _body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_BODY:
            return b""
    return body


async def _form(request: Request) -> dict[str, str]:
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    parsed = parse_qs((await _body(request)).decode("utf-8", "replace"), max_num_fields=20)
    return {k: v[0] for k, v in parsed.items()}


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await _body(request))
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _page(console: _Console, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A GET endpoint for signed-in reviewers; others are sent to sign in."""

    async def endpoint(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return RedirectResponse("/login", status_code=303)
        try:
            return await handler(request, session)
        except LedgerError as exc:
            return console.error(request, session, 503, f"the ledger cannot be read: {exc}")

    return endpoint


def _post(console: _Console, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A JSON POST endpoint: signed in, same origin, and the session's CSRF token."""

    async def endpoint(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return _refusal(401, "not signed in (or the session expired); sign in again")
        if not _same_origin(request):
            return _refusal(403, "cross-origin request refused")
        if not session.csrf_ok(request.headers.get("x-csrf-token")):
            return _refusal(403, "missing or wrong CSRF token; reload the page")
        return await handler(request, session)

    return endpoint


async def _healthz(_request: Request) -> Response:
    return PlainTextResponse("ok\n")


def console_app(config: ConsoleConfig) -> Starlette:
    """The console as an ASGI application (serve it with uvicorn)."""
    console = _Console(config)
    routes = [
        Route("/login", console.login_form, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", console.logout, methods=["POST"]),
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/", _page(console, console.queue), methods=["GET"]),
        Route("/search", _page(console, console.search), methods=["GET"]),
        Route("/operations/{operation_id}", _page(console, console.operation), methods=["GET"]),
        Route("/operations/{operation_id}/review", _page(console, console.review), methods=["GET"]),
        Route(
            "/operations/{operation_id}/decision",
            _post(console, console.decide),
            methods=["POST"],
        ),
        Route("/dead-letters", _page(console, console.dead_letters), methods=["GET"]),
        Route("/audit", _page(console, console.audit), methods=["GET"]),
        Route("/key", _page(console, console.key), methods=["GET"]),
        Route("/key/check", _post(console, console.key_check), methods=["POST"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, lifespan=console.lifespan)
