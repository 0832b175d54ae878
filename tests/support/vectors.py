"""The wire protocol's test vectors (docs/wire-protocol.md), generated from fixed keys.

`python -m tests.support.vectors` writes `schemas/vectors/*.json`; `--check` exits 1
when a committed file differs from what this module generates now (the unit test
`tests/unit/wire/test_vectors.py` does the same, so stale vectors fail the suite).

Everything is deterministic: the keys are Ed25519 seeds derived from public names
(`vector_key`: SHA-256 of a domain and the name; never use them anywhere else), times
are fixed, Ed25519 signatures are deterministic (RFC 8032), and the Avro and JSON
encodings are those of `schemas`. The bytes come from our code; the verdicts (accepted,
or the refusal code a record earns) are stated here, by hand, for each case, and the
unit test checks that our code reaches them: a vector is a claim about the protocol,
not a recording of whatever the code does.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import fastavro
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    ClassifierOutput,
    DeclaredFacts,
    Event,
    EvidencePayload,
    HumanDecision,
    Invocation,
    Lineage,
    Scope,
    canonical_json,
    digest_of,
    issue_call_context,
    key_id,
    public_key_text,
    sign_decision,
    signing_payload,
)
from machines.call_context import CALL_CONTEXT_DOMAIN
from machines.digest import CANONICAL_FORM
from machines.event import MAX_DELEGATED_CREDENTIALS
from schemas import (
    CAPABILITY_COMMAND,
    CONTENT_TYPE,
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    EVENT_ENVELOPE,
    HEADER_CALL_CONTEXT,
    HEADER_COMMAND_ID,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    AvroSingleObjectCodec,
    CapabilityCommand,
    JsonCodec,
    RecordSigner,
    default_catalog,
    event_to_json,
    event_to_record,
    rabin_fingerprint,
    record_id,
    record_signing_message,
)

__all__ = ["VECTORS_DIR", "generate", "vector_key", "write"]

VECTORS_DIR: Final = Path(__file__).resolve().parents[2] / "schemas" / "vectors"
PROTOCOL: Final = "agent-recovery-wire/1"
KEY_DOMAIN: Final = b"agent-recovery/test-vector-key/v1:"
EVENTS_TOPIC: Final = "recovery.events"
COMMANDS_TOPIC: Final = "recovery.commands"
# The time every key validity, deadline and verdict of the vectors is judged at.
AT: Final = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
T0: Final = datetime(2026, 6, 1, 11, 59, 30, 250000, tzinfo=UTC)

TOOL: Final = "vector-tool"
# A tool shared by many agents: its grant names none, so an opening needs the call
# context the agent's runtime signed (docs/wire-protocol.md, "Call contexts").
SHARED_TOOL: Final = "vector-shared-tool"
RUNTIME: Final = "vector-runtime"  # the agent's runtime: orchestrator for AGENT
WORKER: Final = "vector-worker"
APPROVER: Final = "vector-approver"
CONTROLLER: Final = "recovery-controller"
STRANGER: Final = "vector-stranger"  # a key no roster lists
AGENT: Final = "procurement-agent"
# The agent runtime that ran the call (envelope v6, `lineage.runtime`).
AGENT_RUNTIME: Final = "procurement-runtime-3"
CAPABILITY: Final = "procurement.create-request"
VERIFY: Final = "procurement.verify-request"


def vector_key(name: str) -> Ed25519PrivateKey:
    """The fixed test key `name`: its seed is SHA-256(`KEY_DOMAIN` + name). Public by
    construction: for vectors only."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(KEY_DOMAIN + name.encode()).digest())


def _seed_hex(name: str) -> str:
    return hashlib.sha256(KEY_DOMAIN + name.encode()).hexdigest()


_KEY_NAMES: Final = (
    TOOL,
    SHARED_TOOL,
    RUNTIME,
    WORKER,
    APPROVER,
    CONTROLLER,
    STRANGER,
    "vector-revoked",
    "vector-expired",
    "vector-future",
    "vector-tool-old",
)


def _keys() -> dict[str, Any]:
    keys = []
    for name in _KEY_NAMES:
        private = vector_key(name)
        keys.append(
            {
                "name": name,
                "seed_hex": _seed_hex(name),
                "public_key": public_key_text(private.public_key()),
                "key_id": key_id(private.public_key()),
            }
        )
    return {
        "description": "Fixed Ed25519 test keys: seed = SHA-256('agent-recovery/test-vector-"
        "key/v1:' + name). Public by construction; never use them outside tests.",
        "keys": keys,
    }


def _public(name: str) -> str:
    return public_key_text(vector_key(name).public_key())


