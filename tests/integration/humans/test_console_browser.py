"""The reviewer console end to end in Debian's Chromium (headless, driven by Playwright)
against the real broker, database and a running controller: an escalated operation is
in the queue, the reviewer signs in with a console token, imports the Ed25519 key into
WebCrypto (non-extractable), signs the approval in the page, and the operation moves
on; a packet that changed after display is refused with nothing published; sign-in with
a wrong token, a key outside the roster and posts without the session's CSRF token are
refused; a dead letter is listed with its coded reason.

One browser per module. A missing /usr/bin/chromium fails the run, naming the package
to install, as a missing Kafka or PostgreSQL would. Screenshots go to
RECOVERY_CONSOLE_SCREENSHOTS when set (`docs/img` regenerates the documentation's),
else to the test's tmp folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger, with_user
from machines import write_private_key
from ops.ports import free_ports
from schemas import ENV_PRODUCER_ID, ENV_PRODUCER_KEY_FILE
from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory
from tests.support.producers import key_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = (
            f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y "
            "--no-install-recommends chromium` (.ci/run does)"
        )
        pytest.fail(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield launched
        launched.close()


@pytest.fixture
def approver_key() -> Ed25519PrivateKey:
    # The test roster's key of approver-1: it signs the decision and, as the roster
    # producer approver-1, the record that carries it.
    return key_of("approver-1")


@pytest.fixture
def policy(tmp_path: Path, approver_key: Ed25519PrivateKey) -> Path:
    return write_policy(tmp_path, approver_key)


@pytest.fixture
def key_file(tmp_path: Path, approver_key: Ed25519PrivateKey) -> Path:
    path = tmp_path / "approver-1.pem"
    path.write_bytes(
        approver_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = os.environ.get("RECOVERY_CONSOLE_SCREENSHOTS")
    path = (ROOT / folder) if folder else tmp_path / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def recoveryctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERY_CONTROLLER_")}
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


class Console:
    """`recoveryctl console` in a subprocess on a free loopback port."""

    def __init__(self, tmp_path: Path, policy: Path, database_url: str, bootstrap: str,
                 topic: str) -> None:  # fmt: skip
        self.tokens = tmp_path / "console-tokens.json"
        self.rules = ("--policy", str(policy), "--tokens-file", str(self.tokens))
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERY_CONTROLLER_")}
        # The console forwards decisions as its own roster producer (role approver).
        forwarder = tmp_path / "approval-console.pem"
        write_private_key(forwarder, key_of("approval-console"))
        env[ENV_PRODUCER_ID] = "approval-console"
        env[ENV_PRODUCER_KEY_FILE] = str(forwarder)
        self.log = (tmp_path / "console.log").open("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "console", "--listen", f"127.0.0.1:{port}",
             "--database-url", database_url, "--bootstrap", bootstrap, "--events-topic", topic,
             *self.rules],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                self.log.seek(0)
                output = self.log.read()
                self.close()
                raise AssertionError(f"the console did not start:\n{output}")
            time.sleep(0.1)

    def token(self) -> str:
        issued = recoveryctl("console", "token", "--approver", "approver-1", "--json",
                             *self.rules)  # fmt: skip
        assert issued.returncode == 0, issued.stderr
        token: str = json.loads(issued.stdout)["token"]
        return token

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.log.close()


@pytest.fixture
def topic(topic_factory: TopicFactory) -> str:
    return topic_factory(partitions=1)


@pytest.fixture
def console(
    tmp_path: Path, policy: Path, database_url: str, kafka_bootstrap: str, topic: str
) -> Iterator[Console]:
    served = Console(
        tmp_path, policy, with_user(database_url, "recovery_reader"), kafka_bootstrap, topic
    )
    yield served
    served.close()


def _escalate(tool: Tool, ledger: Ledger, operation: str) -> None:
    tool.event("email-send", operation, "TOOL_TIMEOUT")
    tool.flush()
    wait_for(lambda: len(ledger.decisions(operation)) == 1, 60, f"{operation} escalated")
    assert ledger.operation(operation).state == "unresolved"


def _sign_in(page: Any, console: Console) -> None:
    page.goto(f"{console.url}/")
    assert page.url == f"{console.url}/login"
    page.fill("#token", console.token())
    page.click("#sign-in")
    page.wait_for_url(f"{console.url}/")


def _import_key(page: Any, console: Console, key_file: Path) -> None:
    page.goto(f"{console.url}/key")
    page.set_input_files("#key-file", str(key_file))
    page.click("#import-key")
    page.wait_for_selector("#key-state.ok")
    assert "matches the roster" in page.inner_text("#key-state")


def test_reviewer_signs_an_escalated_operation_in_chromium_and_it_moves_on(
    browser: Any, console: Console, kafka_bootstrap: str, database_url: str, topic: str,
    ledger: Ledger, policy: Path, key_file: Path, shots: Path,
) -> None:  # fmt: skip
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        tool = Tool(kafka_bootstrap, topic)
        _escalate(tool, ledger, "op-c1")
        tool.close()
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        _sign_in(page, console)
        cookie = next(c for c in context.cookies() if c["name"] == "recovery_console")
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
        row = page.locator('#queue tr[data-operation="op-c1"]')
        assert row.locator(".state").inner_text() == "unresolved"
        page.screenshot(path=str(shots / "console-queue.png"), full_page=True)

        _import_key(page, console, key_file)
        page.screenshot(path=str(shots / "console-key.png"))
        # The key is a non-extractable CryptoKey: the page can sign, never read it.
        extractable = page.evaluate(
            """async (approver) => {
                const db = await new Promise((ok, no) => {
                    const r = indexedDB.open("recovery-console", 1);
                    r.onsuccess = () => ok(r.result); r.onerror = () => no(r.error);
                });
                const key = await new Promise((ok) => {
                    const r = db.transaction("keys").objectStore("keys").get(approver);
                    r.onsuccess = () => ok(r.result);
                });
                let exported = true;
                try { await crypto.subtle.exportKey("pkcs8", key); }
                catch (e) { exported = false; }
                return [key.extractable, key.algorithm.name, key.usages, exported];
            }""",
            "approver-1",
        )
        assert extractable == [False, "Ed25519", ["sign"], False]

        page.goto(f"{console.url}/")
        row.get_by_role("link", name="Review").click()
        page.wait_for_url(f"{console.url}/operations/op-c1/review")
        digest = page.inner_text("#packet-digest")
        shown = json.loads(
            recoveryctl("review", "op-c1", "--json", "--database-url", database_url,
                        "--policy", str(policy)).stdout
        )  # fmt: skip
        assert digest == shown["digest"]
        assert page.inner_text("#consequence-approve .target") == "resume-pending"
        # What it waits for: the stall bound of `unresolved`, and the deadline.
        assert "escalates once as stalled in unresolved" in page.inner_text("#timers")
        assert page.locator("#consequence-reject .command").all_inner_texts() == [
            "agent.stop-task (stop, scope=task)",
            "credentials.revoke-delegation (revoke, scope=task)",
        ]
        page.screenshot(path=str(shots / "console-review.png"), full_page=True)

        page.click("#sign-approved")
        page.wait_for_selector("#sign-status.ok", timeout=30_000)
        assert "unresolved → resume-pending" in page.inner_text("#sign-status")
        page.screenshot(path=str(shots / "console-signed.png"))
        assert ledger.operation("op-c1").state == "resume-pending"
        decisions = ledger.decisions("op-c1")
        assert [d["event"]["type"] for d in decisions] == ["TOOL_TIMEOUT", "HUMAN_APPROVED"]
        assert decisions[1]["outcome"] == "transitioned"

        page.click("#timeline-link")
        page.wait_for_url(f"{console.url}/operations/op-c1")
        assert page.inner_text("#state") == "resume-pending"
        assert page.inner_text("#audit").startswith("intact")
        assert "approved by approver-1" in page.inner_text("#approvals")
        assert "stalled in resume-pending" in page.inner_text("#timers")
        page.screenshot(path=str(shots / "console-timeline.png"), full_page=True)
        page.goto(f"{console.url}/")
        assert page.locator('#queue tr[data-operation="op-c1"]').count() == 0
        page.goto(f"{console.url}/audit")
        assert page.inner_text("#audit-status").startswith("intact")
        context.close()


def test_console_refuses_a_changed_packet_a_bad_token_and_a_post_without_csrf(
    browser: Any, console: Console, kafka_bootstrap: str, database_url: str, topic: str,
    ledger: Ledger, policy: Path, key_file: Path, shots: Path, tmp_path: Path,
) -> None:  # fmt: skip
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{console.url}/login")
    page.fill("#token", "rct_not-a-token")
    page.click("#sign-in")
    assert "unknown or expired token" in page.inner_text("#login-error")
    with running(settings, ledger):
        tool = Tool(kafka_bootstrap, topic)
        _escalate(tool, ledger, "op-c2")
        _sign_in(page, console)
        # A key that is not approver-1's is refused by the roster check.
        stranger = tmp_path / "stranger.pem"
        made = recoveryctl(
            "keys", "generate", "--out", str(stranger), "--id", "stranger", "--role", "approver",
            "--roster", str(tmp_path / "stranger-roster.json"),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        page.goto(f"{console.url}/key")
        page.set_input_files("#key-file", str(stranger))
        page.click("#import-key")
        page.wait_for_selector("#key-state.refused")
        assert "is not approver-1's" in page.inner_text("#key-state")
        _import_key(page, console, key_file)
        page.goto(f"{console.url}/operations/op-c2/review")
        # A late event moves the ledger history after the page was assembled.
        tool.event("email-send", "op-c2", "STEP_COMPLETED")
        # And a record for a machine nobody pinned, which becomes a dead letter.
        tool.event("no-such-machine", "op-c3", "TOOL_TIMEOUT")
        tool.close()
        wait_for(lambda: len(ledger.decisions("op-c2")) == 2, 60, "the late event decided")
        page.click("#sign-approved")
        page.wait_for_selector("#sign-status.refused", timeout=30_000)
        status = page.inner_text("#sign-status")
        assert "changed since it was shown" in status
        assert "nothing was published" in status
        page.screenshot(path=str(shots / "console-refused.png"))
        # The same signed request without the session's CSRF token is refused too.
        answer = page.evaluate(
            """async () => {
                const r = await fetch("/operations/op-c2/decision", {method: "POST",
                    headers: {"Content-Type": "application/json"}, body: "{}"});
                return [r.status, (await r.json()).error];
            }"""
        )
        assert answer == [403, "missing or wrong CSRF token; reload the page"]
        page.goto(f"{console.url}/dead-letters")
        letter = page.locator("#dead-letters tbody tr", has_text="op-c3")
        assert letter.count() == 1
        assert "machine-unknown" in letter.inner_text()
        page.screenshot(path=str(shots / "console-dead-letters.png"))
        time.sleep(1)  # anything published would be decided well within this
    assert [d["event"]["type"] for d in ledger.decisions("op-c2")] == [
        "TOOL_TIMEOUT",
        "STEP_COMPLETED",
    ]
    # Revoking the reviewer's token ends the session it opened, at its next request.
    page.goto(f"{console.url}/")
    assert page.url == f"{console.url}/"
    revoked = recoveryctl("console", "token", "--approver", "approver-1", "--revoke",
                          *console.rules)  # fmt: skip
    assert revoked.returncode == 0, revoked.stderr
    page.goto(f"{console.url}/dead-letters")
    assert page.url == f"{console.url}/login"
    context.close()


def _group() -> str:
    return f"controller-{uuid.uuid4().hex[:8]}"


# Words split across lines inside a word (not after a hyphen, slash, colon, dot or
# comma), found by the page's own layout: each character's line, from a Range over it.
# Long tokens (ids, digests) may break; words up to 24 characters must not.
_BROKEN_WORDS = """(selector) => {
    const broken = [];
    for (const element of document.querySelectorAll(selector)) {
        const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const text = node.textContent, words = /\\S+/g;
            for (let m = words.exec(text); m; m = words.exec(text)) {
                const word = m[0];
                if (word.length < 2 || word.length > 24) continue;
                let top = null;
                for (let i = 0; i < word.length; i++) {
                    const range = document.createRange();
                    range.setStart(node, m.index + i);
                    range.setEnd(node, m.index + i + 1);
                    const rects = range.getClientRects();
                    if (!rects.length) continue;
                    const now = Math.round(rects[0].top);
                    if (top !== null && now > top + 2 && !"-/:._,(".includes(word[i - 1])) {
                        broken.push(word);
                        break;
                    }
                    top = now;
                }
            }
        }
    }
    return broken;
}"""
_READ = "td, th, dt, dd, button, a.button, h1, h2, h3, p, li"
# What the window hides off its side: the page itself, or a block that scrolls sideways.
_SIDEWAYS = """() => {
    const hidden = [];
    const page = document.documentElement;
    if (page.scrollWidth > window.innerWidth + 1) hidden.push(`page ${page.scrollWidth}px`);
    for (const e of document.querySelectorAll("main, main table, main section, main dl")) {
        if (e.scrollWidth > e.clientWidth + 1) hidden.push(`${e.tagName}#${e.id} ${e.scrollWidth}`);
    }
    return hidden;
}"""
VIEWPORTS = {"narrow": {"width": 390, "height": 844}, "wide": {"width": 1366, "height": 900}}


@pytest.mark.parametrize("size", list(VIEWPORTS))
def test_console_reads_at_a_narrow_and_a_wide_window_without_breaking_words(
    browser: Any, console: Console, kafka_bootstrap: str, database_url: str, topic: str,
    ledger: Ledger, policy: Path, shots: Path, size: str,
) -> None:  # fmt: skip
    # Issue #31: table cells wrapped words mid-letter ("Revi ew", "containe d"), and the
    # reviewer could not tell what they approve nor find an operation by who or what.
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        tool = Tool(kafka_bootstrap, topic)
        _escalate(tool, ledger, "op-c9")
        tool.close()
    context = browser.new_context(viewport=VIEWPORTS[size])
    page = context.new_page()
    _sign_in(page, console)
    pages = {
        "queue": "/",
        "review": "/operations/op-c9/review",
        "timeline": "/operations/op-c9",
        "search": "/search?q=task-op-c9",
    }
    for name, path in pages.items():
        page.goto(f"{console.url}{path}")
        page.screenshot(path=str(shots / f"console-{name}-{size}.png"), full_page=True)
        assert page.evaluate(_BROKEN_WORDS, _READ) == [], f"{name} at {size}: words broken"
        assert page.evaluate(_SIDEWAYS) == [], f"{name} at {size}: content off the side"
    # The queue's Review button is in the window, not off its side (issue #31).
    page.goto(f"{console.url}/")
    review = page.locator('#queue tr[data-operation="op-c9"]').get_by_role("link", name="Review")
    box = review.bounding_box()
    assert box is not None
    assert box["x"] >= 0, box
    assert box["x"] + box["width"] <= VIEWPORTS[size]["width"], box
    # What the reviewer reads above the details, in the machine's own words.
    page.goto(f"{console.url}/operations/op-c9/review")
    assert page.inner_text("#guidance-now").startswith("unresolved: Manual review:")
    why = page.inner_text("#guidance-why")
    assert "queue messaging-review (severity medium): send-outcome-unknown" in why
    assert "no idempotency key declared" in page.inner_text("#guidance-the-call")
    assert "It sends no command; then it waits for" in page.inner_text("#guidance-approve")
    assert "2 command(s) not answered yet" in page.inner_text("#guidance-open")
    page.goto(f"{console.url}/operations/op-c9")
    assert "email.quarantine-outbox" in page.inner_text("#unanswered")
    # Found by its task, from the queue's search box.
    page.goto(f"{console.url}/")
    page.fill("#q", "task-op-c9")
    page.click("#search-button")
    assert page.locator("#search-results").inner_text().count("op-c9") >= 1
    context.close()
