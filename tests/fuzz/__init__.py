"""Fuzzing the controller's whole pure path: raw record bytes through intake, the batch
fold and row building, committed to the in-memory ledger (`ledger.MemoryLedger`).

The property: nothing raises, and each record of a batch is decided or dead-lettered
exactly once. `python -m tests.fuzz --records 100000` runs it on demand and prints the
counts; `tests/unit/consumer/test_fuzz.py` runs a CI-sized Hypothesis version.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from consumer import DecidedBatch, Intake, RawRecord, Refusal, decide_batch
from consumer.batch import (
    claim_keys,
    decide_on_openers,
    openings,
    operation_ids,
    positions_for,
    unbuildable,
)
from consumer.controller import _named_record
from consumer.intake import IntakeResult
from ledger import EventIdReused, LedgerError, MemoryLedger, NonceReused
from machines import ClaimKey
from schemas import (
    CONTENT_TYPE,
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    EVENT_ENVELOPE,
    AvroSingleObjectCodec,
    event_to_record,
)
from tests.support.producers import TEST_PRODUCERS, signer
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import CONTROLLER, GROUP, T0, TOPIC, event, pinned

MAX_RECORD_BYTES = 65536
EVENT_TYPES = ("TOOL_TIMEOUT", "TOOL_STARTED", "EVIDENCE_RECEIVED", "HUMAN_APPROVED", "ODD")
ODD_TEXT = ("", " ", "\u0000", "\ud7ff\ufeff", "e\u0301", "\U0001f4a5" * 40, "a" * 5000, "\u202e")
ODD_TIMES: tuple[Any, ...] = (
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "2026-11-30T12:00:00",
    "2026-13-40T99:99:99Z",
    "",
    -1,
    2**63,
    -(2**63),
    1e308,
    None,
)
WRONG_TYPES: tuple[Any, ...] = (None, 0, -1, 2**70, 1.5, True, "", [], {}, ["x"], {"a": 1})


def _base(rng: random.Random) -> dict[str, Any]:
    op = f"op-{rng.randrange(6)}"
    ev = event(rng.choice(EVENT_TYPES[:3]), op, event_id=f"{op}-{rng.randrange(10**6)}")
    data = event_to_record(ev)
    data["event_time"] = (T0 + timedelta(seconds=rng.randrange(3600))).isoformat()
    return data


def _set_time(data: dict[str, Any], rng: random.Random) -> None:
    data["event_time"] = rng.choice(ODD_TIMES)


def _odd_text(data: dict[str, Any], rng: random.Random) -> None:
    data[rng.choice(["event_id", "operation_id", "producer", "evidence_ref", "event_type"])] = (
        rng.choice(ODD_TEXT)
    )


def _drop(data: dict[str, Any], rng: random.Random) -> None:
    data.pop(rng.choice(sorted(data)), None)


def _extra(data: dict[str, Any], rng: random.Random) -> None:
    data[rng.choice(["extra", "x" * 300, "lineage2"])] = rng.choice(WRONG_TYPES)


def _wrong_type(data: dict[str, Any], rng: random.Random) -> None:
    data[rng.choice(sorted(data))] = rng.choice(WRONG_TYPES)


def _lineage(data: dict[str, Any], rng: random.Random) -> None:
    lineage = dict(data.get("lineage") or {})
    op = data.get("operation_id")
    other = f"op-{rng.randrange(6)}"
    lineage["parent_operation"] = rng.choice([op, other])
    lineage["origin_operation"] = rng.choice([op, other, None])
    lineage["agent"] = rng.choice(["agent-1", "agent-2", *ODD_TEXT[:3]])
    data["lineage"] = lineage


def _oversized(data: dict[str, Any], rng: random.Random) -> None:
    data["producer"] = "p" * rng.choice([MAX_RECORD_BYTES - 600, MAX_RECORD_BYTES, 10**6])


MUTATIONS: tuple[Callable[[dict[str, Any], random.Random], None], ...] = (
    _set_time,
    _odd_text,
    _drop,
    _extra,
    _wrong_type,
    _lineage,
    _oversized,
)


def _encode(data: dict[str, Any], rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.5:
        try:
            return AvroSingleObjectCodec().encode(data, EVENT_ENVELOPE), CONTENT_TYPE_AVRO
        except Exception:  # the mutation has no Avro form: send it as JSON
            pass
    return json.dumps(data, default=str).encode("utf-8", "surrogatepass"), CONTENT_TYPE_JSON


def generated(rng: random.Random, offset: int) -> tuple[str, RawRecord]:
    """One fuzzed record at `offset` and the kind of input it is."""
    roll = rng.random()
    headers: tuple[tuple[str, bytes | None], ...]
    if roll < 0.1:
        size = rng.choice([0, 1, 5, 64, 4096])
        value: bytes | None = rng.randbytes(size) if size or rng.random() < 0.5 else None
        ctype = rng.choice([CONTENT_TYPE_AVRO, CONTENT_TYPE_JSON, "text/x-odd"])
        headers = ((CONTENT_TYPE, ctype.encode()),)
        return "bytes", RawRecord(TOPIC, 0, offset, rng.randbytes(4), value, headers, 0)
    data = _base(rng)
    kind = "valid"
    if roll > 0.25:
        mutate = rng.choice(MUTATIONS)
        mutate(data, rng)
        kind = mutate.__name__.lstrip("_")
    value, ctype = _encode(data, rng)
    if kind != "valid" and rng.random() < 0.1:
        cut = rng.randrange(len(value) + 1)
        value, kind = value[:cut] + rng.randbytes(rng.randrange(4)), "truncated"
    key = str(data.get("operation_id", "")).encode("utf-8", "surrogatepass")
    headers = ((CONTENT_TYPE, ctype.encode()),)
    # Signed as its producer when that is a test producer, so valid events get past
    # authentication and on to the decision (a bad producer is refused, as it should).
    named = str(data.get("producer", ""))
    by = signer(named if named in TEST_PRODUCERS else "tool-1")
    signed = tuple(by.sign(TOPIC, key, value, headers))
    return kind, RawRecord(TOPIC, 0, offset, key, value, signed, 0)


@dataclass
class Counts:
    """What a fuzz run saw."""

    records: int = 0
    batches: int = 0
    decided: int = 0
    dead_lettered: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)


class Fuzzer:
    """Feeds batches to intake, `decide_batch` and a `MemoryLedger`, checking the
    property on each."""

    def __init__(self) -> None:
        machines, self.rules = pinned()
        self.intake = Intake(machines, roster=producer_roster(), max_record_bytes=MAX_RECORD_BYTES)
        self.ledger = MemoryLedger()
        claims = self.ledger.claim(GROUP, TOPIC, [0], CONTROLLER)
        self.epochs = {(c.topic, c.partition): c.epoch for c in claims}
        self.counts = Counts()

    def batch(self, records: Sequence[RawRecord]) -> None:
        """Run one batch; a violation or an exception is recorded in `counts.crashes`."""
        self.counts.batches += 1
        self.counts.records += len(records)
        try:
            self._batch(records)
        except Exception as exc:
            self.counts.crashes.append(f"{type(exc).__name__}: {exc}"[:300])

    def _batch(self, records: Sequence[RawRecord]) -> None:
        outcomes = [self.intake.examine(r) for r in records]
        excluded: dict[str, Refusal] = {}
        # Plan and commit as the controller does: a reuse the ledger names, or rows one
        # record cannot build, dead-letter that record on the next plan.
        for _ in range(len(records) + 2):
            planned = self._plan(records, outcomes, excluded)
            try:
                self.ledger.commit(planned.batch)
            except (EventIdReused, NonceReused) as exc:
                found = _named_record(exc, planned)
            except LedgerError:
                raise
            except Exception as exc:
                found = unbuildable(planned, exc)
                if found is None:
                    raise
            else:
                self._count(planned)
                return
            if found is None:
                raise AssertionError("the ledger refused the batch without naming a record")
            excluded[found[0]] = found[1]
        raise AssertionError("the batch was planned more times than it has records")

    def _plan(
        self,
        records: Sequence[RawRecord],
        outcomes: list[IntakeResult],
        excluded: dict[str, Refusal],
    ) -> DecidedBatch:
        views = self.ledger.load_views(operation_ids(outcomes))

        def decide(read: Mapping[str, str | None], keys: Sequence[ClaimKey]) -> DecidedBatch:
            return decide_batch(
                outcomes,
                views,
                self.rules,
                group=GROUP,
                controller=CONTROLLER,
                positions=positions_for(records, self.epochs),
                now=T0 + timedelta(hours=2),
                arrivals=self.ledger.arrival_lineage(read),
                claims=self.ledger.key_claims(keys),
                excluded=excluded,
            )

        planned = decide_on_openers(
            decide, openings(outcomes, views, excluded), claim_keys(outcomes, views)
        )
        seen = Counter(e.source.offset for e in planned.batch.entries if e.source is not None)
        seen.update(r.offset for r, _ in planned.refused)
        # A forged decision, or one under another correlation id, is recorded *and*
        # dead-lettered: one record, both ways.
        both = {"forged-signature", "correlation-mismatch"}
        forged = {r.offset for r, f in planned.refused if f.code in both}
        twice = [o for o, n in seen.items() if n != 1 and not (n == 2 and o in forged)]
        missing = [r.offset for r in records if r.offset not in seen]
        if twice or missing:
            raise AssertionError(f"offsets decided twice {twice}, neither {missing}")
        return planned

    def _count(self, planned: DecidedBatch) -> None:
        self.counts.decided += len(planned.batch.entries)
        self.counts.dead_lettered += len(planned.batch.dead_letters)
        self.counts.reasons.update(d.reason_code for d in planned.batch.dead_letters)


def run(records: int, *, seed: int = 0, batch_size: int = 50) -> Counts:
    """Fuzz `records` generated records in batches of `batch_size`."""
    rng = random.Random(seed)
    fuzzer = Fuzzer()
    offset = 0
    while offset < records:
        batch = []
        for _ in range(min(batch_size, records - offset)):
            kind, record = generated(rng, offset)
            fuzzer.counts.kinds[kind] += 1
            batch.append(record)
            offset += 1
        fuzzer.batch(batch)
    return fuzzer.counts