def roster() -> dict[str, Any]:
    """The roster every verdict of the vectors is judged against (a roster file's form)."""
    tool_grant = {
        "role": "tool",
        "capabilities": [CAPABILITY],
        "tools": ["coupa"],
        "environments": ["production", "staging"],
        "agents": [AGENT],
    }
    return {
        "producers": [
            {
                "id": TOOL,
                "keys": [
                    {"public_key": _public(TOOL), "not_before": "2026-01-01T00:00:00Z"},
                    {"public_key": _public("vector-tool-old"), "revoked": True},
                    {
                        "public_key": _public("vector-expired"),
                        "not_after": "2026-01-01T00:00:00Z",
                    },
                    {"public_key": _public("vector-future"), "not_before": "2100-01-01T00:00:00Z"},
                ],
                "grants": [tool_grant],
            },
            {
                "id": SHARED_TOOL,
                "keys": [{"public_key": _public(SHARED_TOOL)}],
                "grants": [{k: v for k, v in tool_grant.items() if k != "agents"}],
            },
            {
                "id": RUNTIME,
                "keys": [{"public_key": _public(RUNTIME)}],
                "grants": [{"role": "orchestrator", "agents": [AGENT]}],
            },
            {
                "id": WORKER,
                "keys": [{"public_key": _public(WORKER)}],
                "grants": [
                    {"role": "worker", "capabilities": [CAPABILITY, VERIFY]},
                    {"role": "verifier", "capabilities": [CAPABILITY, VERIFY]},
                ],
            },
            {
                "id": APPROVER,
                "keys": [{"public_key": _public(APPROVER)}],
                "grants": [{"role": "approver"}],
            },
            {
                "id": CONTROLLER,
                "keys": [{"public_key": _public(CONTROLLER)}],
                "grants": [{"role": "controller", "capabilities": ["*"]}],
            },
        ]
    }


# ---------------------------------------------------------------------------------------
# canonical-json/1


_CANONICAL_CASES: Final[Sequence[tuple[str, str]]] = (
    ("literals", "[null,true,false]"),
    ("empty containers", '{"a":[],"b":{}}'),
    ("keys sorted at every level", '{"b":{"z":1,"a":2},"a":[{"d":0,"c":0}]}'),
    ("keys by code point, not UTF-16 unit", '{"\\ud83d\\ude00":1,"\\uffff":2,"a":3,"Z":4}'),
    ("integers of any size", "[0,-0,7,-42,9007199254740993,123456789012345678901234567890]"),
    ("floats: shortest round trip", "[0.1,1.5,-2.25,100.0,1e2,3.0e0]"),
    ("floats: exponent below 1e-4", "[0.0001,0.00001,1.5e-7,-1e-10]"),
    ("floats: exponent from 1e16", "[1e15,1e16,1.5e16,12345678901234567.0,1e300]"),
    ("float zero and negative zero", "[0.0,-0.0]"),
    ("string escapes", '["quote \\" backslash \\\\ slash /","\\b\\f\\n\\r\\t"]'),
    ("control characters", '["\\u0000\\u0001\\u001f\\u007f"]'),
    ("non-ASCII as UTF-8", '["caf\\u00e9","\\u2028\\u2029","\\ud83d\\ude00","\\u00e9t\\u00e9"]'),
    ("nested", '{"payload":{"items":[{"sku":"L-1","qty":12}],"note":null},"v":1}'),
)


def _canonical() -> dict[str, Any]:
    cases = []
    for name, text in _CANONICAL_CASES:
        value = json.loads(text)
        out = canonical_json(value)
        cases.append(
            {
                "name": name,
                "input": text,
                "canonical": out.decode("utf-8"),
                "canonical_hex": out.hex(),
                "sha256": hashlib.sha256(out).hexdigest(),
            }
        )
    return {
        "form": CANONICAL_FORM,
        "description": "input is JSON text; a number token with a fraction or an exponent is "
        "a binary64 float, one without is an integer (docs/wire-protocol.md, "
        "'canonical-json/1'). canonical is the canonical form, canonical_hex its UTF-8 bytes.",
        "cases": cases,
    }


# ---------------------------------------------------------------------------------------
# record ids, partitions, fingerprints


def _ids() -> dict[str, Any]:
    record_ids = [
        {"kind": "event", "parts": ["op-17", "evt-1"]},
        {"kind": "event", "parts": ["op-procurement-1", "result:op-procurement-1:2:0"]},
        {"kind": "event", "parts": ["opé-☃", "evt-😀"]},
        {"kind": "event", "parts": ["a", "bc"]},
        {"kind": "event", "parts": ["ab", "c"]},
    ]
    for case in record_ids:
        case["record_id"] = record_id(case["kind"], *case["parts"])
    keys = ["op-17", "op-procurement-1", "drill-op-1", "opé-☃", ""]
    partitions = [
        {
            "key": k,
            "crc32": zlib.crc32(k.encode("utf-8")),
            "partition": {str(n): zlib.crc32(k.encode("utf-8")) % n for n in (1, 3, 6, 12)},
        }
        for k in keys
    ]
    catalog = default_catalog()
    schemas = [
        {
            "file": version.path.name,
            "name": version.name,
            "version": version.version,
            "parsing_canonical_form": version.canonical_form,
            "fingerprint_hex": version.fingerprint_hex,
        }
        for version in sorted(catalog.versions().values(), key=lambda v: v.path.name)
    ]
    rabin = [
        {"input": text, "fingerprint_le_hex": rabin_fingerprint(text).hex()}
        for text in ('"null"', '"int"', '{"type":"record","name":"x","fields":[]}', "")
    ]
    return {
        "record_ids": record_ids,
        "partitions": partitions,
        "schemas": schemas,
        "rabin": rabin,
    }


# ---------------------------------------------------------------------------------------
# events


def _lineage(runtime: str | None = None) -> Lineage:
    """The lineage of the vectors' operation; a command's carries no runtime (the
    command schema has none), an event's names the agent runtime that ran the call."""
    return Lineage(
        agent=AGENT, task="task-7", initiating_principal="alice@example.com", runtime=runtime
    )


# The arguments of the call the vectors' operation stands for, and their digest
# (`facts.arguments_digest`, envelope v6).
ARGUMENTS: Final = {"item": "laptop-14", "quantity": 12}


