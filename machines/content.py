"""Find executable content in a parsed machine (SPEC §6.3-6.4, CONFORMANCE L1.4).

A machine is data. This scan walks every key and string value of the raw document, before
schema validation, so that an author who wrote `cond: outcome == found` or
`run: curl ...` is told exactly that, rather than "unknown field". It is deliberately
conservative: a false positive costs an author a rename; a false negative lets a script,
a credential or a prompt into a security-sensitive artifact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from machines.errors import Code

Finding = tuple[Code, str, str, str]
"""(code, dotted path, message, hint)."""

REGISTERED_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*(\.[a-z][a-z0-9]*(-[a-z0-9]+)*)+$")
STATIC_IDENTIFIER = re.compile(r"^[a-z0-9][a-z0-9._:-]*$")

_KEYS: dict[Code, frozenset[str]] = {
    Code.EXEC_EXPRESSION: frozenset(
        {"cond", "condition", "expr", "expression", "when", "if", "unless", "predicate"}
    ),
    Code.EXEC_SCRIPT: frozenset(
        {
            "script",
            "code",
            "eval",
            "exec",
            "python",
            "javascript",
            "js",
            "lambda",
            "assign",
            "send",
            "invoke",
            "function",
            "handler",
            "onentry",
            "onexit",
            "datamodel",
        }
    ),
    Code.EXEC_SHELL: frozenset({"run", "shell", "command", "cmd", "bash", "sh", "powershell"}),
    Code.EXEC_PROMPT: frozenset(
        {"prompt", "system_prompt", "user_prompt", "instructions", "messages", "system"}
    ),
    Code.EXEC_CREDENTIAL: frozenset(
        {
            "token",
            "access_token",
            "refresh_token",
            "api_key",
            "apikey",
            "password",
            "passwd",
            "secret",
            "client_secret",
            "credential",
            "credentials",
            "private_key",
            "authorization",
            "auth",
            "bearer",
            "cookie",
            "session_key",
        }
    ),
}
_KEY_HINTS: dict[Code, str] = {
    Code.EXEC_EXPRESSION: "name a registered guard id instead; conditions live in the controller",
    Code.EXEC_SCRIPT: "remove it; behaviour comes from registered capabilities, not scripts",
    Code.EXEC_SHELL: "remove it; invoke a registered capability id instead of a command",
    Code.EXEC_PROMPT: "remove it; machines carry no prompts (SPEC §6.4)",
    Code.EXEC_CREDENTIAL: "remove it; capabilities get task-scoped authority from the controller",
}
DESTINATION_KEYS = frozenset(
    {
        "url",
        "uri",
        "endpoint",
        "webhook",
        "webhook_url",
        "callback",
        "callback_url",
        "host",
        "address",
        "email",
        "recipient",
        "recipients",
        "to",
        "cc",
        "bcc",
        "destination",
        "channel",
        "queue",
        "topic",
        "target_url",
    }
)

_TEMPLATE = re.compile(r"\{\{|\}\}|\$\{|\{%|%\}|<%|#\{")
_SHELL = re.compile(
    r"\$\(|`|&&|\|\s*(?:ba|z)?sh\b|^#!|;\s*\w|(?:^|\s)(?:sudo|curl|wget|rm|bash|sh|zsh|python3?|"
    r"node|powershell|nc)\s+\S"
)
_CREDENTIAL = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----|\bBearer\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\b(?:sk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bAKIA[0-9A-Z]{16}\b|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.|://[^/\s:@]+:[^/\s@]+@"
)
_PROMPT = re.compile(
    r"(?i)\byou are (?:an?|the) (?:helpful|ai|assistant|agent|language model)\b|"
    r"\bignore (?:all |any )?(?:previous|prior) instructions\b|\bsystem prompt\b|<\|im_start\|>"
)
_EXPRESSION = re.compile(r"==|!=|<=|>=|[<>!()&|]|\s(?:and|or|not|in|is)\s|^not\s")


def _norm(key: str) -> str:
    return key.strip().lower().replace("-", "_")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def scan(data: Any) -> list[Finding]:
    """Every executable-content finding in `data`, in document order, one per path."""
    # Position-specific findings first: they carry the more precise code for their path.
    findings: list[Finding] = [*_guard_findings(data), *_action_findings(data)]
    _walk(data, "", findings.append, in_description=False)
    # One finding per path: the first (most specific) wins.
    seen: set[str] = set()
    unique: list[Finding] = []
    for finding in findings:
        if finding[1] not in seen:
            seen.add(finding[1])
            unique.append(finding)
    return unique


def _walk(value: Any, path: str, emit: Callable[[Finding], None], in_description: bool) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            child = _join(path, str(key))
            if _check_key(str(key), item, child, emit):
                continue
            _walk(item, child, emit, in_description=_norm(str(key)) == "description")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]", emit, in_description)
    elif isinstance(value, str):
        _check_string(value, path, emit, in_description)


def _check_key(key: str, value: Any, path: str, emit: Callable[[Finding], None]) -> bool:
    """Report a forbidden or destination key; True when the value needs no further scan."""
    normal = _norm(key)
    for code, names in _KEYS.items():
        if normal in names:
            emit((code, path, f"field {key!r} is executable content", _KEY_HINTS[code]))
            return True
    if normal in DESTINATION_KEYS:
        values = value if isinstance(value, list) else [value]
        bad = [v for v in values if not (isinstance(v, str) and STATIC_IDENTIFIER.match(v))]
        if bad:
            emit(
                (
                    Code.DESTINATION_NOT_STATIC,
                    path,
                    f"destination {key!r} is {str(bad[0])[:60]!r}, not a static identifier",
                    "name a destination the operator registered (e.g. 'procurement-oncall'); "
                    "URLs, addresses and runtime values are resolved by the capability",
                )
            )
            return True
    return False


def _check_string(text: str, path: str, emit: Callable[[Finding], None], in_desc: bool) -> None:
    shown = text[:60]
    if _TEMPLATE.search(text):
        emit(
            (
                Code.EXEC_TEMPLATE,
                path,
                f"template syntax in {shown!r}",
                "use static values; machines are not rendered",
            )
        )
    elif _CREDENTIAL.search(text):
        emit(
            (
                Code.EXEC_CREDENTIAL,
                path,
                "value looks like a credential or token",
                "remove it and rotate it; capabilities get task-scoped authority from the "
                "controller",
            )
        )
    elif _PROMPT.search(text):
        emit(
            (
                Code.EXEC_PROMPT,
                path,
                f"value looks like a model prompt: {shown!r}",
                "remove it; machines carry no prompts (SPEC §6.4)",
            )
        )
    elif not in_desc and _SHELL.search(text):
        emit(
            (
                Code.EXEC_SHELL,
                path,
                f"value looks like a shell command: {shown!r}",
                "invoke a registered capability id with static params instead",
            )
        )


def _transitions(data: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, transition) for every transition-shaped mapping, whatever the document's shape."""
    states = data.get("states") if isinstance(data, dict) else None
    if not isinstance(states, dict):
        return
    for name, state in states.items():
        on = state.get("on") if isinstance(state, dict) else None
        if not isinstance(on, dict):
            continue
        for event, spec in on.items():
            base = f"states.{name}.on.{event}"
            if isinstance(spec, dict):
                yield base, spec
            elif isinstance(spec, list):
                for i, item in enumerate(spec):
                    if isinstance(item, dict):
                        yield f"{base}[{i}]", item


