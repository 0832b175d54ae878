"""Crash quarantine: what a claim's stored offset and the previous start's attempt call
for (`consumer.quarantine.watch_after_claim`)."""

from __future__ import annotations

from consumer.intake import RawRecord, RefusalCode
from consumer.quarantine import quarantine_refusal, watch_after_claim
from ledger import PartitionAttempt, PartitionClaim

TOPIC = "events"


def claim(next_offset: int | None, attempt: PartitionAttempt | None) -> PartitionClaim:
    return PartitionClaim(TOPIC, 0, 7, next_offset, attempt)


def tried(
    first: int, last: int, starts: int, *, single: bool = False, alone: int = 0
) -> PartitionAttempt:
    return PartitionAttempt(TOPIC, 0, first, last, starts, single, record_starts=alone)


def test_a_partition_never_attempted_is_batched_and_its_first_attempt_recorded() -> None:
    watch = watch_after_claim(claim(40, None), 3)
    assert (watch.starts, watch.single, watch.quarantine) == (1, False, None)
    assert watch.attempt(40, 90) == tried(40, 90, 1)


def test_a_start_that_committed_past_its_attempt_resets_the_count() -> None:
    watch = watch_after_claim(claim(91, tried(40, 90, 2)), 3)
    assert (watch.starts, watch.single) == (1, False)


def test_a_batch_that_died_once_is_retried_whole_and_counted() -> None:
    watch = watch_after_claim(claim(40, tried(40, 90, 1)), 3)
    assert (watch.starts, watch.single) == (2, False)
    # The range widens to whatever the new batch reaches, never shrinks.
    assert watch.attempt(40, 60) == tried(40, 90, 2)
    assert watch.attempt(40, 120) == tried(40, 120, 2)


def test_after_the_threshold_the_range_is_decided_one_record_at_a_time() -> None:
    watch = watch_after_claim(claim(40, tried(40, 90, 3)), 3)
    assert (watch.starts, watch.single, watch.through, watch.quarantine) == (4, True, 90, None)
    assert watch.attempt(40, 90) == tried(40, 90, 4, single=True, alone=1)
    assert watch.attempt(41, 90) == tried(41, 90, 4, single=True, alone=1)


def test_a_record_that_starts_died_on_alone_is_retried_then_quarantined() -> None:
    # One death on it alone may be a coincidence (a kill at that moment): retried.
    once = watch_after_claim(claim(57, tried(57, 90, 4, single=True, alone=1)), 3)
    assert (once.single, once.quarantine, once.record_starts) == (True, None, 1)
    assert once.attempt(57, 90) == tried(57, 90, 5, single=True, alone=2)
    assert once.attempt(58, 90) == tried(58, 90, 5, single=True, alone=1)
    # As many deaths on it alone as the threshold: quarantined.
    watch = watch_after_claim(claim(57, tried(57, 90, 6, single=True, alone=3)), 3)
    assert (watch.single, watch.through, watch.quarantine) == (True, 90, 57)
    assert (watch.deaths, watch.alone) == (6, 3)
    after = watch.quarantined()
    assert (after.quarantine, after.single, after.through) == (None, True, 90)


def test_a_start_that_died_later_in_the_range_keeps_it_single_without_quarantine() -> None:
    # It committed 57 alone, then died after recording nothing for 58 (or on the way).
    watch = watch_after_claim(claim(58, tried(57, 90, 4, single=True, alone=3)), 3)
    assert (watch.single, watch.quarantine, watch.starts, watch.record_starts) == (
        True,
        None,
        5,
        0,
    )


def test_nothing_stored_yet_resumes_where_the_last_start_did() -> None:
    assert watch_after_claim(claim(None, tried(0, 30, 3)), 3).single
    doomed = tried(0, 30, 6, single=True, alone=3)
    assert watch_after_claim(claim(None, doomed), 3).quarantine == 0


def test_the_threshold_is_configurable() -> None:
    assert watch_after_claim(claim(40, tried(40, 90, 1)), 1).single
    assert not watch_after_claim(claim(40, tried(40, 90, 4)), 5).single


def test_the_quarantine_reason_names_the_record_and_the_deaths() -> None:
    record = RawRecord(TOPIC, 2, 57, b"op-1", b"x")
    refusal = quarantine_refusal(record, 6, 3)
    assert refusal.code == RefusalCode.RECORD_QUARANTINED == "record-quarantined"
    assert refusal.reason.startswith(f"record {TOPIC}[2]@57: 6 starts of the controller")
    assert "(3 of them while handling it alone)" in refusal.reason
