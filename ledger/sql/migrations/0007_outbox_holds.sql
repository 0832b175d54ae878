-- The relay's verdict on an unpublishable outbox row (docs/relay.md, "Held rows"): a row
-- that cannot be encoded is held, and its key is skipped by the lease until an operator
-- releases it, so a few hundred poison heads can no longer fill every lease and starve
-- all other keys (docs/faults.md). The row and the rows behind it stay unpublished, so
-- the key's order is kept.
ALTER TABLE outbox
    ADD COLUMN held_at timestamptz,
    ADD COLUMN held_reason text;

ALTER TABLE outbox
    ADD CONSTRAINT outbox_hold_has_reason CHECK ((held_at IS NULL) = (held_reason IS NULL));

-- Small by construction (one row per held key): serves the lease's anti-join and the
-- operators' listing.
CREATE INDEX outbox_held_idx ON outbox (id) WHERE held_at IS NOT NULL AND published_at IS NULL;