def _base_event(**fields: Any) -> Event:
    values: dict[str, Any] = {
        "event_type": "TOOL_TIMEOUT",
        "event_id": "evt-vector-0001",
        "operation_id": "op-vector-1",
        "correlation_id": "corr-vector-1",
        "machine_name": "procurement-request",
        "machine_version": "1.0.0",
        "event_time": T0,
        "evidence_ref": "coupa:call:req-op-vector-1",
        "producer": TOOL,
        "lineage": _lineage(AGENT_RUNTIME),
        "facts": DeclaredFacts(
            idempotency_key="req-op-vector-1",
            side_effect_possible=True,
            side_effect_confirmed=False,
            compensation_supported=True,
            status_api=True,
            arguments_digest=digest_of(ARGUMENTS),
        ),
        "scope": Scope(capability=CAPABILITY, tool="coupa", environment="production"),
    }
    values.update(fields)
    return Event(**values)


def _decision() -> HumanDecision:
    return sign_decision(
        HumanDecision(
            approver=APPROVER,
            operation_id="op-vector-1",
            state="unresolved",
            transition="retrying",
            machine_digest="sha256:" + "ab" * 32,
            expires_at=datetime(2026, 6, 1, 13, 0, tzinfo=UTC),
            nonce="0123456789abcdef0123456789abcdef",
            decision="approved",
            reviewed_digest="sha256:" + "cd" * 32,
            for_resume=False,
        ),
        vector_key(APPROVER),
    )


def _event_cases() -> list[tuple[str, Event]]:
    return [
        ("tool timeout opening an operation", _base_event()),
        (
            "minimal envelope (no optional block, no runtime)",
            _base_event(
                event_id="evt-vector-0002",
                event_time=datetime(2026, 6, 1, 11, 0, tzinfo=UTC),
                lineage=_lineage(),
                facts=None,
                scope=None,
            ),
        ),
        (
            "payload with unicode and numbers",
            _base_event(
                event_id="evt-vector-0003",
                payload={
                    "item": "Laptop 14\u2033 (caf\u00e9 \U0001f600)",
                    "qty": 12,
                    "unit_price": 1249.5,
                    "ratio": 1e-05,
                    "big": 12345678901234567890,
                    "tags": ["a", "b"],
                    "nested": {"z": None, "a": True},
                },
            ),
        ),
        (
            "verification result with causation",
            _base_event(
                event_type="VERIFICATION_NOT_FOUND",
                event_id="result:op-vector-1:1:0",
                producer=WORKER,
                evidence_ref="command:op-vector-1:1:0",
                lineage=_lineage(),  # a result copies the command's lineage
                evidence=EvidencePayload(
                    outcome="not_applied", verifier=WORKER, reference="status-api:404"
                ),
                causation="op-vector-1:1:0",
                facts=None,
                scope=None,
            ),
        ),
        (
            "lineage with delegation and classifier output",
            _base_event(
                event_id="evt-vector-0005",
                lineage=Lineage(
                    agent=AGENT,
                    task="task-7",
                    initiating_principal="alice@example.com",
                    origin_operation="op-root",
                    parent_operation="op-parent",
                    delegated_credentials=("cred-1", "cred-2"),
                    runtime=AGENT_RUNTIME,
                ),
                classifier=ClassifierOutput(
                    identity="clf-1",
                    version="2.1",
                    question="effect?",
                    probabilities={"applied": 0.25, "not_applied": 0.75},
                    candidate_event="TOOL_TIMEOUT",
                ),
            ),
        ),
        (
            "signed human decision",
            _base_event(
                event_type="HUMAN_APPROVED",
                event_id="decision:0123456789abcdef0123456789abcdef",
                producer=APPROVER,
                evidence_ref=f"approval:{APPROVER}:0123456789abcdef0123456789abcdef",
                lineage=_lineage(),
                human_decision=_decision(),
                facts=None,
                scope=None,
            ),
        ),
        (
            "opening by a shared tool with the agent runtime's call context",
            _base_event(event_id="evt-vector-0007", producer=SHARED_TOOL),
        ),
    ]


# When the vectors' call contexts were issued, and for how long they hold.
CONTEXT_ISSUED: Final = datetime(2026, 6, 1, 11, 59, tzinfo=UTC)
CONTEXT_LIFETIME: Final = timedelta(minutes=15)


def _call_context(
    operation_id: str = "op-vector-1",
    lineage: Lineage | None = None,
    *,
    issuer: str = RUNTIME,
    key: str | None = None,
    issued: datetime = CONTEXT_ISSUED,
) -> str:
    """The call context `issuer` signs (with the key of `key`, else its own) for the call
    that becomes `operation_id`: the `recovery-call-context` header a tool forwards."""
    return issue_call_context(
        issuer,
        vector_key(key or issuer),
        operation_id,
        lineage or _lineage(AGENT_RUNTIME),
        now=issued,
        lifetime=CONTEXT_LIFETIME,
    )


def _call_context_case(text: str) -> dict[str, Any]:
    """What a context header holds and how its signature is made."""
    document = json.loads(text)
    context = document["context"]
    message = CALL_CONTEXT_DOMAIN + canonical_json(context)
    return {
        "header": text,
        "context": context,
        "signing_message": message.decode("utf-8"),
        "signature": document["signature"],
    }


# The events whose opening forwards a call context, by event id.
_FORWARDED: Final = {"evt-vector-0007": _call_context}


def _signer(name: str, producer: str | None = None) -> RecordSigner:
    return RecordSigner(producer or name, vector_key(name))


def _headers_json(headers: Sequence[tuple[str, bytes | None]]) -> list[list[str | None]]:
    return [[k, None if v is None else v.decode("utf-8")] for k, v in headers]


