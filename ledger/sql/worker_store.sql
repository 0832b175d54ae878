-- The capability workers' shared execution store (docs/capability-worker.md, "A
-- shared execution store"), run by `ledger.worker_store`. Not a ledger migration: it
-- lives in a schema of its own, on the ledger's server or any other, and the ledger's
-- roles get nothing on it, nor its role anything on the ledger. `{role}` and `{schema}`
-- are identifiers, `{password}` a literal, `{database}` an identifier, quoted by
-- psycopg.sql. Everything here is idempotent.

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(name)s);

-- name: create_role
CREATE ROLE {role} LOGIN;

-- name: restrict_role
-- Whatever an earlier hand edit gave it: log in, nothing else.
ALTER ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;

-- name: set_password
ALTER ROLE {role} PASSWORD {password};

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_table
-- One row per command id, ever. `claimed_by` names the worker process that claimed it
-- (host, pid, a token per store), so that a claim retried after a lost connection is
-- recognised as its own; `answer` is the handler's answer as JSON, set once with `done`.
CREATE TABLE IF NOT EXISTS {schema}.executions (
    command_id  text PRIMARY KEY,
    capability  text NOT NULL,
    state       text NOT NULL CHECK (state IN ('claimed', 'done')),
    claimed_by  text NOT NULL,
    claimed_at  timestamptz NOT NULL,
    done_at     timestamptz,
    answer      text,
    CHECK ((state = 'done') = (answer IS NOT NULL AND done_at IS NOT NULL))
);

-- name: grant_role
-- Claim (INSERT), read, and record an answer (UPDATE of the answer's columns only):
-- never DELETE, TRUNCATE or a change of who claimed what. It may connect and use its
-- own schema; what PUBLIC may do elsewhere is the server's (PostgreSQL 15 gives PUBLIC
-- no CREATE on `public`, and the ledger's tables no grant to PUBLIC).
REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role};
REVOKE CREATE ON SCHEMA {schema} FROM {role};
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT ON {schema}.executions TO {role};
GRANT UPDATE (state, done_at, answer) ON {schema}.executions TO {role};

-- name: lookup
SELECT capability, state, claimed_by, claimed_at, answer
FROM recovery_worker.executions WHERE command_id = %(command_id)s;

-- name: claim
INSERT INTO recovery_worker.executions (command_id, capability, state, claimed_by, claimed_at)
VALUES (%(command_id)s, %(capability)s, 'claimed', %(owner)s, %(at)s)
ON CONFLICT (command_id) DO NOTHING
RETURNING 1;

-- name: record
UPDATE recovery_worker.executions SET state = 'done', done_at = %(at)s, answer = %(answer)s
WHERE command_id = %(command_id)s AND state = 'claimed'
RETURNING 1;

-- name: counts
SELECT state, count(*) FROM recovery_worker.executions GROUP BY state;
