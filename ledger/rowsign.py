"""The controller's signature on the outbox rows a commit writes, as the ledger sees it.

The ledger never holds the controller's key: the controller passes a `RowSigner` (in
practice `schemas.OutboxSigner`) with each batch, and every place that builds an outbox
row (`ledger.records`, `ledger.lineage_step`, `ledger.deadletters`) calls it over the
row's topic, key, record id, headers and payload text. It returns a `schemas.SignedRow`:
the headers to store (the signature and the stream's headers added) and the exact value
bytes it signed, which the ledger stores with the row (outbox column `value`, migration
0012) so that the relay publishes them as they are (`docs/relay.md`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from schemas import SignedRow

__all__ = ["RowSigner", "SignedRow"]


class RowSigner(Protocol):
    """Signs an outbox row as the controller whose roster id is `producer`; what the
    ledger writes in the controller's name (a cascade event's `producer`) names that id."""

    @property
    def producer(self) -> str:
        """The controller's producer id in the roster."""
        ...

    def __call__(
        self, topic: str, key: str, record_id: str, headers: Mapping[str, str], payload_json: str
    ) -> SignedRow:
        """The row's value bytes and headers, signed."""
        ...