def _publish(event: Event, *, use_json: bool, call_context: str | None = None) -> dict[str, Any]:
    """`event` as `producers.EventPublisher` writes it: value, headers (the call context,
    when the tool forwards one, after the standard ones), signature."""
    if use_json:
        value = JsonCodec().encode(event_to_json(event), EVENT_ENVELOPE)
        headers: list[tuple[str, bytes | None]] = [(CONTENT_TYPE, CONTENT_TYPE_JSON.encode())]
    else:
        codec = AvroSingleObjectCodec()
        value = codec.encode(event_to_record(event), EVENT_ENVELOPE)
        headers = [
            (CONTENT_TYPE, CONTENT_TYPE_AVRO.encode()),
            (HEADER_SCHEMA, codec.fingerprint(EVENT_ENVELOPE).encode()),
        ]
    rid = record_id("event", event.operation_id, event.event_id)
    headers.insert(1, (HEADER_RECORD_ID, rid.encode()))
    if call_context is not None:
        headers.append((HEADER_CALL_CONTEXT, call_context.encode()))
    signer = _signer(event.producer)
    key = event.operation_id.encode("utf-8")
    message = record_signing_message(
        EVENTS_TOPIC, key, value, headers, signer.producer, signer.key_id
    )
    signed = signer.sign(EVENTS_TOPIC, key, value, headers)
    return {
        "value_hex": value.hex(),
        **({"value_text": value.decode("utf-8")} if use_json else {}),
        "value_sha256": hashlib.sha256(value).hexdigest(),
        "headers": _headers_json(signed),
        "signing_message": message.decode("utf-8"),
        "signature": dict(signed)["recovery-signature"].decode(),  # type: ignore[union-attr]
    }


def _events() -> dict[str, Any]:
    cases = []
    for name, event in _event_cases():
        content = canonical_json(event.content())
        issue = _FORWARDED.get(event.event_id)
        context = None if issue is None else issue()
        case: dict[str, Any] = {
            "name": name,
            "envelope": event_to_json(event),
            "content_canonical": content.decode("utf-8"),
            "payload_digest": event.payload_digest,
            "topic": EVENTS_TOPIC,
            "key": event.operation_id,
            "record_id": record_id("event", event.operation_id, event.event_id),
            "producer": event.producer,
            "key_id": key_id(vector_key(event.producer).public_key()),
            "avro": _publish(event, use_json=False, call_context=context),
            "json": _publish(event, use_json=True, call_context=context),
        }
        if context is not None:
            case["call_context"] = _call_context_case(context)
        decision = event.human_decision
        if decision is not None:
            case["human_decision_signing_message"] = signing_payload(decision).decode("utf-8")
        cases.append(case)
    return {"topic": EVENTS_TOPIC, "cases": cases}


# ---------------------------------------------------------------------------------------
# commands and the worker's verdicts


def _command(**fields: Any) -> CapabilityCommand:
    values: dict[str, Any] = {
        "operation_id": "op-vector-1",
        "correlation_id": "corr-vector-1",
        "causation_event_id": "result:op-vector-1:1:0",
        "machine_name": "procurement-request",
        "machine_version": "1.0.0",
        "machine_digest": "sha256:" + "ab" * 32,
        "sequence": 2,
        "lineage": _lineage(),
        "issued_at": datetime(2026, 6, 1, 11, 59, 31, 500000, tzinfo=UTC),
        "deadline": datetime(2026, 6, 1, 12, 30, tzinfo=UTC),
        "idempotency_key": "req-op-vector-1",
    }
    invocation = Invocation(
        command_id=fields.pop("command_id", "op-vector-1:2:0"),
        capability=fields.pop("capability", CAPABILITY),
        kind=fields.pop("kind", "retry"),
        material=fields.pop("material", True),
        params=fields.pop("params", {"attempt_budget": 3, "note": "café"}),
        origin=fields.pop("origin", "transition"),
    )
    values.update(fields)
    return CapabilityCommand.from_invocation(invocation, **values)


def _command_record(
    command: CapabilityCommand,
    signer: RecordSigner | None,
    *,
    tamper: Callable[[bytes, list[tuple[str, bytes | None]]], tuple[bytes, Any]] | None = None,
    command_id_header: str | None = None,
) -> dict[str, Any]:
    codec = AvroSingleObjectCodec()
    value = codec.encode(command.to_record(), CAPABILITY_COMMAND)
    headers: list[tuple[str, bytes | None]] = [
        (CONTENT_TYPE, CONTENT_TYPE_AVRO.encode()),
        (HEADER_RECORD_ID, command.command_id.encode()),
        (HEADER_SCHEMA, codec.fingerprint(CAPABILITY_COMMAND).encode()),
        (HEADER_COMMAND_ID, (command_id_header or command.command_id).encode()),
    ]
    key = command.operation_id.encode()
    if signer is not None:
        headers = signer.sign(COMMANDS_TOPIC, key, value, headers)
    if tamper is not None:
        value, headers = tamper(value, headers)
    return {
        "key": command.operation_id,
        "value_hex": value.hex(),
        "headers": _headers_json(headers),
    }


def _command_json(command: CapabilityCommand) -> dict[str, Any]:
    record = command.to_record()
    for name in ("issued_at", "deadline"):
        moment = record[name]
        record[name] = None if moment is None else moment.isoformat()
    return record


def _flip_last(value: bytes, headers: list[tuple[str, bytes | None]]) -> tuple[bytes, Any]:
    return value[:-1] + bytes([value[-1] ^ 1]), headers


