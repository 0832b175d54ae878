-- An outbox row that publishes an audit record refers to it instead of copying it: the
-- record is already in audit_records (same operation = the row's key, and its
-- sequence), and copying every audit record a second time was the largest single cost
-- of a batch. The lease query joins the record back in (ledger/sql/queries.sql).
ALTER TABLE outbox ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE outbox ADD COLUMN audit_sequence bigint;
ALTER TABLE outbox ADD CONSTRAINT outbox_payload_or_audit_reference
    CHECK ((payload IS NULL) <> (audit_sequence IS NULL));
