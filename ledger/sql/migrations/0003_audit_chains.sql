-- Heads of audit chains that belong to no operation: the controller's intake chain per
-- consumed partition, where dead letters (input refused before or instead of a
-- decision) are audited. An operation's chain head stays on its operations row.
CREATE TABLE audit_chains (
    chain_id       text PRIMARY KEY,
    audit_sequence bigint NOT NULL DEFAULT 0 CHECK (audit_sequence >= 0),
    audit_head     text NOT NULL
);