def _replace(old: bytes, new: bytes) -> Callable[[bytes, Any], tuple[bytes, Any]]:
    def change(value: bytes, headers: list[tuple[str, bytes | None]]) -> tuple[bytes, Any]:
        return value.replace(old, new), headers

    return change


def _set_header(name: str, text: str) -> Callable[[bytes, Any], tuple[bytes, Any]]:
    def change(value: bytes, headers: list[tuple[str, bytes | None]]) -> tuple[bytes, Any]:
        return value, [(k, text.encode() if k == name else v) for k, v in headers]

    return change


def _commands() -> dict[str, Any]:
    controller = _signer(CONTROLLER)
    retry = _command()
    verify = _command(
        command_id="op-vector-1:1:0",
        capability=VERIFY,
        kind="verify",
        material=False,
        params={},
        sequence=1,
        causation_event_id="evt-vector-0001",
        deadline=None,
    )
    drill = _command(
        command_id="drill-op-1:2:0",
        operation_id="drill-op-1",
        correlation_id="corr-drill-1",
    )
    expired = _command(
        command_id="op-vector-1:4:0", deadline=datetime(2026, 6, 1, 11, 0, tzinfo=UTC)
    )
    at_deadline = _command(command_id="op-vector-1:5:0", deadline=AT)
    cases: list[dict[str, Any]] = [
        ("signed retry command", retry, controller, {}, "execute"),
        ("signed verify command without deadline", verify, controller, {}, "execute"),
        ("drill command", drill, controller, {}, "drill"),
        ("deadline passed", expired, controller, {}, "deadline-expired"),
        ("deadline equal to now", at_deadline, controller, {}, "deadline-expired"),
        ("unsigned", retry, None, {}, "signature-missing"),
        (
            "signature not base64",
            retry,
            controller,
            {"tamper": _set_header("recovery-signature", "not*base64")},
            "signature-malformed",
        ),
        (
            "unknown producer",
            retry,
            _signer(STRANGER),
            {},
            "producer-unknown",
        ),
        (
            "key the controller does not have",
            retry,
            _signer(STRANGER, CONTROLLER),
            {},
            "key-unknown",
        ),
        (
            "value altered after signing",
            retry,
            controller,
            {"tamper": _flip_last},
            "signature-invalid",
        ),
        (
            "command id header altered after signing",
            retry,
            controller,
            {"tamper": _set_header(HEADER_COMMAND_ID, "op-vector-1:9:0")},
            "signature-invalid",
        ),
        (
            "signed by a producer that is not a controller",
            retry,
            _signer(WORKER),
            {},
            "role-not-permitted",
        ),
        (
            "decoded command id is not the signed one",
            retry,
            controller,
            {"command_id_header": "op-vector-1:3:0"},
            "identity-mismatch",
        ),
    ]
    out = []
    for name, command, signer, options, verdict in cases:
        out.append(
            {
                "name": name,
                "record": _command_record(command, signer, **options),
                "verdict": verdict,
                **({"command": _command_json(command)} if verdict in _EXECUTED else {}),
            }
        )
    return {
        "topic": COMMANDS_TOPIC,
        "at": AT.isoformat(),
        "roster": roster(),
        "description": "verdict: execute (verified, run the handler), drill (verified, "
        "answer without the handler), deadline-expired (verified, refused: report failure), "
        "or the refusal code of an unverified record (not executed, nothing reported).",
        "cases": out,
    }


_EXECUTED: Final = frozenset({"execute", "drill", "deadline-expired"})


# ---------------------------------------------------------------------------------------
# refusals at the controller's intake


MAX_RECORD_BYTES: Final = 4096


def _raw(
    event: Event | None = None,
    *,
    value: bytes | None = None,
    use_json: bool = False,
    signer: RecordSigner | None = None,
    key: str | None = None,
    content_type: str | None = None,
    after: Callable[[bytes, list[tuple[str, bytes | None]]], tuple[bytes, Any]] | None = None,
    unsigned: bool = False,
    call_context: str | None = None,
) -> dict[str, Any]:
    """A record on the events topic: `event` encoded as the client does (or `value`),
    keyed by its operation (or `key`), forwarding `call_context`, signed by `signer`
    (else its producer's key)."""
    headers: list[tuple[str, bytes | None]]
    if value is None and event is not None:
        encoded = _publish(event, use_json=use_json)
        value = bytes.fromhex(encoded["value_hex"])
        headers = [
            (k, None if v is None else v.encode())
            for k, v in encoded["headers"]
            if not k.startswith("recovery-") or k in (HEADER_SCHEMA, HEADER_RECORD_ID)
        ]
    else:
        headers = [(CONTENT_TYPE, (content_type or CONTENT_TYPE_AVRO).encode())]
    if content_type is not None:
        headers = [(k, content_type.encode() if k == CONTENT_TYPE else v) for k, v in headers]
    record_key = key if key is not None else (event.operation_id if event else "op-vector-1")
    if call_context is not None:
        headers.append((HEADER_CALL_CONTEXT, call_context.encode()))
    if not unsigned:
        chosen = signer or _signer(event.producer if event else TOOL)
        headers = chosen.sign(EVENTS_TOPIC, record_key.encode(), value, headers)
    if after is not None:
        value, headers = after(value or b"", headers)
    return {
        "key": record_key,
        "value_hex": None if value is None else value.hex(),
        "headers": _headers_json(headers),
    }


