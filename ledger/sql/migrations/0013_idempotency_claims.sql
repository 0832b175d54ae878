-- Idempotency-key claims (issue 30, class 6; agent-failure-recovery practice §4;
-- docs/decision-core.md, "Duplicate business operations"). A tool declares, on the
-- event that opens an operation, the idempotency key it sent with the call and the
-- digest of the call's canonical arguments. The key is unique per initiating principal
-- and capability; the first operation to declare it owns it, and a later one claiming
-- the same key is decided as a duplicate (same arguments) or refused as a conflicting
-- reuse (different arguments).
--
-- This table is the one index the controller reads across operations outside the
-- lineage walk, and it is keyed by the claim, not by an operation: one point lookup per
-- key a batch's new operations declare, before deciding, and one insert per claim in
-- the commit of the batch that opens its owner. The primary key makes the check exact
-- across partitions and controllers: of two batches that both decided an operation as
-- the owner, only one commit writes the claim; the other is refused (VersionConflict)
-- and decided again on the stored owner.
--
-- Append-only like the history tables (migration 0010): a claim is never moved to
-- another operation, and retention leaves it with the operation row, so a key stays
-- taken for as long as the ledger knows the operation.
CREATE TABLE idempotency_claims (
    principal        text NOT NULL,
    capability       text NOT NULL,
    idempotency_key  text NOT NULL,
    operation_id     text NOT NULL,
    arguments_digest text,
    claimed_at       timestamptz NOT NULL,
    PRIMARY KEY (principal, capability, idempotency_key)
);

CREATE TRIGGER idempotency_claims_append_only BEFORE UPDATE OR DELETE ON idempotency_claims
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER idempotency_claims_no_truncate BEFORE TRUNCATE ON idempotency_claims
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
