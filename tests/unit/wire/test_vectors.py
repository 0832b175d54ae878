"""Our own code against the wire protocol's committed test vectors (`schemas/vectors/`,
docs/wire-protocol.md): what any client, in any language, checks itself against, the
Python side is held to as well. And the committed files must be what the generator
(`tests/support/vectors.py`) makes now, so a change of encoding cannot slip past them."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Message

from consumer import Accepted, Intake, RawRecord, decide_batch
from consumer.batch import operation_ids, positions_for
from ledger import MemoryLedger
from machines import (
    Policy,
    Roster,
    canonical_json,
    ed25519_verify,
    issue_call_context,
    key_id,
    public_key_bytes,
    public_key_text,
    signing_payload,
)
from machines.call_context import CALL_CONTEXT_DOMAIN
from producers import CapabilityWorker, ExecutionStore
from producers.worker import WorkerStats
from schemas import (
    HEADER_CALL_CONTEXT,
    CapabilityCommand,
    TopicNames,
    WireDecoder,
    default_catalog,
    header_value,
    rabin_fingerprint,
    record_id,
    record_signing_message,
    record_to_event,
    verify_record,
)
from tests.support.vectors import VECTORS_DIR, stale, vector_key
from tests.unit.consumer.support import pinned

Header = tuple[str, bytes | None]


@cache
def vectors(name: str) -> dict[str, Any]:
    return json.loads((VECTORS_DIR / name).read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def cases(name: str) -> list[dict[str, Any]]:
    return vectors(name)["cases"]  # type: ignore[no-any-return]


def headers_of(raw: list[list[str | None]]) -> list[Header]:
    return [(str(k), None if v is None else v.encode("utf-8")) for k, v in raw]


def at(name: str) -> datetime:
    return datetime.fromisoformat(vectors(name)["at"])


def test_the_committed_vectors_are_what_the_generator_makes_now() -> None:
    assert stale() == [], "run `python -m tests.support.vectors` and commit schemas/vectors"


@pytest.mark.parametrize("case", cases("canonical-json.json"), ids=lambda c: c["name"])
def test_canonical_json_writes_each_vector_exactly(case: dict[str, Any]) -> None:
    written = canonical_json(json.loads(case["input"]))
    assert written.hex() == case["canonical_hex"]
    assert written.decode("utf-8") == case["canonical"]


def test_fixed_keys_have_the_listed_public_keys_and_ids() -> None:

    for entry in vectors("keys.json")["keys"]:
        private = vector_key(entry["name"])
        assert public_key_text(private.public_key()) == entry["public_key"]
        assert key_id(private.public_key()) == entry["key_id"]


def test_record_ids_partitions_and_schema_fingerprints_match() -> None:
    ids = vectors("ids.json")
    for case in ids["record_ids"]:
        assert record_id(case["kind"], *case["parts"]) == case["record_id"]
    for case in ids["partitions"]:
        crc = zlib.crc32(case["key"].encode("utf-8"))
        assert crc == case["crc32"]
        assert {str(n): crc % int(n) for n in case["partition"]} == case["partition"]
    shipped = {v.path.name: v for v in default_catalog().versions().values()}
    assert {s["file"] for s in ids["schemas"]} == set(shipped)
    for schema in ids["schemas"]:
        version = shipped[schema["file"]]
        assert version.canonical_form == schema["parsing_canonical_form"]
        assert version.fingerprint_hex == schema["fingerprint_hex"]
    for case in ids["rabin"]:
        assert rabin_fingerprint(case["input"]).hex() == case["fingerprint_le_hex"]


def _roster(name: str) -> Roster:
    return Roster.model_validate(vectors(name)["roster"])


@pytest.mark.parametrize("case", cases("events.json"), ids=lambda c: c["name"])
@pytest.mark.parametrize("encoding", ["avro", "json"])
def test_each_event_decodes_digests_and_verifies_as_the_vector_says(
    case: dict[str, Any], encoding: str
) -> None:
    wire = case[encoding]
    value = bytes.fromhex(wire["value_hex"])
    headers = headers_of(wire["headers"])
    content_type = dict(headers)["content-type"]
    assert content_type is not None
    _, record = WireDecoder().decode(value, content_type.decode())
    event = record_to_event(record)
    assert canonical_json(event.content()).decode("utf-8") == case["content_canonical"]
    assert event.payload_digest == case["payload_digest"]
    assert event.to_dict() == case["envelope"] | {"payload_digest": case["payload_digest"]}
    key = case["key"].encode("utf-8")
    message = record_signing_message(
        case["topic"], key, value, headers[:-3], case["producer"], case["key_id"]
    )
    assert message.decode("utf-8") == wire["signing_message"]
    entry = verify_record(
        _roster("refusals.json"), case["topic"], key, value, headers, at=at("refusals.json")
    )
    assert entry.id == case["producer"]
    decision = event.human_decision
    if decision is not None:
        assert signing_payload(decision).decode("utf-8") == case["human_decision_signing_message"]
        public = next(
            k["public_key"] for k in vectors("keys.json")["keys"] if k["name"] == decision.approver
        )
        signature = base64.b64decode(decision.signature)
        assert ed25519_verify(public_key_bytes(public), signature, signing_payload(decision))
    forwarded = case.get("call_context")
    if forwarded is not None:
        # The tool forwards the runtime's context, unsigned by the record's signature.
        assert header_value(headers, HEADER_CALL_CONTEXT) == forwarded["header"]
        context = forwarded["context"]
        assert (context["operation_id"], context["lineage"]) == (
            event.operation_id,
            event.lineage.to_dict(),
        )
        message = CALL_CONTEXT_DOMAIN + canonical_json(context)
        assert message.decode("utf-8") == forwarded["signing_message"]
        issuer = vector_key(context["issuer"])
        assert key_id(issuer.public_key()) == context["key_id"]
        raw = public_key_bytes(public_key_text(issuer.public_key()))
        assert ed25519_verify(raw, base64.b64decode(forwarded["signature"]), message)
        moment = datetime.fromisoformat(context["issued_at"])
        lifetime = datetime.fromisoformat(context["expires_at"]) - moment
        reissued = issue_call_context(
            context["issuer"],
            issuer,
            event.operation_id,
            event.lineage,
            now=moment,
            lifetime=lifetime,
        )
        assert reissued == forwarded["header"]


class _Reports:
    """Stands in for the worker's `RecoveryClient`: records what it would publish."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.publisher = SimpleNamespace(publish=self.events.append, topics=TopicNames())

    def action_result(
        self, command: CapabilityCommand, succeeded: bool, *_a: Any, **kw: Any
    ) -> Any:
        return SimpleNamespace(command=command, succeeded=succeeded, **kw)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[CapabilityWorker, list[str]]]:
    executed: list[str] = []

    def handler(command: CapabilityCommand) -> None:
        executed.append(command.command_id)

    store = ExecutionStore(tmp_path / "store.sqlite")
    capabilities = ("procurement.create-request", "procurement.verify-request")
    built = CapabilityWorker(
        "unused",
        "vectors",
        _Reports(),  # type: ignore[arg-type]
        dict.fromkeys(capabilities, handler),
        topics=TopicNames(),
        roster=_roster("commands.json"),
        store=store,
        clock=lambda: at("commands.json"),
    )
    yield built, executed
    store.close()