def _avro_value(event: Event) -> bytes:
    return AvroSingleObjectCodec().encode(event_to_record(event), EVENT_ENVELOPE)


def _json_text(text: str) -> bytes:
    return text.encode("utf-8")


def _refusals() -> dict[str, Any]:
    good = _base_event()
    envelope = json.dumps(event_to_json(good), sort_keys=True)
    command_value = AvroSingleObjectCodec().encode(_command().to_record(), CAPABILITY_COMMAND)
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("a valid Avro event", _raw(good), "accepted", "intake"),
        ("a valid JSON event", _raw(good, use_json=True), "accepted", "intake"),
        (
            "JSON with content-type parameters",
            _raw(good, use_json=True, content_type="Application/JSON; charset=utf-8"),
            "accepted",
            "intake",
        ),
        (
            "too large with key and headers",
            _raw(value=bytes(MAX_RECORD_BYTES)),
            "wire-oversized",
            "intake",
        ),
        ("no value", _raw(value=None, unsigned=True), "wire-empty", "intake"),
        ("empty value", _raw(value=b""), "wire-empty", "intake"),
        (
            "unsupported content type",
            _raw(good, content_type="text/plain"),
            "wire-unsupported-content-type",
            "intake",
        ),
        (
            "JSON sent as Avro",
            _raw(value=_json_text(envelope)),
            "avro-not-single-object",
            "intake",
        ),
        (
            "schema-registry framing",
            _raw(value=b"\x00\x00\x00\x00\x01" + _avro_value(good)[10:]),
            "avro-not-single-object",
            "intake",
        ),
        (
            "unknown writer schema",
            _raw(value=b"\xc3\x01" + bytes(8) + _avro_value(good)[10:]),
            "avro-unknown-fingerprint",
            "intake",
        ),
        (
            "truncated Avro body",
            _raw(value=_avro_value(good)[:40]),
            "avro-corrupt",
            "intake",
        ),
        (
            "bytes after the Avro record",
            _raw(value=_avro_value(good) + b"\x00"),
            "avro-trailing-bytes",
            "intake",
        ),
        (
            "JSON with a duplicate key",
            _raw(
                value=_json_text('{"event_id":"a",' + envelope[1:]),
                content_type=CONTENT_TYPE_JSON,
            ),
            "json-malformed",
            "intake",
        ),
        (
            "JSON with NaN",
            _raw(
                value=_json_text(envelope[:-1] + ',"x":NaN}'),
                content_type=CONTENT_TYPE_JSON,
            ),
            "json-malformed",
            "intake",
        ),
        (
            "JSON that is not UTF-8",
            _raw(value=b'{"event_id":"\xff"}', content_type=CONTENT_TYPE_JSON),
            "json-malformed",
            "intake",
        ),
        (
            "JSON with an unknown field",
            _raw(
                value=_json_text(envelope[:-1] + ',"priority":1}'),
                content_type=CONTENT_TYPE_JSON,
            ),
            "json-schema-violation",
            "intake",
        ),
        (
            "JSON time with another offset",
            _raw(
                value=_json_text(envelope.replace("+00:00", "+01:00", 1)),
                content_type=CONTENT_TYPE_JSON,
            ),
            "json-schema-violation",
            "intake",
        ),
        (
            "a command on the events topic",
            _raw(value=command_value),
            "schema-unexpected",
            "intake",
        ),
        (
            "lowercase event type",
            _raw(replace(good, event_type="tool_timeout", payload_digest="")),
            "envelope-invalid",
            "intake",
        ),
        (
            "payload text that is not a JSON object",
            _raw(value=_payload_text_value(good, "[1,2]")),
            "envelope-invalid",
            "intake",
        ),
        (
            "operation id with whitespace",
            _raw(replace(good, operation_id="op vector", payload_digest=""), key="op vector"),
            "envelope-field-invalid",
            "intake",
        ),
        (
            "identifier longer than 256 characters",
            _raw(replace(good, correlation_id="c" * 257, payload_digest="")),
            "envelope-field-invalid",
            "intake",
        ),
        (
            "payload with a value at depth 32, the limit",
            _raw(replace(good, payload=_nested(32), payload_digest="")),
            "accepted",
            "intake",
        ),
        (
            "payload with a value at depth 33",
            _raw(replace(good, payload=_nested(33), payload_digest="")),
            "envelope-field-invalid",
            "intake",
        ),
        (
            "event time before 2000",
            _raw(replace(good, event_time=datetime(1999, 12, 31, tzinfo=UTC), payload_digest="")),
            "event-time-out-of-range",
            "intake",
        ),
        ("unsigned", _raw(good, unsigned=True), "signature-missing", "intake"),
        (
            "signature not base64",
            _raw(good, after=_set_header("recovery-signature", "%%%")),
            "signature-malformed",
            "intake",
        ),
        (
            "producer not in the roster",
            _raw(replace(good, producer=STRANGER, payload_digest=""), signer=_signer(STRANGER)),
            "producer-unknown",
            "intake",
        ),
        (
            "key not listed for the producer",
            _raw(good, signer=_signer(STRANGER, TOOL)),
            "key-unknown",
            "intake",
        ),
        (
            "revoked key",
            _raw(good, signer=_signer("vector-tool-old", TOOL)),
            "key-revoked",
            "intake",
        ),
        (
            "key not yet valid",
            _raw(good, signer=_signer("vector-future", TOOL)),
            "key-not-yet-valid",
            "intake",
        ),
        (
            "expired key",
            _raw(good, signer=_signer("vector-expired", TOOL)),
            "key-expired",
            "intake",
        ),
        (
            "value altered after signing",
            _raw(good, after=_replace(b"req-op-vector-1", b"req-op-vector-2")),
            "signature-invalid",
            "intake",
        ),
        (
            "record id header altered after signing",
            _raw(good, after=_set_header(HEADER_RECORD_ID, "event:0")),
            "signature-invalid",
            "intake",
        ),
        (
            "moved to another key after signing",
            _raw(good, after=None, key="op-vector-1") | {"key": "op-vector-2"},
            "signature-invalid",
            "intake",
        ),
        (
            "envelope names another producer than the signer",
            _raw(replace(good, producer=WORKER, payload_digest=""), signer=_signer(TOOL)),
            "identity-mismatch",
            "intake",
        ),
        (
            "keyed by another id than the operation",
            _raw(good, key="op-other"),
            "key-mismatch",
            "intake",
        ),
        (
            "machine nobody pinned",
            _raw(replace(good, machine_name="no-such-machine", payload_digest="")),
            "machine-unknown",
            "intake",
        ),
        (
            "version not pinned",
            _raw(replace(good, machine_version="9.9.9", payload_digest="")),
            "machine-unpinned",
            "intake",
        ),
        (
            "scope outside the machine's applies_to",
            _raw(
                replace(
                    good,
                    scope=Scope(capability=CAPABILITY, tool="coupa", environment="test"),
                    payload_digest="",
                )
            ),
            "machine-not-applicable",
            "intake",
        ),
        (
            "opening event without scope",
            _raw(replace(good, scope=None, payload_digest="")),
            "scope-missing",
            "batch",
        ),
        (
            "opened by a tool without a grant for the tool named in scope",
            _raw(
                replace(
                    good,
                    scope=Scope(capability=CAPABILITY, tool="sap-ariba", environment="production"),
                    payload_digest="",
                )
            ),
            "role-not-permitted",
            "batch",
        ),
        (
            "opened by a producer without the tool role",
            _raw(replace(good, producer=WORKER, payload_digest="")),
            "role-not-permitted",
            "batch",
        ),
        *_v6_cases(good),
        *_call_context_cases(good),
    ]
    # Cases judged after other records of the same operation, in one batch: each
    # `preceded_by` record is accepted and decided first.
    opening = _raw(good)
    other_scope = Scope(capability=CAPABILITY, tool="coupa", environment="staging")
    sequenced: list[tuple[str, list[dict[str, Any]], dict[str, Any], str]] = [
        (
            "a later tool report with another scope than the operation's opening",
            [opening],
            _raw(
                replace(
                    good,
                    event_type="TOOL_FAILED",
                    event_id="evt-vector-0010",
                    scope=other_scope,
                    payload_digest="",
                )
            ),
            "opening-conflict",
        ),
        (
            "a later tool report that agrees with the opening",
            [opening],
            _raw(
                replace(
                    good, event_type="TOOL_FAILED", event_id="evt-vector-0011", payload_digest=""
                )
            ),
            "accepted",
        ),
    ]
    return {
        "topic": EVENTS_TOPIC,
        "at": AT.isoformat(),
        "max_record_bytes": MAX_RECORD_BYTES,
        "pinned_machines": ["procurement-request@1.0.0"],
        "roster": roster(),
        "description": "Each record (key as UTF-8 text, value as hex or null, headers in "
        "order) and the controller's verdict on it when it is the first record of a new "
        "operation: accepted, or the dead-letter reason code. stage says where the "
        "controller refuses it: intake (the record alone) or batch (the operation's "
        "stored state and the roster grants).",
        "cases": [
            *(
                {"name": name, "record": record, "verdict": verdict, "stage": stage}
                for name, record, verdict, stage in cases
            ),
            *(
                {
                    "name": name,
                    "preceded_by": before,
                    "record": record,
                    "verdict": verdict,
                    "stage": "batch",
                }
                for name, before, record, verdict in sequenced
            ),
        ],
    }