def _guard_findings(data: Any) -> Iterator[Finding]:
    for base, transition in _transitions(data):
        if "guard" not in transition:
            continue
        guard = transition["guard"]
        path = f"{base}.guard"
        if isinstance(guard, dict) or (
            isinstance(guard, str) and not REGISTERED_ID.match(guard) and _EXPRESSION.search(guard)
        ):
            yield (
                Code.EXEC_EXPRESSION,
                path,
                f"guard {str(guard)[:60]!r} is an expression, not a registered guard id",
                "name one registered guard id (e.g. 'evidence.not-applied'); the controller "
                "evaluates it over trusted evidence",
            )


def _action_lists(data: Any) -> Iterator[tuple[str, list[Any]]]:
    states = data.get("states") if isinstance(data, dict) else None
    if isinstance(states, dict):
        for name, state in states.items():
            if isinstance(state, dict) and isinstance(state.get("entry"), list):
                yield f"states.{name}.entry", state["entry"]
    for base, transition in _transitions(data):
        if isinstance(transition.get("actions"), list):
            yield f"{base}.actions", transition["actions"]


def _action_findings(data: Any) -> Iterator[Finding]:
    for base, actions in _action_lists(data):
        for i, action in enumerate(actions):
            if isinstance(action, str) and not REGISTERED_ID.match(action) and " " in action:
                yield (
                    Code.EXEC_SHELL,
                    f"{base}[{i}]",
                    f"action {action[:60]!r} is not a capability id",
                    "name a registered capability id; commands are never run from a machine",
                )
