"""The abstract ledger suite, lineage part: linking in either arrival order, the
containment cascade through the outbox, containment on arrival, and the lineage reads
(`Ledger.lineage`, `Ledger.lineage_tree`). Run against both ledgers by mixing
`LineageContract` into their test classes."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger, VersionConflict
from machines import Arrival
from machines.event import Event, Lineage, parse_event
from schemas import (
    DEFAULT_CONTROLLER_ID,
    DEFAULT_TOPICS,
    OutboxSigner,
    RecordSigner,
    WireDecoder,
    record_to_event,
    verify_record,
)
from tests.support.signed_outbox import SIGNED_AT, controller_roster, published
from tests.unit.ledger.ledger_support import GROUP, T0, TOPIC, core, decide_batch, feed

_AGENTS = {"root": "research-orchestrator"}


def tree_event(op: str, index: int, kind: str, *, parent: str | None = None) -> Event:
    machine, _ = core()
    return Event(
        event_type=kind,
        event_id=f"{op}-e{index}",
        operation_id=op,
        correlation_id="corr-tree",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=T0 + timedelta(seconds=index),
        evidence_ref=f"evidence://{op}/{index}",
        producer="tool-integration",
        lineage=Lineage(
            agent=_AGENTS.get(op, f"agent-{op}"),
            task=f"task-{op}",
            initiating_principal="alice",
            origin_operation=None if parent is None else "root",
            parent_operation=parent,
            delegated_credentials=(f"cred-{op}",),
        ),
    )


def _cascade_events(ledger: Ledger) -> list[Event]:
    with ledger.lease_outbox(1000) as lease:
        rows = [r for r in lease.records if r.topic == "recovery.events"]
    return [parse_event(r.payload) for r in rows]


class LineageContract:
    """Lineage behaviour shared by every `Ledger` implementation."""

    def _claim(self, ledger: Ledger) -> int:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        return claim.epoch

    def test_child_reported_before_its_parent_is_linked_when_the_parent_arrives(
        self, ledger: Ledger
    ) -> None:
        epoch = self._claim(ledger)
        feed(ledger, [tree_event("child", 0, "STEP_FAILED", parent="root")], epoch=epoch)
        assert ledger.lineage("child").ancestors == ()
        feed(ledger, [tree_event("root", 0, "STEP_FAILED")], epoch=epoch, first_offset=1)
        child = ledger.lineage("child")
        assert (child.ancestors, child.lineage_agents) == (("root",), ("research-orchestrator",))
        assert ledger.lineage("root").descendant_agents == ("agent-child",)
        assert child.delegated_credentials == ("cred-child",)
        view = ledger.load_views(["child"])["child"]
        assert view.lineage.includes("research-orchestrator")
        assert not view.lineage.contained_ancestors

    def test_a_child_refused_a_link_stays_unlinked_and_is_never_linked_later(
        self, ledger: Ledger
    ) -> None:
        # The batch that opens the parent names a child reported first whose opener may
        # not speak for the parent's agents (machines.may_link): it is not linked, the
        # refusal is audited on the parent, and no later link of the parent's own
        # ancestors brings it in.
        epoch = self._claim(ledger)
        feed(ledger, [tree_event("child", 0, "STEP_FAILED", parent="mid")], epoch=epoch)
        opening = decide_batch(
            ledger,
            [tree_event("mid", 0, "STEP_FAILED", parent="root")],
            epoch=epoch,
            first_offset=1,
        )
        ledger.commit(replace(opening, unlinked={"mid": frozenset({"child"})}))
        assert ledger.lineage("child").ancestors == ()
        assert ledger.lineage("mid").descendant_agents == ()
        records, _ = ledger.audit_chain("mid")
        assert [r.record["kind"] for r in records if r.kind == "lineage"] == ["link-refused"]
        feed(ledger, [tree_event("root", 0, "STEP_FAILED")], epoch=epoch, first_offset=2)
        assert ledger.lineage("mid").ancestors == ("root",)
        assert ledger.lineage("child").ancestors == ()
        assert ledger.lineage("root").descendant_agents == ("agent-mid",)

    def test_parent_first_links_children_and_grandchildren_at_once(self, ledger: Ledger) -> None:
        epoch = self._claim(ledger)
        feed(
            ledger,
            [
                tree_event("root", 0, "STEP_FAILED"),
                tree_event("mid", 0, "STEP_FAILED", parent="root"),
                tree_event("leaf", 0, "STEP_FAILED", parent="mid"),
            ],
            epoch=epoch,
        )
        leaf = ledger.lineage("leaf")
        assert leaf.ancestors == ("mid", "root")
        assert leaf.lineage_agents == ("agent-mid", "research-orchestrator")
        tree = ledger.lineage_tree("root")
        assert [r.operation_id for r in tree] == ["root", "mid", "leaf"]
        # Children and grandchildren are in the root's lineage too: none may approve it.
        assert tree[0].descendant_agents == ("agent-mid", "agent-leaf")
        root = ledger.load_views(["root"])["root"]
        assert root.lineage.includes("agent-leaf")
        assert ledger.operation("leaf").delegated_credentials == ("cred-leaf",)

    def test_containing_the_root_signals_every_known_descendant_once(self, ledger: Ledger) -> None:
        epoch = self._claim(ledger)
        # The children are reported first: the root's own batch links and contains them.
        feed(
            ledger,
            [
                tree_event("a", 0, "STEP_FAILED", parent="root"),
                tree_event("b", 0, "STEP_FAILED", parent="root"),
                tree_event("a1", 0, "STEP_FAILED", parent="a"),
            ],
            epoch=epoch,
        )
        feed(ledger, [tree_event("root", 0, "AUTHORIZATION_DENIED")], epoch=epoch, first_offset=3)
        root = ledger.lineage("root")
        assert root.containing
        assert root.containment_cause == "root#1/root-e0"
        events = _cascade_events(ledger)
        assert sorted(e.operation_id for e in events) == ["a", "a1", "b"]
        for e in events:
            assert e.event_type == "ANCESTOR_CONTAINED"
            assert e.producer == DEFAULT_CONTROLLER_ID
            assert e.evidence is not None
            assert e.evidence.ancestor_operation == "root"
            assert e.evidence_ref == "cascade:root#1/root-e0"
            assert e.lineage.delegated_credentials == (f"cred-{e.operation_id}",)
        assert ledger.lineage("a1").contained_ancestors == ("root",)
        assert ledger.load_views(["a1"])["a1"].lineage.contained_ancestors == ("root",)
        # The audit of the root names what its containment reached.
        records, _ = ledger.audit_chain("root")
        lineage = [r.record for r in records if r.kind == "lineage"]
        assert lineage[-1]["descendants"] == ["a", "a1", "b"]
        assert lineage[-1]["cause"]["event_id"] == "root-e0"

    def test_a_cascade_names_the_controller_that_signs_it(self, ledger: Ledger) -> None:
        # A controller deployed under another roster id (RECOVERY_CONTROLLER_ID) signs
        # its cascade events as that id; the envelope must name the same producer, or
        # intake refuses every cascade as `identity-mismatch`.
        key = Ed25519PrivateKey.generate()
        sign = OutboxSigner(RecordSigner("controller-b", key), DEFAULT_TOPICS)
        epoch = self._claim(ledger)
        feed(ledger, [tree_event("a", 0, "STEP_FAILED", parent="root")], epoch=epoch)
        feed(
            ledger,
            [tree_event("root", 0, "AUTHORIZATION_DENIED")],
            epoch=epoch,
            first_offset=1,
            sign=sign,
        )
        ((_, encoded, headers),) = [
            r for r in published(ledger) if r[1].topic == DEFAULT_TOPICS.events
        ]
        roster = controller_roster(key, "controller-b")
        entry = verify_record(
            roster, encoded.topic, encoded.key.encode(), encoded.value, headers, at=SIGNED_AT
        )
        _, record = WireDecoder().decode(encoded.value, encoded.content_type)
        assert record_to_event(record).producer == entry.id == "controller-b"

    def test_the_commit_result_counts_the_cascade_events_it_wrote(self, ledger: Ledger) -> None:
        epoch = self._claim(ledger)
        feed(
            ledger,
            [
                tree_event("a", 0, "STEP_FAILED", parent="root"),
                tree_event("b", 0, "STEP_FAILED", parent="root"),
            ],
            epoch=epoch,
        )
        with ledger.lease_outbox(1000) as lease:
            lease.mark_published([r.record_id for r in lease.records])
        result = feed(
            ledger, [tree_event("root", 0, "AUTHORIZATION_DENIED")], epoch=epoch, first_offset=2
        )
        with ledger.lease_outbox(1000) as lease:
            written = lease.records
        assert sorted(r.key for r in written if r.topic == "recovery.events") == ["a", "b"]
        assert result.outbox_rows == len(written)

    def test_a_descendant_contained_by_the_cascade_does_not_signal_its_subtree_again(
        self, ledger: Ledger
    ) -> None:
        epoch = self._claim(ledger)
        feed(
            ledger,
            [
                tree_event("a", 0, "STEP_FAILED", parent="root"),
                tree_event("a1", 0, "STEP_FAILED", parent="a"),
                tree_event("root", 0, "AUTHORIZATION_DENIED"),
            ],
            epoch=epoch,
        )
        (to_a,) = [e for e in _cascade_events(ledger) if e.operation_id == "a"]
        feed(ledger, [to_a], epoch=epoch, first_offset=3)
        a = ledger.lineage("a")
        assert a.state == "containing"
        assert a.containing
        assert a.containment_cause == f"a#2/{to_a.event_id} <- root#1/root-e0"
        assert sorted(e.operation_id for e in _cascade_events(ledger)) == ["a", "a1"]
        assert ledger.lineage("a1").contained_ancestors == ("root", "a")

    def test_an_operation_first_seen_below_a_contained_ancestor_is_contained_on_arrival(
        self, ledger: Ledger
    ) -> None:
        epoch = self._claim(ledger)
        feed(
            ledger,
            [tree_event("root", 0, "AUTHORIZATION_DENIED")],
            epoch=epoch,
        )
        feed(
            ledger,
            [tree_event("late", 0, "STEP_FAILED", parent="root")],
            epoch=epoch,
            first_offset=1,
        )
        (arrival,) = _cascade_events(ledger)
        assert arrival.operation_id == "late"
        assert arrival.evidence is not None
        assert arrival.evidence.ancestor_operation == "root"
        assert arrival.evidence_ref == "cascade:root#1/root-e0"
        assert ledger.lineage("late").contained_ancestors == ("root",)
        records, _ = ledger.audit_chain("late")
        assert [r.record["kind"] for r in records if r.kind == "lineage"] == [
            "contained-on-arrival"
        ]

    def test_a_subtree_reported_first_is_contained_when_linked_below_a_contained_root(
        self, ledger: Ledger
    ) -> None:
        epoch = self._claim(ledger)
        feed(
            ledger,
            [
                tree_event("root", 0, "AUTHORIZATION_DENIED"),
                tree_event("leaf", 0, "STEP_FAILED", parent="mid"),
            ],
            epoch=epoch,
        )
        assert _cascade_events(ledger) == []
        feed(
            ledger,
            [tree_event("mid", 0, "STEP_FAILED", parent="root")],
            epoch=epoch,
            first_offset=2,
        )
        assert sorted(e.operation_id for e in _cascade_events(ledger)) == ["leaf", "mid"]
        assert ledger.lineage("leaf").ancestors == ("mid", "root")
        assert ledger.lineage("leaf").contained_ancestors == ("root",)

    def test_a_batch_decided_before_an_ancestor_was_contained_is_decided_again(
        self, ledger: Ledger
    ) -> None:
        claims = ledger.claim(GROUP, TOPIC, [0, 1], "controller-a")
        epoch = claims[0].epoch
        feed(
            ledger,
            [
                tree_event("root", 0, "STEP_FAILED"),
                tree_event("child", 0, "STEP_FAILED", parent="root"),
            ],
            epoch=epoch,
        )
        stale = decide_batch(
            ledger, [tree_event("child", 1, "STEP_FAILED")], epoch=epoch, first_offset=2
        )
        feed(ledger, [tree_event("root", 1, "ANCESTOR_CONTAINED")], epoch=epoch, partition=1)
        assert ledger.lineage("root").containing
        with pytest.raises(VersionConflict, match="child: its lineage changed"):
            ledger.commit(stale)
        fresh = decide_batch(
            ledger, [tree_event("child", 1, "STEP_FAILED")], epoch=epoch, first_offset=2
        )
        ledger.commit(fresh)
        assert ledger.load_views(["child"])["child"].lineage.contained_ancestors == ("root",)

    def test_arrival_lineage_of_a_new_child_names_its_contained_parent_and_its_chain(
        self, ledger: Ledger
    ) -> None:
        epoch = self._claim(ledger)
        feed(
            ledger,
            [
                tree_event("root", 0, "STEP_FAILED"),
                tree_event("mid", 0, "AUTHORIZATION_DENIED", parent="root"),
            ],
            epoch=epoch,
        )
        arrivals = ledger.arrival_lineage({"late": "mid", "orphan": "nowhere", "top": None})
        late = arrivals["late"]
        assert late.ancestors == ("mid", "root")
        assert late.lineage_agents == ("agent-mid", "research-orchestrator")
        assert late.contained_ancestors == ("mid",)
        # Nothing stored about them: an empty arrival, never a missing key.
        assert arrivals["orphan"] == Arrival("orphan")
        assert arrivals["top"] == Arrival("top")
        assert ledger.arrival_lineage({}) == {}

    def test_arrival_lineage_of_a_new_parent_names_the_agents_reported_below_it(
        self, ledger: Ledger
    ) -> None:
        epoch = self._claim(ledger)
        feed(
            ledger,
            [
                tree_event("a", 0, "STEP_FAILED", parent="root"),
                tree_event("a1", 0, "STEP_FAILED", parent="a"),
                tree_event("b", 0, "STEP_FAILED", parent="root"),
            ],
            epoch=epoch,
        )
        root = ledger.arrival_lineage({"root": None})["root"]
        assert root.ancestors == ()
        assert root.contained_ancestors == ()
        assert sorted(root.descendant_agents) == ["agent-a", "agent-a1", "agent-b"]

    def test_a_new_childs_first_batch_is_decided_with_its_contained_parent(
        self, ledger: Ledger
    ) -> None:
        epoch = self._claim(ledger)
        feed(ledger, [tree_event("root", 0, "AUTHORIZATION_DENIED")], epoch=epoch)
        batch = decide_batch(
            ledger,
            [tree_event("late", 0, "STEP_FAILED", parent="root")],
            epoch=epoch,
            first_offset=1,
        )
        opened = batch.views["late"]
        assert opened.version == 0
        assert opened.lineage.contained_ancestors == ("root",)
        assert opened.lineage.includes("research-orchestrator")
        ledger.commit(batch)
        assert ledger.load_views(["late"])["late"].lineage.contained_ancestors == ("root",)

    def test_a_new_child_decided_before_its_parent_was_contained_is_decided_again(
        self, ledger: Ledger
    ) -> None:
        claims = ledger.claim(GROUP, TOPIC, [0, 1], "controller-a")
        epoch = claims[0].epoch
        feed(ledger, [tree_event("root", 0, "STEP_FAILED")], epoch=epoch)
        late = [tree_event("late", 0, "STEP_FAILED", parent="root")]
        stale = decide_batch(ledger, late, epoch=epoch, first_offset=1)
        feed(ledger, [tree_event("root", 1, "ANCESTOR_CONTAINED")], epoch=epoch, partition=1)
        assert ledger.lineage("root").containing
        with pytest.raises(VersionConflict, match="late: its lineage changed"):
            ledger.commit(stale)
        assert ledger.decisions("late") == ()
        # The replan reads the moved lineage, so it commits: the refusal cannot repeat.
        ledger.commit(decide_batch(ledger, late, epoch=epoch, first_offset=1))
        assert ledger.load_views(["late"])["late"].lineage.contained_ancestors == ("root",)

    def test_a_new_child_decided_before_its_parent_was_linked_is_decided_again(
        self, ledger: Ledger
    ) -> None:
        claims = ledger.claim(GROUP, TOPIC, [0, 1], "controller-a")
        epoch = claims[0].epoch
        feed(ledger, [tree_event("mid", 0, "STEP_FAILED", parent="root")], epoch=epoch)
        leaf = [tree_event("leaf", 0, "STEP_FAILED", parent="mid")]
        stale = decide_batch(ledger, leaf, epoch=epoch, first_offset=1)
        # The root arrives (already contained) and links mid below it meanwhile.
        feed(ledger, [tree_event("root", 0, "AUTHORIZATION_DENIED")], epoch=epoch, partition=1)
        with pytest.raises(VersionConflict, match="leaf: its lineage changed"):
            ledger.commit(stale)
        ledger.commit(decide_batch(ledger, leaf, epoch=epoch, first_offset=1))
        stored = ledger.lineage("leaf")
        assert stored.ancestors == ("mid", "root")
        assert stored.contained_ancestors == ("root",)

    def test_a_new_parent_decided_before_a_child_was_reported_is_decided_again(
        self, ledger: Ledger
    ) -> None:
        claims = ledger.claim(GROUP, TOPIC, [0, 1], "controller-a")
        epoch = claims[0].epoch
        root = [tree_event("root", 0, "STEP_FAILED")]
        stale = decide_batch(ledger, root, epoch=epoch)
        feed(ledger, [tree_event("kid", 0, "STEP_FAILED", parent="root")], epoch=epoch, partition=1)
        # The kid's agent may not approve the root: the root's first decisions must know it.
        with pytest.raises(VersionConflict, match="root: its lineage changed"):
            ledger.commit(stale)
        ledger.commit(decide_batch(ledger, root, epoch=epoch))
        assert ledger.load_views(["root"])["root"].lineage.includes("agent-kid")
