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
   on that very record: the record is dead-lettered as `record-quarantined` (its bytes
   on `recovery.dlq`, an audit record on the partition's intake chain, naming how many
   starts died) without being handled again, and the range goes on one record at a time.
   Past L the partition is batched again.

The cost of a false alarm: a start that recorded a single-record attempt and then lost
the partition without committing it for a reason other than that record (a database
outage followed by a rebalance, or an operator's SIGKILL at that moment) gets the record
quarantined, though never lost: its bytes are on the dead-letter topic to be replayed.
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
    # Starts that died without committing past the quarantined record.
    deaths: int = 0

    def attempt(self, first: int, last: int) -> PartitionAttempt:
        """The attempt row to record before deciding offsets `first`..`last`."""
        through = max(last, self.through if self.through is not None else last)
        return PartitionAttempt(
            self.topic, self.partition, first, through, self.starts, self.single
        )

    def quarantined(self) -> Watch:
        """This watch once its quarantined record is dead-lettered."""
        return replace(self, quarantine=None, deaths=0)


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
        quarantine = at if last.first_offset == at else None
        return Watch(
            claim.topic,
            claim.partition,
            starts,
            single=True,
            through=last.last_offset,
            quarantine=quarantine,
            deaths=last.starts if quarantine is not None else 0,
        )
    if last.first_offset != at:
        return fresh  # that start's batch committed; it died later, on other records
    single = last.starts >= after_starts
    return Watch(claim.topic, claim.partition, starts, single=single, through=last.last_offset)


def quarantine_refusal(record: RawRecord, deaths: int) -> Refusal:
    """The dead-letter reason of a record the controller died on at `deaths` starts."""
    return Refusal(
        RefusalCode.RECORD_QUARANTINED,
        f"record {record.coordinates}: {deaths} starts of the controller in a row died "
        "without committing past it (the last while handling it alone), a crash no "
        "exception handler saw (a segfault, an out-of-memory kill, SIGKILL); quarantined "
        "unhandled so the partition goes on. Its bytes are on the dead-letter topic: find "
        "the cause in the controller's logs or the kernel's before replaying it",
    )
