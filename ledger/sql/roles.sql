-- The ledger's database roles (issue #15; docs/ledger.md, "Roles and append-only
-- history"), run by `ledger.roles` for `recoveryctl db roles`, the local stack and the
-- tests. Role names are quoted by psycopg.sql: `{role}` is an identifier, `{password}`
-- a literal, `{database}` an identifier. Everything here is idempotent.

-- name: role_attributes
SELECT rolname, rolsuper, rolcanlogin FROM pg_roles WHERE rolname = %(name)s;

-- name: current_role
SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user;

-- name: owner_status
-- Whether recovery_owner exists, whether this session may become it, and whether every
-- role the grants name exists.
-- Becoming the owner is useful only where it owns the schema (`db roles` made it so);
-- elsewhere the migrations run as the connected role, as before the roles existed.
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'recovery_owner'),
       EXISTS (SELECT 1 FROM pg_roles AS r JOIN pg_namespace AS n ON n.nspowner = r.oid
               WHERE r.rolname = 'recovery_owner' AND n.nspname = 'public'
               AND pg_has_role(current_user, r.oid, 'MEMBER')),
       (SELECT count(*) = 5 FROM pg_roles WHERE rolname IN ('recovery_controller',
        'recovery_relay', 'recovery_reader', 'recovery_auditor', 'recovery_retention'));

-- name: create_nologin_role
CREATE ROLE {role} NOLOGIN;

-- name: create_login_role
CREATE ROLE {role} LOGIN;

-- name: restrict_role
-- Whatever an earlier hand edit gave it: no superuser, no role or database creation,
-- no replication (which bypasses row security), no row-security bypass.
ALTER ROLE {role} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;

-- name: set_login
ALTER ROLE {role} LOGIN;

-- name: set_password
ALTER ROLE {role} PASSWORD {password};

-- name: owner_may_assign_retention
-- The owner runs migrations, and migration 0010 gives purge_operation_history to
-- recovery_retention: PostgreSQL lets only a member of the new owner do that.
GRANT recovery_retention TO recovery_owner;

-- name: own_schema
ALTER SCHEMA public OWNER TO recovery_owner;

-- name: connect_database
GRANT CONNECT ON DATABASE {database} TO recovery_owner, recovery_controller, recovery_relay,
    recovery_reader, recovery_auditor;

-- name: reassign_objects
-- A database migrated before the roles existed belongs to whoever migrated it: give its
-- tables, sequences and functions to the owner (the retention function stays with
-- recovery_retention).
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT c.relname, c.relkind FROM pg_class AS c
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
          AND pg_get_userbyid(c.relowner) <> 'recovery_owner'
    LOOP
        EXECUTE format('ALTER TABLE public.%I OWNER TO recovery_owner', item.relname);
    END LOOP;
    FOR item IN
        SELECT p.oid::regprocedure AS signature FROM pg_proc AS p
        JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.proname <> 'purge_operation_history'
          AND pg_get_userbyid(p.proowner) <> 'recovery_owner'
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO recovery_owner', item.signature);
    END LOOP;
END;
$$;

-- name: revoke_login_roles
-- Start from nothing, so that running the grants again also takes back what an older
-- release (or a hand edit) gave; the whole block runs in one transaction.
REVOKE ALL ON ALL TABLES IN SCHEMA public
    FROM recovery_controller, recovery_relay, recovery_reader, recovery_auditor;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public
    FROM recovery_controller, recovery_relay, recovery_reader, recovery_auditor;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public
    FROM recovery_controller, recovery_relay, recovery_reader, recovery_auditor;

-- name: grant_login_roles
GRANT USAGE ON SCHEMA public
    TO recovery_controller, recovery_relay, recovery_reader, recovery_auditor;
GRANT SELECT ON ledger_migrations
    TO recovery_controller, recovery_relay, recovery_reader, recovery_auditor;
-- The controller: append-only history is INSERT only (never UPDATE, DELETE, TRUNCATE);
-- UPDATE only where state moves: operations (folded view, counters, chain head, lineage),
-- intake chain heads, stored offsets, partition epochs and the partitions' attempts
-- (crash quarantine). Outbox rows are inserted, never changed by the controller.
GRANT SELECT, INSERT ON events, decisions, evidence, approvals, audit_records, outbox,
    idempotency_claims TO recovery_controller;
GRANT SELECT, INSERT, UPDATE ON operations, audit_chains, consumer_offsets, partition_owners,
    partition_attempts TO recovery_controller;
-- Timers (migration 0014) are the view's armed timers: armed, fired, spent and deleted
-- with the state that armed them, never history.
GRANT SELECT, INSERT, UPDATE, DELETE ON timers TO recovery_controller;
GRANT USAGE ON SEQUENCE outbox_id_seq TO recovery_controller;
-- The relay: reads unpublished rows with their audit records and the operations' lineage,
-- and may change only the outbox columns it marks (published, held). LISTEN needs no
-- privilege.
GRANT SELECT ON outbox, audit_records, operations TO recovery_relay;
GRANT UPDATE (published_at, held_at, held_reason) ON outbox TO recovery_relay;
-- Read-only recoveryctl commands and auditors: SELECT, nothing else.
GRANT SELECT ON ALL TABLES IN SCHEMA public TO recovery_reader, recovery_auditor;
