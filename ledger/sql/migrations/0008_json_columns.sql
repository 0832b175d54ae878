-- The documents the ledger writes on every batch and reads back whole are stored as
-- `json` (text, checked to be valid JSON) instead of `jsonb` (parsed into a binary tree
-- with sorted keys). No statement looks inside them (readers load the whole value, and
-- audit verification re-encodes it canonically), so the binary form bought nothing, and
-- building it was a third of the server's CPU for a batch (`jsonb_in`, measured with
-- perf during `python -m ops.bench_ledger`). The values are unchanged; the text is now
-- exactly what the ledger wrote (for audit records and decisions: the canonical JSON
-- that was hashed). Queries that look inside a value cast it (`record::jsonb`).
ALTER TABLE events ALTER COLUMN envelope TYPE json USING envelope::json;
ALTER TABLE decisions ALTER COLUMN decision TYPE json USING decision::json;
ALTER TABLE evidence ALTER COLUMN record TYPE json USING record::json;
ALTER TABLE approvals ALTER COLUMN record TYPE json USING record::json;
ALTER TABLE audit_records ALTER COLUMN record TYPE json USING record::json;
ALTER TABLE outbox ALTER COLUMN headers TYPE json USING headers::json;
ALTER TABLE operations
    ALTER COLUMN view TYPE json USING view::json,
    ALTER COLUMN facts TYPE json USING facts::json;
