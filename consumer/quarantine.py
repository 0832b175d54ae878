"""Crash quarantine across starts: a record that kills the controller cannot stop the group.

Every exception met while handling one record is already that record's dead letter
(`consumer.intake`, `consumer.batch`). What no `except` can catch (a segfault in a C
extension, the kernel's OOM killer, SIGKILL) leaves nothing in the batch transaction,
and without more the next start would replay the same batch and die the same way,
forever. So the ledger remembers what each start was working on
(`Ledger.record_attempts`, table `partition_attempts`, migration 0011):

1. After claiming a partition, before deciding its first batch there, the controller
   durably records "attempting offsets O..L" (`starts` = 1, or one more than the previous
   start's when that one attempted the same O and the stored offset has not moved).
   Once per claim, so a steady stream pays nothing.
2. When a claim finds that `quarantine_after_starts` starts in a row attempted O without
   committing past it, the crash is somewhere in O..L (the widest range those starts
   attempted), but a batch does not say which record. The controller then decides that
   range one record at a time, recording each record's attempt (`single`) before it.
3. A claim that finds a single-record attempt at its stored offset knows that start died
   on that very record (`record_starts` counts the starts in a row that did). Once
   `quarantine_after_starts` starts died on it alone, the record is dead-lettered as
   `record-quarantined` (its bytes on `recovery.dlq`, an audit record on the partition's
   intake chain, naming how many starts died) without being handled again, and the
   range goes on one record at a time. Past L the partition is batched again.

A killer record costs twice `quarantine_after_starts` deaths (six by default). Asking as
many deaths of the record alone as of the batch is what keeps unrelated deaths from
quarantining a good record: a process killed at random (an operator, a test, a node
drained) in the few milliseconds a record is decided alone is then retried, and dies on
it again only by chance, `quarantine_after_starts` times in a row. A false alarm would
not lose the record anyway: its bytes are on the dead-letter topic, to be replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from consumer.intake import RawRecord, Refusal, RefusalCode
from ledger import PartitionAttempt, PartitionClaim

__all__ = ["Watch", "quarantine_refusal", "watch_after_claim"]


@dataclass(frozen=True, slots=True)
class Watch:
    """What the controller must do on one claimed partition before it is batched as
    usual: record this start's attempt (`single` False: the first batch; True: every
    record up to `through`), and dead-letter the record at `quarantine` unhandled."""

    topic: str
    partition: int
    starts: int
    single: bool
    through: int | None = None
    quarantine: int | None = None
    # Starts that died without committing past the quarantined record, and how many of
    # them while deciding it alone.
    deaths: int = 0
    alone: int = 0
    # The offset the claim resumes at, and how many starts in a row died on it alone.
    at: int | None = None
    record_starts: int = 0

    def attempt(self, first: int, last: int) -> PartitionAttempt:
        """The attempt row to record before deciding offsets `first`..`last`."""
        through = max(last, self.through if self.through is not None else last)
        alone = 0
        if self.single:
            alone = self.record_starts + 1 if first == self.at else 1
        return PartitionAttempt(
            self.topic,
            self.partition,
            first,
            through,
            self.starts,
            self.single,
            record_starts=alone,
        )

    def quarantined(self) -> Watch:
        """This watch once its quarantined record is dead-lettered."""
        return replace(self, quarantine=None, deaths=0, alone=0)


def watch_after_claim(claim: PartitionClaim, after_starts: int) -> Watch:
    """What a claim's stored offset and the previous start's attempt row call for
    (module docstring): a first attempt, a batch retried, a range narrowed to single
    records, or a record to quarantine."""
    fresh = Watch(claim.topic, claim.partition, starts=1, single=False)
    last = claim.attempt
    if last is None:
        return fresh
    # Nothing stored yet: no start committed anything here, and this one resumes where
    # the last one did (the group's reset policy).
    at = claim.next_offset if claim.next_offset is not None else last.first_offset
    if not last.first_offset <= at <= last.last_offset:
        return fresh  # nothing attempted here, or a start committed past it since
    starts = last.starts + 1
    if last.single:
        here = last.record_starts if last.first_offset == at else 0
        doomed = here >= after_starts
        return Watch(
            claim.topic,
            claim.partition,
            starts,
            single=True,
            through=last.last_offset,
            quarantine=at if doomed else None,
            deaths=last.starts if doomed else 0,
            alone=here if doomed else 0,
            at=at,
            record_starts=here,
        )
    if last.first_offset != at:
        return fresh  # that start's batch committed; it died later, on other records
    single = last.starts >= after_starts
    return Watch(
        claim.topic, claim.partition, starts, single=single, through=last.last_offset, at=at
    )


def quarantine_refusal(record: RawRecord, deaths: int, alone: int) -> Refusal:
    """The dead-letter reason of a record the controller died on at `deaths` starts in a
    row, the last `alone` of them while deciding it alone."""
    return Refusal(
        RefusalCode.RECORD_QUARANTINED,
        f"record {record.coordinates}: {deaths} starts of the controller in a row died "
        f"without committing past it ({alone} of them while handling it alone), a crash no "
        "exception handler saw (a segfault, an out-of-memory kill, SIGKILL); quarantined "
        "unhandled so the partition goes on. Its bytes are on the dead-letter topic: find "
        "the cause in the controller's logs or the kernel's before replaying it",
    )
