-- The Action Ledger (SPEC §3, §8, §10): operations, events, evidence, decisions,
-- approvals, hash-chained audit records, the transactional outbox, stored consumer
-- offsets and partition-ownership epochs. Every table is keyed by operation id where it
-- holds operation data, so the ledger can later be sharded by operation.

CREATE TABLE operations (
    operation_id         text PRIMARY KEY,
    correlation_id       text NOT NULL,
    machine_name         text NOT NULL,
    machine_version      text NOT NULL,
    machine_digest       text NOT NULL,
    policy_digest        text NOT NULL,
    state                text NOT NULL,
    -- The number of decisions folded into `view`; the optimistic check compares it.
    version              bigint NOT NULL DEFAULT 0 CHECK (version >= 0),
    facts                jsonb NOT NULL,
    retry_attempts       integer NOT NULL DEFAULT 0,
    recovery_attempts    integer NOT NULL DEFAULT 0,
    budget_limit         integer NOT NULL DEFAULT 0,
    budget_spent         integer NOT NULL DEFAULT 0,
    deadline             timestamptz,
    initiating_principal text NOT NULL,
    agent                text NOT NULL,
    runtime              text,
    task                 text NOT NULL,
    origin_operation     text,
    parent_operation     text,
    depth                integer NOT NULL DEFAULT 0 CHECK (depth >= 0),
    -- The whole OperationView the decision core reads, serialised by ledger.codec.
    view                 jsonb NOT NULL,
    -- Head of the operation's audit chain: last sequence and its hash.
    audit_sequence       bigint NOT NULL DEFAULT 0,
    audit_head           text NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX operations_parent_idx ON operations (parent_operation)
    WHERE parent_operation IS NOT NULL;
CREATE INDEX operations_origin_idx ON operations (origin_operation)
    WHERE origin_operation IS NOT NULL;
CREATE INDEX operations_correlation_idx ON operations (correlation_id);

CREATE TABLE events (
    event_id         text PRIMARY KEY,
    payload_digest   text NOT NULL,
    operation_id     text NOT NULL REFERENCES operations (operation_id),
    event_type       text NOT NULL,
    envelope         jsonb NOT NULL,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    recorded_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX events_operation_idx ON events (operation_id);

CREATE TABLE decisions (
    operation_id  text NOT NULL REFERENCES operations (operation_id),
    sequence      bigint NOT NULL CHECK (sequence > 0),
    event_id      text NOT NULL REFERENCES events (event_id),
    outcome       text NOT NULL,
    state_before  text NOT NULL,
    state_after   text NOT NULL,
    decided_at    timestamptz NOT NULL,
    decision      jsonb NOT NULL,
    PRIMARY KEY (operation_id, sequence),
    UNIQUE (event_id)
);

CREATE TABLE evidence (
    operation_id  text NOT NULL REFERENCES operations (operation_id),
    event_id      text NOT NULL REFERENCES events (event_id),
    kind          text NOT NULL,
    source        text,
    trusted       boolean NOT NULL,
    reference     text,
    record        jsonb NOT NULL,
    PRIMARY KEY (event_id, kind)
);

CREATE INDEX evidence_operation_idx ON evidence (operation_id);

CREATE TABLE approvals (
    event_id      text PRIMARY KEY REFERENCES events (event_id),
    operation_id  text NOT NULL REFERENCES operations (operation_id),
    approver      text NOT NULL,
    verdict       text NOT NULL,
    state         text NOT NULL,
    transition    text NOT NULL,
    machine_digest text NOT NULL,
    expires_at    timestamptz NOT NULL,
    nonce         text NOT NULL UNIQUE,
    record        jsonb NOT NULL
);

CREATE INDEX approvals_operation_idx ON approvals (operation_id);

CREATE TABLE audit_records (
    operation_id  text NOT NULL,
    sequence      bigint NOT NULL CHECK (sequence > 0),
    kind          text NOT NULL,
    prev_hash     text NOT NULL,
    hash          text NOT NULL,
    record        jsonb NOT NULL,
    PRIMARY KEY (operation_id, sequence)
);

CREATE TABLE outbox (
    -- Insertion order; the relay publishes each key's rows in this order.
    id            bigserial PRIMARY KEY,
    record_id     text NOT NULL UNIQUE,
    topic         text NOT NULL,
    key           text NOT NULL,
    headers       jsonb NOT NULL,
    -- The exact bytes to publish (canonical JSON, UTF-8): the relay sends them as they
    -- are, and the server does not parse them on the hot path.
    payload       bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);

-- The relay reads only unpublished rows, by key and in order.
CREATE INDEX outbox_unpublished_idx ON outbox (key, id) WHERE published_at IS NULL;

CREATE TABLE consumer_offsets (
    consumer_group text NOT NULL,
    topic          text NOT NULL,
    partition      integer NOT NULL CHECK (partition >= 0),
    next_offset    bigint NOT NULL CHECK (next_offset >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

CREATE TABLE partition_owners (
    consumer_group text NOT NULL,
    topic          text NOT NULL,
    partition      integer NOT NULL CHECK (partition >= 0),
    epoch          bigint NOT NULL CHECK (epoch > 0),
    owner          text NOT NULL,
    claimed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);
