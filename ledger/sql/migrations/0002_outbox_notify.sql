-- Wake outbox relays when rows commit: one NOTIFY per inserting statement (the
-- ledger writes a batch's outbox rows with one COPY, so one per batch). PostgreSQL
-- delivers it at commit, and never for a rolled-back transaction. The payload is
-- empty: relays lease what is there rather than trust a message.
--
-- NOTIFY takes a cluster-wide lock while committing, which serialises the commits that
-- notify. docs/relay.md has the measurement. A deployment whose relays poll instead
-- (`recoveryctl run --relay-wake poll`) turns the trigger's cost off with
--   ALTER DATABASE <db> SET recovery.outbox_notify = 'off';
-- (a transaction that queues no notification takes no lock).
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('recovery.outbox_notify', true), '') <> 'off' THEN
        PERFORM pg_notify('recovery_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify
AFTER INSERT ON outbox
FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