def _v6_cases(good: Event) -> list[tuple[str, dict[str, Any], str, str]]:
    """What envelope v6 added (`lineage.runtime`, `facts.arguments_digest`), its
    bounds, and the v5 writers the controller still reads."""
    assert good.facts is not None
    many = tuple(f"cred-{n}" for n in range(MAX_DELEGATED_CREDENTIALS + 1))
    return [
        (
            "arguments digest that is not sha256 and 64 hex digits",
            _raw(
                replace(
                    good,
                    facts=replace(good.facts, arguments_digest="sha256:ABC"),
                    payload_digest="",
                )
            ),
            "envelope-field-invalid",
            "intake",
        ),
        (
            "runtime with whitespace",
            _raw(
                replace(good, lineage=replace(good.lineage, runtime="runtime 3"), payload_digest="")
            ),
            "envelope-field-invalid",
            "intake",
        ),
        (
            f"{MAX_DELEGATED_CREDENTIALS + 1} delegated credentials, one over the bound",
            _raw(
                replace(
                    good,
                    lineage=replace(good.lineage, delegated_credentials=many),
                    payload_digest="",
                )
            ),
            "envelope-field-invalid",
            "intake",
        ),
        (
            "an event written with envelope schema v5",
            _signed_value(_avro_v5(good), good),
            "accepted",
            "intake",
        ),
    ]


