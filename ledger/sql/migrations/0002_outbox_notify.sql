-- Wake outbox relays when rows commit: one NOTIFY per inserting statement (the
-- ledger writes a batch's outbox rows with one COPY, so one per batch). PostgreSQL
-- delivers it at commit, and never for a rolled-back transaction. The payload is
-- empty: relays lease what is there rather than trust a message. docs/relay.md has
-- the measurement that chose this over short polling.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('recovery_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify
AFTER INSERT ON outbox
FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
