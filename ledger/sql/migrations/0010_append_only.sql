-- History is append-only (issue #15, SPEC §10; docs/ledger.md, "Roles and append-only
-- history"). The tables that record what happened (events, decisions, evidence,
-- approvals, audit records; dead letters are audit records on an intake chain plus an
-- outbox row) refuse UPDATE, DELETE and TRUNCATE for every role, the owner and
-- superusers included: a trigger fires whatever the privileges. The one way to remove
-- rows is retention, `purge_operation_history(operation_id)`: a SECURITY DEFINER
-- function owned by the NOLOGIN role recovery_retention, the only role the trigger lets
-- delete. EXECUTE on it belongs to the owner only.
--
-- What this does not stop: the owner can drop its own trigger, and a superuser can do
-- anything (`session_replication_role = replica` skips triggers). Those rewrites are
-- what the audit chain and its signed copy on recovery.audit are for.
--
-- Not append-only, by design: operations (the controller folds each decision into its
-- row), outbox (the relay marks rows published or held; the login roles get only the
-- column-level UPDATE that needs, see ledger/sql/roles.sql), audit_chains (intake chain
-- heads move), consumer_offsets and partition_owners.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recovery_retention') THEN
        -- Migrating as a superuser (tests, a fresh server): make the role here.
        -- Migrating as recovery_owner: `recoveryctl db roles` made it beforehand.
        CREATE ROLE recovery_retention NOLOGIN;
    END IF;
END;
$$;

CREATE FUNCTION refuse_history_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_user = 'recovery_retention' THEN
        RETURN OLD;  -- inside purge_operation_history
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'insufficient_privilege',
        MESSAGE = format('history-append-only: %s on table %s refused for role %s',
                         TG_OP, TG_TABLE_NAME, current_user),
        DETAIL = format('Table %s is append-only history: its rows are never updated or '
                        'deleted, whoever asks.', TG_TABLE_NAME),
        HINT = 'Retention goes through purge_operation_history(operation_id) '
               '(recoveryctl audit purge); a correction is a new event.';
END;
$$;

CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER decisions_append_only BEFORE UPDATE OR DELETE ON decisions
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER decisions_no_truncate BEFORE TRUNCATE ON decisions
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER evidence_append_only BEFORE UPDATE OR DELETE ON evidence
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER evidence_no_truncate BEFORE TRUNCATE ON evidence
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER approvals_append_only BEFORE UPDATE OR DELETE ON approvals
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER approvals_no_truncate BEFORE TRUNCATE ON approvals
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER audit_records_append_only BEFORE UPDATE OR DELETE ON audit_records
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER audit_records_no_truncate BEFORE TRUNCATE ON audit_records
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- Retention: delete one operation's (or one intake chain's) history and return how many
-- rows went. Unpublished outbox rows may still refer to its audit records (migration
-- 0004), so an operation with any is refused: purge after the relay caught up. The
-- operations row stays (it holds the chain head a tombstone continues).
CREATE FUNCTION purge_operation_history(p_operation_id text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    removed integer := 0;
    n integer;
BEGIN
    IF p_operation_id IS NULL OR p_operation_id = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'purge-no-operation: purge_operation_history needs an operation id';
    END IF;
    IF EXISTS (SELECT 1 FROM outbox WHERE key = p_operation_id AND published_at IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'object_in_use',
            MESSAGE = format('purge-unpublished-outbox: operation %s still has unpublished '
                             'outbox rows', p_operation_id),
            HINT = 'Let the relay publish them (recoveryctl outbox held lists held ones), '
                   'then purge again.';
    END IF;
    DELETE FROM approvals WHERE operation_id = p_operation_id;
    GET DIAGNOSTICS n = ROW_COUNT; removed := removed + n;
    DELETE FROM evidence WHERE operation_id = p_operation_id;
    GET DIAGNOSTICS n = ROW_COUNT; removed := removed + n;
    DELETE FROM decisions WHERE operation_id = p_operation_id;
    GET DIAGNOSTICS n = ROW_COUNT; removed := removed + n;
    DELETE FROM events WHERE operation_id = p_operation_id;
    GET DIAGNOSTICS n = ROW_COUNT; removed := removed + n;
    DELETE FROM audit_records WHERE operation_id = p_operation_id;
    GET DIAGNOSTICS n = ROW_COUNT; removed := removed + n;
    RETURN removed;
END;
$$;

GRANT SELECT, DELETE ON events, decisions, evidence, approvals, audit_records
    TO recovery_retention;
GRANT SELECT ON outbox TO recovery_retention;
-- The new owner needs CREATE on the schema to own a function there (PostgreSQL's rule
-- for ALTER FUNCTION ... OWNER); it cannot log in to use it.
GRANT CREATE ON SCHEMA public TO recovery_retention;
REVOKE ALL ON FUNCTION purge_operation_history(text) FROM PUBLIC;
-- EXECUTE for the owner of the ledger's tables only (recovery_owner when migrated by
-- `recoveryctl db migrate` on a server with the roles).
DO $$
BEGIN
    EXECUTE format('GRANT EXECUTE ON FUNCTION purge_operation_history(text) TO %I',
                   (SELECT tableowner FROM pg_tables
                    WHERE schemaname = 'public' AND tablename = 'events'));
END;
$$;
ALTER FUNCTION purge_operation_history(text) OWNER TO recovery_retention;
