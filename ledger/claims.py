"""Idempotency-key claims in the commit, shared by both ledgers (`machines.claims`).

The controller reads the stored owners of the keys a batch's new operations declare
before deciding (`Ledger.key_claims`), so a second operation claiming a key is decided
as a duplicate or a conflicting reuse. Two batches on different partitions may both
read "no owner" for the same key and decide their operations as owners; the claims
table's primary key (principal, capability, key) lets exactly one of those commits
write its claim. The other finds the key owned by another operation when it writes
(`check_claims`) and is refused with `VersionConflict`, so it is decided again, now on
the stored owner: the check is exact whichever controller owns which partition.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.errors import VersionConflict
from ledger.records import BatchRows
from machines import ClaimKey, KeyClaim

__all__ = ["check_claims", "claim_message"]


def claim_message(key: ClaimKey, mine: str, owner: str) -> str:
    """The `VersionConflict` message when another operation claimed a key first."""
    return (
        f"operation {mine}: idempotency key {key.idempotency_key!r} of principal "
        f"{key.principal} for {key.capability} was claimed by operation {owner} after the "
        "batch was decided; reload and decide again (it is a duplicate or a conflicting "
        "reuse of that key)"
    )


def check_claims(plan: BatchRows, stored: Mapping[ClaimKey, KeyClaim]) -> None:
    """Refuse the batch (`VersionConflict`) when a key one of its new operations claims
    is already owned by another operation (`stored`: the owners as the commit sees them
    under its locks), or claimed twice within the batch."""
    seen: dict[ClaimKey, str] = {}
    for row in plan.claims:
        owner = stored.get(row.key)
        first = seen.setdefault(row.key, row.claim.operation_id)
        if owner is not None and owner.operation_id != row.claim.operation_id:
            raise VersionConflict(
                claim_message(row.key, row.claim.operation_id, owner.operation_id)
            )
        if first != row.claim.operation_id:
            raise VersionConflict(claim_message(row.key, row.claim.operation_id, first))