def _verdict(stats: WorkerStats, executed: list[str]) -> str:
    if stats.refused:
        [(code, _)] = stats.refused.items()
        return code
    if stats.expired:
        return "deadline-expired"
    if stats.drills:
        return "drill"
    assert executed, stats
    return "execute"


@pytest.mark.parametrize("case", cases("commands.json"), ids=lambda c: c["name"])
def test_the_worker_reaches_each_command_verdict(
    case: dict[str, Any], worker: tuple[CapabilityWorker, list[str]]
) -> None:
    capability_worker, executed = worker
    record = case["record"]
    message = Message(
        topic=vectors("commands.json")["topic"],
        partition=0,
        offset=7,
        key=record["key"].encode("utf-8"),
        value=bytes.fromhex(record["value_hex"]),
        headers=headers_of(record["headers"]),
    )
    stats = WorkerStats()
    capability_worker._handle(message, stats, [])
    assert _verdict(stats, executed) == case["verdict"]
    if "command" in case:
        _, decoded = WireDecoder().decode(bytes.fromhex(record["value_hex"]), None)
        command = CapabilityCommand.from_record(decoded)
        expected = dict(case["command"])
        for name in ("issued_at", "deadline"):
            text = expected.pop(name)
            assert getattr(command, name) == (
                None if text is None else datetime.fromisoformat(text)
            )
        assert {
            k: v for k, v in command.to_record().items() if k not in ("issued_at", "deadline")
        } == expected


def _raw(record: dict[str, Any], offset: int) -> RawRecord:
    value = record["value_hex"]
    return RawRecord(
        topic=vectors("refusals.json")["topic"],
        partition=0,
        offset=offset,
        key=record["key"].encode("utf-8"),
        value=None if value is None else bytes.fromhex(value),
        headers=tuple(headers_of(record["headers"])),
        timestamp_ms=1_780_000_000_000,
    )


@pytest.mark.parametrize("case", cases("refusals.json"), ids=lambda c: c["name"])
def test_the_controller_reaches_each_intake_verdict(case: dict[str, Any]) -> None:
    refusals = vectors("refusals.json")
    machines, rules = pinned()
    wanted = {ref: machines[ref] for ref in refusals["pinned_machines"]}
    intake = Intake(
        wanted,
        roster=_roster("refusals.json"),
        max_record_bytes=refusals["max_record_bytes"],
        clock=lambda: at("refusals.json"),
    )
    # The records that precede it on its operation, then the record judged, in one batch.
    raws = [_raw(r, n) for n, r in enumerate([*case.get("preceded_by", []), case["record"]])]
    results = [intake.examine(raw) for raw in raws]
    result = results[-1]
    if case["stage"] == "intake":
        got = "accepted" if isinstance(result, Accepted) else result.refusal.code
        assert got == case["verdict"], getattr(result, "refusal", None)
        return
    assert all(isinstance(r, Accepted) for r in results), [
        getattr(r, "refusal", None) for r in results
    ]
    ledger = MemoryLedger()
    policy = Policy(id="vectors", producers=_roster("refusals.json").producers)
    epochs = {(c.topic, c.partition): c.epoch for c in ledger.claim("g", raws[0].topic, [0], "me")}
    planned = decide_batch(
        results,
        ledger.load_views(operation_ids(results)),
        type(rules)(policy=policy, registry=rules.registry),
        group="g",
        controller="vectors",
        positions=positions_for(raws, epochs),
        now=at("refusals.json") + timedelta(seconds=1),
    )
    wanted = [] if case["verdict"] == "accepted" else [case["verdict"]]
    assert [d.reason_code for d in planned.batch.dead_letters] == wanted, [
        d.reason for d in planned.batch.dead_letters
    ]
    decided = [d.event_id for d in planned.decisions]
    assert (result.event.event_id in decided) == (not wanted), decided