def _avro_v5(event: Event) -> tuple[bytes, str]:
    """`event` written with `event_envelope.v5.avsc` (before `lineage.runtime` and
    `facts.arguments_digest`), as a v5 producer writes it; and that schema's fingerprint."""
    [v5] = [
        v for v in default_catalog().versions().values() if v.path.name == "event_envelope.v5.avsc"
    ]
    record = event_to_record(
        replace(
            event,
            lineage=replace(event.lineage, runtime=None),
            facts=None if event.facts is None else replace(event.facts, arguments_digest=None),
        )
    )
    del record["lineage"]["runtime"]
    if record["facts"] is not None:
        del record["facts"]["arguments_digest"]
    buffer = io.BytesIO()
    buffer.write(b"\xc3\x01" + v5.fingerprint)
    fastavro.schemaless_writer(buffer, v5.parsed, record)
    return buffer.getvalue(), v5.fingerprint_hex


def _signed_value(encoded: tuple[bytes, str], event: Event) -> dict[str, Any]:
    """A record holding `encoded` (a value and its writer's fingerprint) with the headers
    the client writes, signed by `event`'s producer."""
    value, fingerprint = encoded
    headers: list[tuple[str, bytes | None]] = [
        (CONTENT_TYPE, CONTENT_TYPE_AVRO.encode()),
        (HEADER_RECORD_ID, record_id("event", event.operation_id, event.event_id).encode()),
        (HEADER_SCHEMA, fingerprint.encode()),
    ]
    key = event.operation_id.encode()
    signed = _signer(event.producer).sign(EVENTS_TOPIC, key, value, headers)
    return {"key": event.operation_id, "value_hex": value.hex(), "headers": _headers_json(signed)}


def _call_context_cases(good: Event) -> list[tuple[str, dict[str, Any], str, str]]:
    """Openings and the proof of their affected agent: a tool whose grant names no
    agent needs the call context the agent's runtime signed; a context that proves
    nothing refuses the opening even from a tool whose grant would have proven it."""
    shared = replace(good, producer=SHARED_TOOL, payload_digest="")
    altered = _call_context().replace(
        '"issued_at":"2026-06-01T11:59:00Z"', '"issued_at":"2026-06-01T11:58:00Z"'
    )
    assert altered != _call_context()
    other_task = replace(good.lineage, task="task-8")
    return [
        (
            "opened by a tool whose grant names no agent, without a call context",
            _raw(shared),
            "agent-unproven",
            "batch",
        ),
        (
            "opened by that tool with the agent runtime's call context",
            _raw(shared, call_context=_call_context()),
            "accepted",
            "batch",
        ),
        (
            "call context issued for another operation",
            _raw(shared, call_context=_call_context("op-vector-2")),
            "call-context-invalid",
            "batch",
        ),
        (
            "call context naming another lineage than the event",
            _raw(shared, call_context=_call_context(lineage=other_task)),
            "call-context-invalid",
            "batch",
        ),
        (
            "call context expired",
            _raw(shared, call_context=_call_context(issued=AT - timedelta(minutes=30))),
            "call-context-invalid",
            "batch",
        ),
        (
            "call context issued after now, beyond the clock skew",
            _raw(shared, call_context=_call_context(issued=AT + timedelta(minutes=10))),
            "call-context-invalid",
            "batch",
        ),
        (
            "call context from a producer that is not orchestrator for the agent",
            _raw(shared, call_context=_call_context(issuer=WORKER)),
            "call-context-invalid",
            "batch",
        ),
        (
            "call context that is not JSON",
            _raw(shared, call_context="not json"),
            "call-context-invalid",
            "batch",
        ),
        (
            "call context signed with a key its issuer does not hold",
            _raw(shared, call_context=_call_context(key=STRANGER)),
            "key-unknown",
            "batch",
        ),
        (
            "call context altered after signing",
            _raw(shared, call_context=altered),
            "signature-invalid",
            "batch",
        ),
        (
            "a bad call context refuses even a tool whose grant names the agent",
            _raw(good, call_context=_call_context("op-vector-2")),
            "call-context-invalid",
            "batch",
        ),
    ]


def _payload_text_value(event: Event, text: str) -> bytes:
    record = event_to_record(event)
    record["payload"] = text
    return AvroSingleObjectCodec().encode(record, EVENT_ENVELOPE)


def _nested(depth: int) -> dict[str, Any]:
    """A payload whose deepest value (the number 1) is at `depth`: the payload object
    itself is at depth 0, and each value inside a container one deeper than it."""
    value: Any = 1
    for _ in range(depth):
        value = {"n": value}
    return value  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------


def generate() -> dict[str, str]:
    """Every vector file's name and its exact text."""
    documents: Mapping[str, dict[str, Any]] = {
        "keys.json": _keys(),
        "canonical-json.json": _canonical(),
        "ids.json": _ids(),
        "events.json": _events(),
        "commands.json": _commands(),
        "refusals.json": _refusals(),
    }
    return {
        name: json.dumps({"protocol": PROTOCOL, **doc}, indent=1, ensure_ascii=False) + "\n"
        for name, doc in documents.items()
    }


def write(folder: Path = VECTORS_DIR) -> list[str]:
    """Write every vector file into `folder`; returns the names that changed."""
    folder.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in generate().items():
        path = folder / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed


def stale(folder: Path = VECTORS_DIR) -> list[str]:
    """The vector files in `folder` that differ from what `generate` makes now."""
    found = []
    for name, text in generate().items():
        path = folder / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            found.append(name)
    return found


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        names = stale()
        if names:
            print(f"stale vectors: {', '.join(names)}; run python -m tests.support.vectors")
            sys.exit(1)
        sys.exit(0)
    for changed_name in write():
        print(f"wrote schemas/vectors/{changed_name}")
