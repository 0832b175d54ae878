"""Linking and containment committed at the same moment by two writers on PostgreSQL:
whichever wins the row locks, an operation opened below a descendant of a root being
contained ends up held by the root and is signalled exactly once (by the cascade or on
arrival), never missed. The batch that commits second was decided on a lineage the
first moved: it may be refused (`VersionConflict`) and commits when decided again."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ledger import Batch, PostgresLedger, VersionConflict
from machines.event import parse_event
from tests.unit.ledger.ledger_support import GROUP, TOPIC, decide_batch, feed
from tests.unit.ledger.lineage_contract import tree_event

pytestmark = pytest.mark.integration
ROUNDS = 12


@pytest.fixture
def ledgers(database_url: str) -> Iterator[tuple[PostgresLedger, PostgresLedger]]:
    first, second = PostgresLedger(database_url, max_size=2), PostgresLedger(database_url)
    yield first, second
    first.close()
    second.close()


def _commit_together(pairs: list[tuple[PostgresLedger, Batch]]) -> list[BaseException]:
    barrier = threading.Barrier(len(pairs))
    errors: list[BaseException] = []

    def run(ledger: PostgresLedger, batch: Batch) -> None:
        barrier.wait()
        try:
            ledger.commit(batch)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=pair) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return errors


def test_a_grandchild_opened_while_its_root_is_contained_is_signalled_exactly_once(
    ledgers: tuple[PostgresLedger, PostgresLedger],
) -> None:
    one, two = ledgers
    claims = one.claim(GROUP, TOPIC, [0, 1, 2], "controller-a")
    epochs = {c.partition: c.epoch for c in claims}
    for n in range(ROUNDS):
        root, mid, leaf = f"r{n}", f"r{n}m", f"r{n}m{n}"
        feed(one, [tree_event(mid, 0, "STEP_FAILED", parent=root)], epoch=epochs[0], first_offset=n)
        contained = [tree_event(root, 0, "AUTHORIZATION_DENIED")]
        late = [tree_event(leaf, 0, "STEP_FAILED", parent=mid)]
        contain = decide_batch(one, contained, epoch=epochs[1], partition=1, first_offset=n)
        arrive = decide_batch(two, late, epoch=epochs[2], partition=2, first_offset=n)
        errors = _commit_together([(one, contain), (two, arrive)])
        # The two batches serialise on the advisory lock of `mid`: the first always
        # commits. The second was decided on a lineage the first moved (the root
        # contained above the leaf, or the leaf's agent below the root) and may be
        # refused; decided again, as the consumer does, it commits.
        assert len(errors) <= 1, errors
        for error in errors:
            assert isinstance(error, VersionConflict), error
            assert "its lineage changed" in str(error)
        if not one.decisions(root):
            again = decide_batch(one, contained, epoch=epochs[1], partition=1, first_offset=n)
            assert again.views[root].lineage.includes(f"agent-{leaf}")
            one.commit(again)
        if not two.decisions(leaf):
            again = decide_batch(two, late, epoch=epochs[2], partition=2, first_offset=n)
            assert again.views[leaf].lineage.contained_ancestors == (root,)
            two.commit(again)
        assert one.lineage(leaf).contained_ancestors == (root,), n
        assert one.lineage(leaf).ancestors == (mid, root), n
    with one.lease_outbox(100_000) as lease:
        cascade = [parse_event(r.payload) for r in lease.records if r.topic == "recovery.events"]
    signalled = sorted(e.operation_id for e in cascade)
    expected = sorted(x for n in range(ROUNDS) for x in (f"r{n}m", f"r{n}m{n}"))
    assert signalled == expected
