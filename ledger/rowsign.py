"""The controller's signature on the outbox rows a commit writes, as the ledger sees it.

The ledger never holds the controller's key: the controller passes a `RowSigner` (in
practice `schemas.OutboxSigner`) with each batch, and every place that builds an outbox
row (`ledger.records`, `ledger.lineage_step`, `ledger.deadletters`) calls it over the
row's topic, key, record id, headers and payload text, and stores the headers it returns
(the signature added). The relay publishes them as they are (`docs/relay.md`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = ["RowSigner"]

RowSigner = Callable[[str, str, str, Mapping[str, str], str], Mapping[str, str]]
