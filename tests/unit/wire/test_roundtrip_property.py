"""Any valid event survives both encodings unchanged, digest included."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from machines.event import (
    CheckpointReport,
    ClassifierOutput,
    Event,
    EvidencePayload,
    HumanDecision,
    Lineage,
)
from schemas import (
    CONTENT_TYPE_JSON,
    EVENT_ENVELOPE,
    WireDecoder,
    event_to_json,
    event_to_record,
    record_to_event,
)

DECODER = WireDecoder()

text = st.text(min_size=1, max_size=20)
maybe_text = st.none() | text
# The envelope's identifiers are tokens (SPEC 6.2, `machines.parse_event`): non-empty,
# bounded, no whitespace or control characters.
ids = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=20
).filter(lambda s: not any(c.isspace() for c in s))
maybe_id = st.none() | ids
utc_times = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
event_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2199, 12, 31), timezones=st.just(UTC)
)
lineages = st.builds(
    Lineage,
    agent=ids,
    task=ids,
    initiating_principal=ids,
    origin_operation=maybe_id,
    parent_operation=maybe_id,
    delegated_credentials=st.lists(text, max_size=3).map(tuple),
    runtime=maybe_id,
)
checkpoints = st.builds(
    CheckpointReport,
    checkpoint_id=text,
    saved_at=utc_times,
    reference=text,
    validated=st.booleans(),
    validator=maybe_text,
    validated_machine_digest=maybe_text,
    validated_policy_digest=maybe_text,
    valid_until=st.none() | utc_times,
)
evidence = st.builds(
    EvidencePayload,
    outcome=st.sampled_from([None, "applied", "not_applied", "unknown"]),
    verifier=maybe_text,
    reference=maybe_text,
    checkpoint=st.none() | checkpoints,
    ancestor_operation=maybe_text,
)
decisions = st.builds(
    HumanDecision,
    approver=text,
    operation_id=text,
    state=text,
    transition=text,
    machine_digest=text,
    expires_at=utc_times,
    nonce=text,
    decision=st.sampled_from(["approved", "rejected"]),
    signature=st.text(max_size=20),
)
classifiers = st.builds(
    ClassifierOutput,
    identity=text,
    version=text,
    question=text,
    probabilities=st.dictionaries(text, st.floats(0, 1), max_size=3),
    candidate_event=maybe_text,
)
events = st.builds(
    Event,
    event_type=st.from_regex(r"[A-Z][A-Z_]{0,20}", fullmatch=True),
    event_id=ids,
    operation_id=ids,
    correlation_id=ids,
    machine_name=ids,
    machine_version=ids,
    event_time=event_times,
    evidence_ref=ids,
    producer=ids,
    lineage=lineages,
    evidence=st.none() | evidence,
    human_decision=st.none() | decisions,
    classifier=st.none() | classifiers,
    causation=maybe_id,
)


@settings(max_examples=150, deadline=None)
@given(event=events)
def test_every_valid_event_round_trips_through_avro_and_json(event: Event) -> None:
    avro = DECODER.avro.encode(event_to_record(event), EVENT_ENVELOPE)
    assert record_to_event(DECODER.decode(avro, None)[1]) == event
    data = DECODER.json.encode(event_to_json(event), EVENT_ENVELOPE)
    assert record_to_event(DECODER.decode(data, CONTENT_TYPE_JSON)[1]) == event
