"""The abstract ledger suite: every behaviour the controller relies on, stated once and
run against both implementations (`TestMemoryLedger` here, `TestPostgresLedger` in
tests/integration/ledger), so the in-memory fake cannot drift from PostgreSQL.

A concrete class provides the `ledger` fixture and the two tampering hooks an attacker
with write access to the store would use.
"""

from __future__ import annotations

import abc
from dataclasses import replace

import pytest

from ledger import (
    Batch,
    EventIdReused,
    FencedError,
    Ledger,
    NonceReused,
    PartitionAttempt,
    UnknownOperation,
    VersionConflict,
)
from ledger.deadletters import DeadLetter, intake_chain_id
from machines import ClaimKey, KeyClaim
from tests.unit.ledger.ledger_support import (
    GROUP,
    TOPIC,
    decide_batch,
    event,
    feed,
    sequence,
    with_approval,
)


class LedgerContract(abc.ABC):
    """Behaviour shared by every `Ledger` implementation."""

    @abc.abstractmethod
    def tamper_audit(self, ledger: Ledger, operation_id: str, sequence: int) -> None:
        """Alter the body of one stored audit record behind the ledger's back."""

    @abc.abstractmethod
    def delete_audit(self, ledger: Ledger, operation_id: str, sequence: int) -> None:
        """Delete one stored audit record behind the ledger's back."""

    # -- claims and offsets ------------------------------------------------------------

    def test_first_claim_starts_at_epoch_one_with_no_stored_offset(self, ledger: Ledger) -> None:
        claims = ledger.claim(GROUP, TOPIC, [1, 0], "controller-a")
        assert [(c.partition, c.epoch, c.next_offset) for c in claims] == [
            (0, 1, None),
            (1, 1, None),
        ]

    def test_claim_bumps_epoch_and_returns_the_committed_next_offset(self, ledger: Ledger) -> None:
        (first,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=first.epoch, first_offset=0)
        (second,) = ledger.claim(GROUP, TOPIC, [0], "controller-b")
        assert (second.epoch, second.next_offset) == (first.epoch + 1, 3)
        assert ledger.offsets(GROUP, TOPIC) == {0: 3}

    # -- one batch -----------------------------------------------------------------------

    def test_a_recorded_attempt_comes_back_with_the_next_claim(self, ledger: Ledger) -> None:
        (first,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        assert first.attempt is None
        attempt = PartitionAttempt(TOPIC, 0, 5, 40, 2, False)
        assert ledger.record_attempts(GROUP, [attempt], {(TOPIC, 0): first.epoch}) == ()
        (second,) = ledger.claim(GROUP, TOPIC, [0], "controller-b")
        assert second.attempt == PartitionAttempt(TOPIC, 0, 5, 40, 2, False, "controller-a")
        single = PartitionAttempt(TOPIC, 0, 6, 40, 3, True, record_starts=2)
        ledger.record_attempts(GROUP, [single], {(TOPIC, 0): second.epoch})
        (third,) = ledger.claim(GROUP, TOPIC, [0], "controller-c")
        assert third.attempt == PartitionAttempt(TOPIC, 0, 6, 40, 3, True, "controller-b", 2)

    def test_a_fenced_start_cannot_record_an_attempt(self, ledger: Ledger) -> None:
        (old,) = ledger.claim(GROUP, TOPIC, [0], "zombie")
        (new,) = ledger.claim(GROUP, TOPIC, [0], "owner")
        ledger.record_attempts(
            GROUP, [PartitionAttempt(TOPIC, 0, 1, 9, 1, False)], {(TOPIC, 0): new.epoch}
        )
        stale = PartitionAttempt(TOPIC, 0, 1, 9, 5, True)
        assert ledger.record_attempts(GROUP, [stale], {(TOPIC, 0): old.epoch}) == ((TOPIC, 0),)
        (after,) = ledger.claim(GROUP, TOPIC, [0], "next")
        assert after.attempt == PartitionAttempt(TOPIC, 0, 1, 9, 1, False, "owner")

    def test_committed_batch_stores_the_folded_view_and_every_row(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        batch = decide_batch(ledger, sequence("op-1"), epoch=claim.epoch)
        result = ledger.commit(batch)
        view = ledger.load_views(["op-1"])["op-1"]
        assert view.version == 3
        assert view.state == batch.entries[-1].decision.state_after
        assert len(view.verifications) == 1
        assert [d["sequence"] for d in ledger.decisions("op-1")] == [1, 2, 3]
        commands = [i.command_id for e in batch.entries for i in e.decision.invocations]
        assert (result.events, result.decisions, result.evidence) == (3, 3, 1)
        # One audit record opens the operation, then one per decision.
        assert result.audit_records == 4
        # The commands, the accepted verification as an evidence event, the audit, and
        # the batch's signed chain-heads record.
        assert result.outbox_rows == len(commands) + 1 + 4 + 1
        with ledger.lease_outbox(100) as lease:
            ids = [r.record_id for r in lease.records]
            evidence = [r for r in lease.records if r.topic == "recovery.evidence"]
        assert ids[: len(commands)] == commands
        verified = next(d for d in ledger.decisions("op-1") if d["evidence"].get("verification"))
        assert ids[len(commands)] == f"evidence:op-1:{verified['sequence']}:verification"
        assert evidence[0].payload["outcome"] == verified["evidence"]["verification"]["outcome"]
        assert ids[len(commands) + 1 : -1] == [f"audit:op-1:{n}" for n in range(1, 5)]
        with ledger.lease_outbox(100) as lease:
            heads = lease.records[-1]
        assert (heads.topic, heads.payload["kind"]) == ("recovery.audit", "chain-heads")
        assert heads.payload["heads"] == [
            {"operation_id": "op-1", "sequence": 4, "hash": ledger.audit_chain("op-1")[1].hash}
        ]

    def test_operation_row_keeps_identity_and_lineage(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("root", 0, "TOOL_TIMEOUT")], epoch=claim.epoch)
        feed(ledger, [event("child", 0, "TOOL_TIMEOUT", parent="root")], epoch=claim.epoch)
        feed(ledger, [event("grand", 0, "TOOL_TIMEOUT", parent="child")], epoch=claim.epoch)
        info = ledger.operation("grand")
        assert (info.parent_operation, info.origin_operation, info.depth) == ("child", "child", 2)
        assert (info.agent, info.task, info.initiating_principal) == ("agent-1", "task-1", "alice")
        assert (info.runtime, info.correlation_id, info.version) == ("runtime-1", "corr-grand", 1)
        assert ledger.descendants("root") == ("child", "grand")
        assert ledger.descendants("grand") == ()

    def test_unknown_operation_is_reported_by_id(self, ledger: Ledger) -> None:
        with pytest.raises(UnknownOperation, match="op-missing"):
            ledger.operation("op-missing")
        assert ledger.load_views(["op-missing"]) == {}

    # -- duplicates and conflicts ------------------------------------------------------------

    def test_redelivered_events_are_duplicates_and_write_no_decision(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=claim.epoch)
        again = feed(ledger, sequence("op-1"), epoch=claim.epoch, first_offset=3)
        assert (again.events, again.decisions, again.audit_records, again.outbox_rows) == (0,) * 4
        assert len(ledger.decisions("op-1")) == 3
        assert ledger.offsets(GROUP, TOPIC) == {0: 6}

    def test_duplicate_event_id_inside_one_batch_is_applied_once(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        first = event("op-1", 0, "TOOL_TIMEOUT")
        result = feed(ledger, [first, first], epoch=claim.epoch)
        assert (result.events, result.decisions) == (1, 1)
        assert ledger.load_views(["op-1"])["op-1"].version == 1

    def test_conflicting_reuse_is_audited_and_dead_lettered_not_applied(
        self, ledger: Ledger
    ) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=claim.epoch)
        forged = event("op-1", 5, "VERIFICATION_FOUND", outcome="applied", event_id="op-1-e0")
        result = feed(ledger, [forged], epoch=claim.epoch, first_offset=1)
        assert (result.events, result.decisions, result.audit_records) == (0, 0, 1)
        assert ledger.load_views(["op-1"])["op-1"].version == 1
        records, _ = ledger.audit_chain("op-1")
        assert records[-1].kind == "event-conflict"
        assert records[-1].record["offered_digest"] == forged.payload_digest
        with ledger.lease_outbox(100) as lease:
            dead = [r for r in lease.records if r.topic == "recovery.dlq"]
        assert [r.record_id for r in dead] == [f"dlq:op-1:{records[-1].sequence}"]
        assert dead[0].payload["envelope"]["event_id"] == "op-1-e0"
        assert ledger.verify_audit("op-1") == ()

    def test_refused_input_is_audited_on_its_intake_chain_with_the_batch(
        self, ledger: Ledger
    ) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        chain = intake_chain_id(GROUP, TOPIC, 0)
        letter = DeadLetter(
            record_id="dlq:intake:1",
            chain_id=chain,
            key="op-1",
            reason_code="undecodable",
            payload={"reason": "bad bytes", "raw": "3q2+7w=="},
            headers={"source_offset": "1"},
            audit={"reason_code": "undecodable", "digest": "sha256:0"},
        )
        batch = decide_batch(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=claim.epoch)
        result = ledger.commit(replace(batch, dead_letters=(letter,)))
        assert (result.decisions, result.dead_letters) == (1, 1)
        with ledger.lease_outbox(100) as lease:
            rows = lease.records
        assert result.outbox_rows == len(rows)
        (dead,) = [r for r in rows if r.topic == "recovery.dlq"]
        assert dead.payload == letter.payload
        assert dict(dead.headers)["reason"] == "undecodable"
        records, head = ledger.audit_chain(chain)
        assert [r.record for r in records] == [letter.audit]
        assert head is not None
        assert head.sequence == 1
        assert ledger.verify_audit(chain) == ()

    def test_event_id_stored_for_another_operation_is_refused_whole(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=claim.epoch)
        reused = event("op-2", 0, "TOOL_TIMEOUT", event_id="op-1-e0")
        batch = decide_batch(
            ledger, [event("op-3", 0, "TOOL_TIMEOUT"), reused], epoch=claim.epoch, first_offset=1
        )
        with pytest.raises(EventIdReused, match="op-1-e0"):
            ledger.commit(batch)
        assert ledger.load_views(["op-2", "op-3"]) == {}
        assert ledger.offsets(GROUP, TOPIC) == {0: 1}

    # -- optimistic versions and fencing ------------------------------------------------------

    def test_batch_decided_on_a_stale_version_is_refused_and_writes_nothing(
        self, ledger: Ledger
    ) -> None:
        ledger.claim(GROUP, TOPIC, [0, 1], "controller-a")
        feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=1)
        late = decide_batch(
            ledger, [event("op-1", 1, "VERIFICATION_FOUND", outcome="applied")], epoch=1
        )
        feed(ledger, [event("op-1", 2, "RETRY_SUCCEEDED")], epoch=1, partition=1)
        with pytest.raises(VersionConflict, match="op-1"):
            ledger.commit(late)
        assert [d["event"]["id"] for d in ledger.decisions("op-1")] == ["op-1-e0", "op-1-e2"]
        assert ledger.offsets(GROUP, TOPIC) == {0: 1, 1: 1}

    def test_batch_opening_an_operation_another_writer_opened_is_refused(
        self, ledger: Ledger
    ) -> None:
        ledger.claim(GROUP, TOPIC, [0, 1], "controller-a")
        late = decide_batch(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=1)
        feed(ledger, [event("op-1", 1, "TOOL_TIMEOUT")], epoch=1, partition=1)
        with pytest.raises(VersionConflict, match="op-1"):
            ledger.commit(late)
        assert len(ledger.decisions("op-1")) == 1

    def test_a_batch_committed_again_is_refused_as_decided_on_a_stale_view(
        self, ledger: Ledger
    ) -> None:
        # A commit whose acknowledgement was lost (the primary died after its synchronous
        # standby had it) is sent again on the view it was decided on. Its opening event
        # is stored for the same operation: a stale view, not a reused id; the consumer
        # reloads, finds the event a duplicate and dead-letters nothing.
        ledger.claim(GROUP, TOPIC, [0], "controller-a")
        batch = decide_batch(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=1)
        ledger.commit(batch)
        with pytest.raises(VersionConflict, match="op-1"):
            ledger.commit(batch)
        again = feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=1)
        assert (again.events, again.decisions, again.dead_letters) == (0, 0, 0)
        assert len(ledger.decisions("op-1")) == 1
        assert ledger.offsets(GROUP, TOPIC) == {0: 1}

    def test_stale_epoch_is_fenced_and_nothing_of_the_batch_is_written(
        self, ledger: Ledger
    ) -> None:
        (old,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        zombie = decide_batch(ledger, sequence("op-1"), epoch=old.epoch)
        (new,) = ledger.claim(GROUP, TOPIC, [0], "controller-b")
        with pytest.raises(FencedError, match=rf"{TOPIC}\[0\]"):
            ledger.commit(zombie)
        assert ledger.load_views(["op-1"]) == {}
        assert ledger.offsets(GROUP, TOPIC) == {}
        feed(ledger, sequence("op-1"), epoch=new.epoch)
        assert ledger.offsets(GROUP, TOPIC) == {0: 3}

    def test_batch_for_an_unclaimed_partition_is_fenced(self, ledger: Ledger) -> None:
        batch = decide_batch(ledger, sequence("op-1"), epoch=1, partition=7)
        with pytest.raises(FencedError):
            ledger.commit(batch)

    # -- audit chains -------------------------------------------------------------------------

    def test_audit_chains_of_every_operation_verify_intact(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=claim.epoch)
        feed(ledger, [event("op-1", 3, "TOOL_TIMEOUT")], epoch=claim.epoch, first_offset=6)
        assert ledger.verify_audit() == ()
        records, head = ledger.audit_chain("op-1")
        assert [r.sequence for r in records] == [1, 2, 3, 4, 5]
        assert head is not None
        assert (head.sequence, head.hash) == (5, records[-1].hash)
        assert records[0].record["agent"] == "agent-1"
        assert records[1].record["state_before"] == "failure-reported"

    def test_tampered_audit_record_is_detected_at_its_sequence(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=claim.epoch)
        self.tamper_audit(ledger, "op-1", 3)
        (found,) = ledger.verify_audit()
        assert (found.operation_id, found.sequence, found.reason) == ("op-1", 3, "was altered")
        assert found.expected != found.found
        assert ledger.verify_audit("op-2") == ()

    def test_deleted_audit_record_in_the_middle_is_detected(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=claim.epoch)
        self.delete_audit(ledger, "op-1", 2)
        (found,) = ledger.verify_audit("op-1")
        assert (found.sequence, found.reason) == (2, "is missing")

    def test_deleted_newest_audit_record_is_detected_by_the_head(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=claim.epoch)
        self.delete_audit(ledger, "op-1", 4)
        (found,) = ledger.verify_audit("op-1")
        assert (found.sequence, found.reason) == (4, "is missing at the end of the chain")

    # -- outbox -----------------------------------------------------------------------------------

    def test_outbox_rows_published_are_not_leased_again(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=claim.epoch)
        with ledger.lease_outbox(10) as lease:
            first = lease.records
            lease.mark_published([first[0].record_id])
        with ledger.lease_outbox(10) as lease:
            rest = lease.records
        assert [r.record_id for r in rest] == [r.record_id for r in first[1:]]
        assert [r.position for r in rest] == sorted(r.position for r in rest)

    def test_a_failed_lease_leaves_its_rows_unpublished(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        written = feed(ledger, sequence("op-1"), epoch=claim.epoch)

        def publish_then_fail() -> None:
            with ledger.lease_outbox(10) as lease:
                lease.mark_published([r.record_id for r in lease.records])
                raise RuntimeError("broker down")

        with pytest.raises(RuntimeError, match="broker down"):
            publish_then_fail()
        with ledger.lease_outbox(10) as lease:
            assert len(lease.records) == written.outbox_rows

    def test_concurrent_leases_never_share_a_key(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=claim.epoch)
        with ledger.lease_outbox(1) as first, ledger.lease_outbox(10) as second:
            first_keys = {r.key for r in first.records}
            second_keys = {r.key for r in second.records}
        assert first_keys == {"op-1"}
        assert second_keys == {"op-2"}

    def test_rows_of_a_key_behind_an_unpublished_row_wait_for_it(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1")[:1], epoch=claim.epoch)
        with ledger.lease_outbox(10) as holder:
            feed(ledger, sequence("op-1")[1:], epoch=claim.epoch, first_offset=1)
            with ledger.lease_outbox(10) as other:
                assert other.records == ()
            holder.mark_published([r.record_id for r in holder.records])
        with ledger.lease_outbox(10) as later:
            assert {r.key for r in later.records} == {"op-1"}
            assert all(
                r.record_id not in {h.record_id for h in holder.records} for r in later.records
            )

    def test_a_held_head_keeps_its_key_out_of_leases_and_lets_other_keys_through(
        self, ledger: Ledger
    ) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2") + sequence("op-3"), epoch=claim.epoch)
        with ledger.lease_outbox(1) as lease:
            poisoned = lease.records
            assert {r.key for r in poisoned} == {"op-1"}
            lease.hold(poisoned[0].record_id, "payload has no operation_id")
        with ledger.lease_outbox(1) as lease:
            assert {r.key for r in lease.records} == {"op-2"}
        with ledger.lease_outbox(10) as lease:
            assert {r.key for r in lease.records} == {"op-2", "op-3"}
        (held,) = ledger.held_outbox()
        assert (held.record_id, held.key, held.topic) == (
            poisoned[0].record_id,
            "op-1",
            poisoned[0].topic,
        )
        assert held.reason == "payload has no operation_id"
        assert held.position == poisoned[0].position
        assert held.waiting == len(poisoned) - 1
        assert held.held_at.tzinfo is not None

    def test_a_hold_after_the_published_prefix_blocks_the_rest_of_its_key(
        self, ledger: Ledger
    ) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1") + sequence("op-2"), epoch=claim.epoch)
        with ledger.lease_outbox(1) as lease:
            first, second, *_ = lease.records
            lease.mark_published([first.record_id])
            lease.hold(second.record_id, "unknown topic")
        with ledger.lease_outbox(10) as lease:
            assert {r.key for r in lease.records} == {"op-2"}
        assert [h.record_id for h in ledger.held_outbox()] == [second.record_id]

    def test_releasing_a_hold_lets_the_next_lease_retry_its_key_from_the_held_row(
        self, ledger: Ledger
    ) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=claim.epoch)
        with ledger.lease_outbox(10) as lease:
            rows = lease.records
            lease.hold(rows[0].record_id, "unknown topic")
        with ledger.lease_outbox(10) as lease:
            assert lease.records == ()
        assert ledger.release_outbox("no-such-record") is None
        assert ledger.release_outbox(rows[0].record_id) == "op-1"
        assert ledger.release_outbox(rows[0].record_id) is None
        assert ledger.held_outbox() == ()
        with ledger.lease_outbox(10) as lease:
            assert [r.record_id for r in lease.records] == [r.record_id for r in rows]

    def test_a_hold_in_a_lease_that_fails_is_not_kept(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=claim.epoch)

        def hold_then_fail() -> None:
            with ledger.lease_outbox(10) as lease:
                lease.hold(lease.records[0].record_id, "unknown topic")
                raise RuntimeError("database lost")

        with pytest.raises(RuntimeError, match="database lost"):
            hold_then_fail()
        assert ledger.held_outbox() == ()
        with ledger.lease_outbox(10) as lease:
            assert {r.key for r in lease.records} == {"op-1"}

    def test_an_operation_opened_without_a_runtime_stores_none(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT", runtime=None)], epoch=claim.epoch)
        assert ledger.operation("op-1").runtime is None

    def test_every_audit_record_names_the_operations_runtime(self, ledger: Ledger) -> None:
        # SPEC 10: principal, agent, runtime and task, from the envelope that opened it.
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, sequence("op-1"), epoch=claim.epoch)
        records, _ = ledger.audit_chain("op-1")
        assert [r.kind for r in records] == ["operation-opened"] + ["decision"] * 3
        opened, *decided = records
        assert (opened.record["runtime"], opened.record["agent"]) == ("runtime-1", "agent-1")
        for record in decided:
            assert record.record["identity"] == {
                "initiating_principal": "alice",
                "agent": "agent-1",
                "runtime": "runtime-1",
                "task": "task-1",
            }

    # -- idempotency-key claims ----------------------------------------------------------

    def test_an_opened_operation_claims_its_declared_key_once(self, ledger: Ledger) -> None:
        # machines.claims: the first operation declaring a key for a principal and
        # capability owns it; a batch deciding another owner later is refused.
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        assert ledger.key_claims([KEY]) == {}
        ledger.commit(_claiming(decide_batch(ledger, sequence("op-1"), epoch=claim.epoch), "op-1"))
        assert ledger.key_claims([KEY, replace(KEY, principal="bob")]) == {
            KEY: KeyClaim("op-1", DIGEST)
        }
        # Decided before op-1's claim was stored (another partition's controller), the
        # second owner of the same key is refused whole, so it is decided again.
        late = _claiming(
            decide_batch(ledger, sequence("op-2"), epoch=claim.epoch, first_offset=3), "op-2"
        )
        with pytest.raises(VersionConflict, match="claimed by operation op-1"):
            ledger.commit(late)
        with pytest.raises(UnknownOperation):
            ledger.operation("op-2")
        assert ledger.key_claims([KEY]) == {KEY: KeyClaim("op-1", DIGEST)}

    def test_two_new_operations_of_one_batch_cannot_both_own_a_key(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        batch = decide_batch(
            ledger,
            [event("op-1", 0, "TOOL_TIMEOUT"), event("op-2", 1, "TOOL_TIMEOUT")],
            epoch=claim.epoch,
        )
        with pytest.raises(VersionConflict):
            ledger.commit(_claiming(_claiming(batch, "op-1"), "op-2"))
        assert ledger.key_claims([KEY]) == {}

    # -- approvals --------------------------------------------------------------------------

    def test_approval_nonce_reused_by_another_event_is_refused_whole(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        first = with_approval(
            decide_batch(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=claim.epoch), "nonce-1"
        )
        result = ledger.commit(first)
        assert (result.approvals, result.evidence) == (1, 1)
        replay = with_approval(
            decide_batch(
                ledger, [event("op-2", 0, "TOOL_TIMEOUT")], epoch=claim.epoch, first_offset=1
            ),
            "nonce-1",
        )
        with pytest.raises(NonceReused, match="nonce-1"):
            ledger.commit(replay)
        assert ledger.load_views(["op-2"]) == {}
        assert ledger.offsets(GROUP, TOPIC) == {0: 1}


KEY = ClaimKey("alice", "demo.write", "key-shared")
DIGEST = "sha256:" + "5" * 64


def _claiming(batch: Batch, op: str) -> Batch:
    """`batch` with operation `op` (which it opens) declaring `KEY` when it was opened,
    as the fold opens it from an event whose `facts` declare the key."""
    view = batch.views[op]
    facts = replace(
        view.facts,
        idempotency_key=KEY.idempotency_key,
        arguments_digest=DIGEST,
        declared_by="tool-integration",
    )
    claiming = replace(view, facts=facts, principal=KEY.principal, capability=KEY.capability)
    return replace(batch, views={**batch.views, op: claiming}, folded=None)
