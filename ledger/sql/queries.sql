-- Named queries of the Action Ledger, loaded by ledger.queries. Each block starts with
-- a "-- name: <name>" line; the comment lines right after it describe the query.
-- Parameters use psycopg's %(name)s style.

-- name: create_migrations_table
-- The tracking table of applied migrations.
CREATE TABLE IF NOT EXISTS ledger_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: lock_migrations
-- Serialise concurrent `db migrate` runs for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtext('ledger_migrations'));

-- name: applied_migrations
SELECT version, name, checksum FROM ledger_migrations ORDER BY version;

-- name: record_migration
INSERT INTO ledger_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: claim_partition
-- Bump the partition's ownership epoch; a batch holding the old epoch can no longer commit.
INSERT INTO partition_owners (consumer_group, topic, partition, epoch, owner)
VALUES (%(group)s, %(topic)s, %(partition)s, 1, %(owner)s)
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
    SET epoch = partition_owners.epoch + 1, owner = EXCLUDED.owner, claimed_at = now()
RETURNING epoch;

-- name: stored_offsets
SELECT partition, next_offset FROM consumer_offsets
WHERE consumer_group = %(group)s AND topic = %(topic)s
ORDER BY partition;

-- name: partition_attempts
-- What the starts of a topic's partitions last attempted (crash quarantine, migration 0011).
SELECT partition, first_offset, last_offset, starts, single, owner, record_starts
FROM partition_attempts
WHERE consumer_group = %(group)s AND topic = %(topic)s
ORDER BY partition;

-- name: record_attempt
-- Record what a start is about to decide, only while `epoch` still owns the partition
-- (no row returned: a newer claim fenced it).
INSERT INTO partition_attempts AS a (consumer_group, topic, partition, first_offset,
                                     last_offset, starts, single, record_starts, epoch,
                                     owner)
SELECT o.consumer_group, o.topic, o.partition, %(first)s, %(last)s, %(starts)s,
       %(single)s, %(record_starts)s, o.epoch, o.owner
FROM partition_owners AS o
WHERE o.consumer_group = %(group)s AND o.topic = %(topic)s AND o.partition = %(partition)s
  AND o.epoch = %(epoch)s
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
    SET first_offset = EXCLUDED.first_offset, last_offset = EXCLUDED.last_offset,
        starts = EXCLUDED.starts, single = EXCLUDED.single,
        record_starts = EXCLUDED.record_starts, epoch = EXCLUDED.epoch,
        owner = EXCLUDED.owner, attempted_at = now()
RETURNING a.partition;

-- name: check_epochs
-- The epochs of the batch's partitions, share-locked until commit: a concurrent claim
-- (an UPDATE of the same row) waits for this transaction, so the check holds at commit.
SELECT o.topic, o.partition, o.epoch
FROM partition_owners AS o
JOIN unnest(%(topics)s::text[], %(partitions)s::integer[]) AS u (topic, partition)
    ON o.topic = u.topic AND o.partition = u.partition
WHERE o.consumer_group = %(group)s
ORDER BY o.topic, o.partition
FOR SHARE OF o;

-- name: load_views
-- The views with the lineage columns `ledger.cascade.with_lineage` lays over them.
-- The view comes as its text, which the ledger parses and validates in one pass.
SELECT operation_id, view::text, ancestors, lineage_agents, contained_ancestors,
       descendant_agents
FROM operations WHERE operation_id = ANY(%(ids)s);

-- name: insert_operations
-- The operations a batch opens, written once in their state after the batch and with
-- the lineage the step linked them into. One array per column, sent in binary (`%(x)b`)
-- and unpacked by `unnest`: the server copies each value out of its array without
-- parsing anything but the `json` values, which its input function checks once (a JSON
-- document of rows unpacked by `json_to_recordset` was parsed whole, then each view
-- checked again: 9% of the server's CPU). A json value is stored as the text sent. The
-- text-array columns come as JSON arrays, one per row (an array of arrays must be
-- rectangular); NULL is an empty array. A row another writer inserted first wins (ON
-- CONFLICT DO NOTHING): it is missing from RETURNING and the batch is refused.
INSERT INTO operations (
    operation_id, correlation_id, machine_name, machine_version, machine_digest,
    policy_digest, state, version, facts, retry_attempts, recovery_attempts, budget_limit,
    budget_spent, deadline, initiating_principal, agent, runtime, task, origin_operation,
    parent_operation, depth, view, audit_sequence, audit_head, delegated_credentials,
    ancestors, lineage_agents, contained_ancestors, containing, containment_cause,
    descendant_agents
)
SELECT
    n.operation_id, n.correlation_id, n.machine_name, n.machine_version, n.machine_digest,
    n.policy_digest, n.state, n.version, n.facts, n.retry_attempts, n.recovery_attempts,
    n.budget_limit, n.budget_spent, n.deadline, n.initiating_principal, n.agent, n.runtime,
    n.task, n.origin_operation, n.parent_operation,
    COALESCE(p.depth + 1, CASE WHEN n.parent_operation IS NULL THEN 0 ELSE 1 END),
    n.view, n.audit_sequence, n.audit_head,
    ARRAY(SELECT json_array_elements_text(n.delegated_credentials)),
    ARRAY(SELECT json_array_elements_text(n.ancestors)),
    ARRAY(SELECT json_array_elements_text(n.lineage_agents)),
    ARRAY(SELECT json_array_elements_text(n.contained_ancestors)),
    COALESCE(n.containing, false), n.containment_cause,
    ARRAY(SELECT json_array_elements_text(n.descendant_agents))
FROM unnest(
    %(operation_id)b::text[], %(correlation_id)b::text[], %(machine_name)b::text[],
    %(machine_version)b::text[], %(machine_digest)b::text[], %(policy_digest)b::text[],
    %(state)b::text[], %(version)b::bigint[], %(facts)b::json[],
    %(retry_attempts)b::integer[], %(recovery_attempts)b::integer[],
    %(budget_limit)b::integer[], %(budget_spent)b::integer[], %(deadline)b::timestamptz[],
    %(initiating_principal)b::text[], %(agent)b::text[], %(runtime)b::text[],
    %(task)b::text[], %(origin_operation)b::text[], %(parent_operation)b::text[],
    %(view)b::json[], %(audit_sequence)b::bigint[], %(audit_head)b::text[],
    %(delegated_credentials)b::json[], %(ancestors)b::json[], %(lineage_agents)b::json[],
    %(contained_ancestors)b::json[], %(containing)b::boolean[],
    %(containment_cause)b::text[], %(descendant_agents)b::json[]
) AS n (
    operation_id, correlation_id, machine_name, machine_version, machine_digest,
    policy_digest, state, version, facts, retry_attempts, recovery_attempts, budget_limit,
    budget_spent, deadline, initiating_principal, agent, runtime, task, origin_operation,
    parent_operation, view, audit_sequence, audit_head, delegated_credentials, ancestors,
    lineage_agents, contained_ancestors, containing, containment_cause, descendant_agents
)
LEFT JOIN operations AS p ON p.operation_id = n.parent_operation
ORDER BY n.operation_id
ON CONFLICT (operation_id) DO NOTHING
RETURNING operation_id;

-- name: lock_operations
-- Lock the operations the batch continues, in id order, so two writers never deadlock;
-- their lineage columns tell whether a cascade or a link moved on since the batch loaded,
-- and the lineage they were opened with goes into their commands (signed with them).
SELECT operation_id, version, audit_sequence, audit_head, contained_ancestors,
       lineage_agents || descendant_agents,
       agent, task, initiating_principal, origin_operation, parent_operation,
       delegated_credentials
FROM operations
WHERE operation_id = ANY(%(ids)s)
ORDER BY operation_id
FOR UPDATE;

-- name: existing_events
SELECT event_id, operation_id FROM events WHERE event_id = ANY(%(ids)s);

-- name: existing_nonces
SELECT nonce, event_id FROM approvals WHERE nonce = ANY(%(nonces)s);

-- The append-only rows of a batch (`ledger.postgres_commit`), one INSERT per table at
-- every batch size, in the pipeline of the operations' writes (a prepared INSERT is
-- parsed and planned once; a COPY costs two round trips and a statement set up every
-- time, and saved too little per row on large batches to keep as a second path). One
-- binary array per column, as in insert_operations, whose element types are listed in
-- ledger/postgres_commit.py (_TABLE_TYPES); a json column's text is cast, which checks
-- it and stores the text as sent. `unnest` yields the rows in array order, so the outbox
-- ids follow it.

-- name: insert_events
INSERT INTO events (event_id, payload_digest, operation_id, event_type, envelope,
                    source_topic, source_partition, source_offset)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::text[], %(c2)b::text[], %(c3)b::text[], %(c4)b::text[]::json[],
    %(c5)b::text[], %(c6)b::integer[], %(c7)b::bigint[]
);

-- name: insert_decisions
INSERT INTO decisions (operation_id, sequence, event_id, outcome, state_before,
                       state_after, decided_at, decision)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::bigint[], %(c2)b::text[], %(c3)b::text[], %(c4)b::text[],
    %(c5)b::text[], %(c6)b::timestamptz[], %(c7)b::text[]::json[]
);

-- name: insert_evidence
INSERT INTO evidence (operation_id, event_id, kind, source, trusted, reference, record)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::text[], %(c2)b::text[], %(c3)b::text[], %(c4)b::boolean[],
    %(c5)b::text[], %(c6)b::text[]::json[]
);

-- name: insert_approvals
INSERT INTO approvals (event_id, operation_id, approver, verdict, state, transition,
                       machine_digest, expires_at, nonce, record)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::text[], %(c2)b::text[], %(c3)b::text[], %(c4)b::text[],
    %(c5)b::text[], %(c6)b::text[], %(c7)b::timestamptz[], %(c8)b::text[],
    %(c9)b::text[]::json[]
);

-- name: insert_audit_records
INSERT INTO audit_records (operation_id, sequence, kind, prev_hash, hash, record)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::bigint[], %(c2)b::text[], %(c3)b::text[], %(c4)b::text[],
    %(c5)b::text[]::json[]
);

-- name: insert_outbox
INSERT INTO outbox (record_id, topic, key, headers, payload, audit_sequence, value)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::text[], %(c2)b::text[], %(c3)b::text[]::json[],
    %(c4)b::bytea[], %(c5)b::bigint[], %(c6)b::bytea[]
);

-- name: update_operations
-- Every touched operation's folded view and chain head, in one statement; one binary
-- array per column, as in insert_operations.
UPDATE operations AS o SET
    state = u.state,
    version = u.version,
    view = u.view,
    retry_attempts = u.retry_attempts,
    recovery_attempts = u.recovery_attempts,
    budget_spent = u.budget_spent,
    audit_sequence = u.audit_sequence,
    audit_head = u.audit_head,
    updated_at = now()
FROM unnest(
    %(operation_id)b::text[], %(state)b::text[], %(version)b::bigint[], %(view)b::json[],
    %(retry_attempts)b::integer[], %(recovery_attempts)b::integer[],
    %(budget_spent)b::integer[], %(audit_sequence)b::bigint[], %(audit_head)b::text[]
) AS u (
    operation_id, state, version, view, retry_attempts, recovery_attempts, budget_spent,
    audit_sequence, audit_head
)
WHERE o.operation_id = u.operation_id;

-- name: migrate_operations
-- The operations a batch moved to another version of their machine (a signed migration,
-- machines.migration): the machine columns follow the folded view. Rare, so apart from
-- update_operations, which every batch runs.
UPDATE operations AS o SET machine_version = u.machine_version, machine_digest = u.machine_digest
FROM unnest(%(operation_id)s::text[], %(machine_version)s::text[], %(machine_digest)s::text[])
    AS u (operation_id, machine_version, machine_digest)
WHERE o.operation_id = u.operation_id;

-- name: store_offsets
INSERT INTO consumer_offsets (consumer_group, topic, partition, next_offset)
SELECT %(group)s, u.topic, u.partition, u.next_offset
FROM unnest(%(topics)s::text[], %(partitions)s::integer[], %(offsets)s::bigint[])
    AS u (topic, partition, next_offset)
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
    SET next_offset = EXCLUDED.next_offset, updated_at = now();

-- name: operation_info
SELECT operation_id, correlation_id, machine_name, machine_version, machine_digest, state,
       version, initiating_principal, agent, runtime, task, origin_operation,
       parent_operation, depth, delegated_credentials
FROM operations WHERE operation_id = %(id)s;

-- name: lineage_lock_keys
-- Serialise the lineage steps of batches that open related operations (a parent and a
-- child reported at the same time must see each other): one transaction-scoped advisory
-- lock per opened operation and per named parent, taken in sorted order.
SELECT pg_advisory_xact_lock(hashtextextended('lineage:' || k, 0))
FROM unnest(%(keys)s::text[]) AS k ORDER BY k;

-- name: lineage_rows
-- The lineage walk: the named rows and every row below the given roots by parent
-- pointers, locked, so a concurrent link or containment waits for this batch.
-- The ids are gathered into one array first (an InitPlan) and the rows fetched with
-- `= ANY` of it, by primary key: three ORed conditions were planned as a filter over
-- every row of the table, and an IN over the UNION as a hash join over a sequential
-- scan of the whole table (49 ms at 200,000 operations) as soon as a parent was named.
-- The walk is a UNION ALL: every row has one parent, so a row is reached at a given
-- level by one path only and the walk yields no duplicate (operation_id, level) pair
-- for UNION to remove (a cycle of parent pointers is still cut at level 64). UNION
-- built a hash table sized by the planner's estimate of the walk, which on a growing
-- table whose statistics lag runs into millions of rows: clearing up to `hash_mem`
-- (8 MB by default) on every batch that opens an operation was 2% of the server's CPU.
WITH RECURSIVE tree (operation_id, level) AS (
    SELECT operation_id, 1 FROM operations WHERE parent_operation = ANY(%(roots)s)
    UNION ALL
    SELECT o.operation_id, t.level + 1
    FROM operations AS o JOIN tree AS t ON o.parent_operation = t.operation_id
    WHERE t.level < 64
)
SELECT operation_id, correlation_id, machine_name, machine_version, state, agent, task,
       initiating_principal, origin_operation, parent_operation, delegated_credentials,
       ancestors, lineage_agents, contained_ancestors, containing, containment_cause,
       descendant_agents
FROM operations
WHERE operation_id = ANY (ARRAY(
    SELECT unnest(%(ids)s::text[])
    UNION
    SELECT operation_id FROM tree
    UNION
    SELECT unnest(ancestors) FROM operations WHERE operation_id = ANY(%(ids)s)
))
ORDER BY operation_id
FOR UPDATE;

-- name: update_lineage
-- The lineage columns `ledger.cascade.plan_lineage` changed on rows stored before the
-- batch, in one statement; one binary array per column, as in insert_operations (the
-- text-array columns as JSON arrays). Its rows unpacked from one JSON document by
-- `json_to_recordset` (which the planner takes for 100 rows whatever it holds) cost
-- 2.0-2.4 ms and about 800 buffer hits per call for 3-6 rows, the costliest statement
-- of a batch at 500 events/s in the bench (pg_stat_statements); as arrays, 0.2 ms and 37.
UPDATE operations AS o SET
    ancestors = ARRAY(SELECT json_array_elements_text(u.ancestors)),
    lineage_agents = ARRAY(SELECT json_array_elements_text(u.lineage_agents)),
    contained_ancestors = ARRAY(SELECT json_array_elements_text(u.contained_ancestors)),
    containing = u.containing,
    containment_cause = u.containment_cause,
    descendant_agents = ARRAY(SELECT json_array_elements_text(u.descendant_agents))
FROM unnest(
    %(operation_id)b::text[], %(ancestors)b::json[], %(lineage_agents)b::json[],
    %(contained_ancestors)b::json[], %(containing)b::boolean[],
    %(containment_cause)b::text[], %(descendant_agents)b::json[]
) AS u (
    operation_id, ancestors, lineage_agents, contained_ancestors, containing,
    containment_cause, descendant_agents
)
WHERE o.operation_id = u.operation_id;

-- name: insert_cascade
-- Cascade events: a replayed lineage step may plan one already stored; it is kept (the
-- row count says how many were inserted).
INSERT INTO outbox (record_id, topic, key, headers, payload, value)
SELECT u.record_id, u.topic, u.key, u.headers, convert_to(u.payload, 'UTF8'),
       decode(u.value, 'base64')
FROM json_to_recordset(%(rows)s::json) AS u (
    record_id text, topic text, key text, headers json, payload text, value text
)
ORDER BY u.key, u.record_id
ON CONFLICT (record_id) DO NOTHING;

-- name: arrival_rows
-- The stored rows the lineage of operations about to be opened comes from
-- (`Ledger.arrival_lineage`): their named parents, and the rows naming one of them as
-- parent (children reported first). Two index lookups, no walk: the denormalised
-- lineage columns of these rows already hold the rest of the chain.
-- The opener of each row (from its view) is what a child reported first is linked by
-- (`machines.may_link`).
SELECT operation_id, correlation_id, machine_name, machine_version, state, agent, task,
       initiating_principal, origin_operation, parent_operation, delegated_credentials,
       ancestors, lineage_agents, contained_ancestors, containing, containment_cause,
       descendant_agents, view->>'opened_by'
FROM operations
WHERE operation_id = ANY(%(parents)s) OR parent_operation = ANY(%(ids)s);

-- name: key_claims
-- The stored owners of idempotency claim keys (`Ledger.key_claims`): one primary-key
-- lookup per key, the three parallel arrays unpacked together.
SELECT c.principal, c.capability, c.idempotency_key, c.operation_id, c.arguments_digest
FROM unnest(%(principals)b::text[], %(capabilities)b::text[], %(keys)b::text[])
     AS k (principal, capability, idempotency_key)
JOIN idempotency_claims AS c USING (principal, capability, idempotency_key);

-- name: insert_claims
-- The claims of the operations a batch opens. A key another operation holds already
-- (a concurrent batch won it, or an earlier row of this statement) is not written for
-- this operation and is missing from RETURNING: the batch is refused and decided again
-- on that owner.
INSERT INTO idempotency_claims (principal, capability, idempotency_key, operation_id,
                                arguments_digest, claimed_at)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::text[], %(c2)b::text[], %(c3)b::text[], %(c4)b::text[],
    %(c5)b::timestamptz[]
)
ON CONFLICT DO NOTHING
RETURNING principal, capability, idempotency_key, operation_id;

-- name: lineage_of
SELECT operation_id, correlation_id, machine_name, machine_version, state, agent, task,
       initiating_principal, origin_operation, parent_operation, delegated_credentials,
       ancestors, lineage_agents, contained_ancestors, containing, containment_cause,
       descendant_agents
FROM operations WHERE operation_id = %(id)s;

-- name: lineage_subtree
-- An operation and every operation below it, as lineage rows, shallowest first.
WITH RECURSIVE tree (operation_id, level) AS (
    SELECT operation_id, 0 FROM operations WHERE operation_id = %(id)s
    UNION
    SELECT o.operation_id, t.level + 1
    FROM operations AS o JOIN tree AS t ON o.parent_operation = t.operation_id
    WHERE t.level < 64
)
SELECT o.operation_id, o.correlation_id, o.machine_name, o.machine_version, o.state,
       o.agent, o.task, o.initiating_principal, o.origin_operation, o.parent_operation,
       o.delegated_credentials, o.ancestors, o.lineage_agents, o.contained_ancestors,
       o.containing, o.containment_cause, o.descendant_agents
FROM operations AS o JOIN (
    SELECT operation_id, min(level) AS level FROM tree GROUP BY operation_id
) AS t ON t.operation_id = o.operation_id
ORDER BY t.level, o.operation_id;

-- name: descendants
-- The lineage walk: every operation whose parent chain leads to the given one.
WITH RECURSIVE tree (operation_id, level) AS (
    SELECT operation_id, 1 FROM operations WHERE parent_operation = %(id)s
    UNION
    SELECT o.operation_id, t.level + 1
    FROM operations AS o JOIN tree AS t ON o.parent_operation = t.operation_id
    WHERE t.level < 64
)
SELECT operation_id, min(level) AS level FROM tree
GROUP BY operation_id ORDER BY level, operation_id;

-- name: decisions_of
SELECT decision FROM decisions WHERE operation_id = %(id)s ORDER BY sequence;

-- name: lease_settings
-- Planner settings of an outbox lease's transaction, sent before lease_outbox_heads.
-- With a backlog of a few keys the statistics may put the unpublished rows at a few
-- dozen, and the heads were then read by a bitmap heap scan, which rechecks on the heap
-- every index entry of a row published since the last vacuum and never marks one dead:
-- each lease of a relay that keeps up paid for every row published since then. An index
-- scan marks dead entries as it meets them and skips them afterwards. With a large
-- backlog the plan is a sequential scan either way. The lease's other statements look
-- rows up by a bounded list of keys, which index scans serve as well.
SET LOCAL enable_bitmapscan = off;

-- name: lease_outbox_heads
-- The oldest unpublished row of up to %(limit)s keys, locked; rows already leased by
-- another relay are skipped. Holding a key's oldest row blocks every other relay from
-- that key (see lease_outbox_rows), so a key is never published out of order.
-- The heads considered are the oldest 4 * %(limit)s (four relays' full leases) and the
-- limit counts only the rows this lease could lock: a relay leasing while another
-- publishes takes the next keys of the backlog. With the limit on the heads themselves,
-- every relay after the first found the same oldest keys locked and leased nothing
-- until they were published, so a second relay added no throughput.
-- Shaped so that no plan can go quadratic: the heads come from one pass over the
-- partial index of unpublished rows (grouped by key), and are locked by primary key.
-- The former NOT EXISTS anti-join was planned as a nested loop over the whole backlog
-- whenever the statistics predated it (the outbox fills faster than autoanalyze runs):
-- 30-90 s per lease at 20,000 unpublished rows, which stalled the relay.
-- A key whose head is held (an unpublishable row, migration 0007) is left out before the
-- limit, so held keys never fill a lease; the anti-join probes the small held index.
SELECT o.key
FROM outbox AS o
WHERE o.id = ANY (ARRAY(
      SELECT h.id FROM (
          SELECT min(u.id) AS id FROM outbox AS u
          WHERE u.published_at IS NULL
          GROUP BY u.key
      ) AS h
      WHERE NOT EXISTS (
          SELECT 1 FROM outbox AS x
          WHERE x.id = h.id AND x.held_at IS NOT NULL AND x.published_at IS NULL
      )
      ORDER BY h.id
      LIMIT 4 * %(limit)s
  ))
  AND o.published_at IS NULL
  AND o.held_at IS NULL
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: lease_outbox_rows
-- The leased keys' unpublished rows in order. A row with the value the controller signed
-- (migration 0012) is published as it is, so the relay's lease (`payloads` false) reads
-- neither its payload nor, for an audit row, its audit record: both come back NULL, and
-- the record is looked up only for a row without a value (the CASE runs the subquery for those alone; a LEFT JOIN probed
-- audit_records and built the record's JSON for every audit row). Without a value, the
-- relay encodes the payload, or an audit row's record joined back in (migration 0004),
-- its stored text embedded as it is.
SELECT o.id, o.record_id, o.topic, o.key, o.headers,
       CASE WHEN o.value IS NULL OR %(payloads)s THEN o.payload END,
       CASE WHEN (o.value IS NULL OR %(payloads)s) AND o.audit_sequence IS NOT NULL THEN (
           SELECT json_build_object(
               'hash', a.hash, 'kind', a.kind, 'operation_id', a.operation_id,
               'prev_hash', a.prev_hash, 'record', a.record, 'sequence', a.sequence
           )
           FROM audit_records AS a
           WHERE a.operation_id = o.key AND a.sequence = o.audit_sequence
       ) END,
       o.value
FROM outbox AS o
WHERE o.published_at IS NULL AND o.key = ANY(%(keys)s)
ORDER BY o.id;

-- name: mark_published
-- By primary key: the lease read each row's id, and its locks on the keys' heads keep
-- every other relay off these rows until it commits.
UPDATE outbox SET published_at = now()
WHERE id = ANY(%(ids)s) AND published_at IS NULL;

-- name: hold_outbox_row
-- The relay's verdict on an unpublishable row, committed with the lease's marks.
UPDATE outbox SET held_at = now(), held_reason = %(reason)s
WHERE record_id = %(id)s AND key = ANY(%(keys)s) AND published_at IS NULL AND held_at IS NULL;

-- name: held_outbox_rows
-- Every held row, oldest first, with how many unpublished rows of its key wait behind it.
SELECT o.id, o.record_id, o.topic, o.key, o.held_at, o.held_reason,
       (SELECT count(*) FROM outbox AS w
        WHERE w.key = o.key AND w.published_at IS NULL AND w.id > o.id) AS waiting
FROM outbox AS o
WHERE o.held_at IS NOT NULL AND o.published_at IS NULL
ORDER BY o.id;

-- name: audit_outbox_rows
-- The outbox rows of audit records, published or not, with what the controller signed
-- for each (`Ledger.audit_outbox`, `recoveryctl audit verify`); one chain, or all. A
-- purge's tombstone row stores its payload, not a reference: its sequence is in it.
SELECT key, seq, id, record_id, topic, headers, value, created_at, published_at
FROM (
    SELECT o.*, COALESCE(
        o.audit_sequence,
        CASE WHEN o.headers->>'kind' = 'tombstone'
             THEN (convert_from(o.payload, 'UTF8')::json->>'sequence')::bigint END
    ) AS seq
    FROM outbox AS o
    WHERE %(id)s::text IS NULL OR o.key = %(id)s
) AS rows
WHERE seq IS NOT NULL
ORDER BY key, seq;

-- name: release_outbox_row
UPDATE outbox SET held_at = NULL, held_reason = NULL
WHERE record_id = %(id)s AND held_at IS NOT NULL AND published_at IS NULL
RETURNING key;

-- name: audit_operation_ids
SELECT operation_id FROM operations
UNION
SELECT DISTINCT operation_id FROM audit_records
ORDER BY 1;

-- name: audit_records_of
SELECT operation_id, sequence, kind, prev_hash, hash, record
FROM audit_records WHERE operation_id = %(id)s ORDER BY sequence;

-- name: audit_decision_rows
-- The decision rows an audit/2 chain commits to (`ledger.audit.verify_subject`).
SELECT sequence, outcome, state_before, state_after, decision
FROM decisions WHERE operation_id = %(id)s ORDER BY sequence;

-- name: audit_operation_row
SELECT state, version, retry_attempts, recovery_attempts, budget_spent, view
FROM operations WHERE operation_id = %(id)s;

-- name: audit_head_of
-- An operation's chain head, or an intake chain's (ledger.deadletters).
SELECT audit_sequence, audit_head FROM operations WHERE operation_id = %(id)s
UNION ALL
SELECT audit_sequence, audit_head FROM audit_chains WHERE chain_id = %(id)s;

-- name: open_audit_chains
-- Start the intake chains a batch dead-letters into, at their genesis hash.
INSERT INTO audit_chains (chain_id, audit_head)
SELECT * FROM unnest(%(ids)s::text[], %(heads)s::text[])
ON CONFLICT (chain_id) DO NOTHING;

-- name: lock_audit_chains
SELECT chain_id, audit_sequence, audit_head
FROM audit_chains
WHERE chain_id = ANY(%(ids)s)
ORDER BY chain_id
FOR UPDATE;

-- name: move_audit_chains
UPDATE audit_chains AS c SET audit_sequence = u.sequence, audit_head = u.head
FROM unnest(%(ids)s::text[], %(sequences)s::bigint[], %(heads)s::text[])
    AS u (chain_id, sequence, head)
WHERE c.chain_id = u.chain_id;

-- name: purge_candidates
-- Retention (recoveryctl audit purge): operations untouched since %(before)s whose chain
-- holds more than a tombstone, oldest first.
SELECT o.operation_id, o.machine_name, o.updated_at
FROM operations AS o
WHERE o.updated_at < %(before)s
  AND EXISTS (SELECT 1 FROM audit_records AS a
              WHERE a.operation_id = o.operation_id AND a.kind <> 'tombstone')
ORDER BY o.updated_at, o.operation_id;

-- name: purge_lock_head
-- The chain head a purge's tombstone continues, locked for the purge's transaction.
SELECT audit_sequence, audit_head FROM operations WHERE operation_id = %(id)s FOR UPDATE;

-- name: purge_history
SELECT purge_operation_history(%(id)s);

-- name: insert_tombstone
INSERT INTO audit_records (operation_id, sequence, kind, prev_hash, hash, record)
VALUES (%(id)s, %(sequence)s, 'tombstone', %(prev_hash)s, %(hash)s, %(record)s::json);

-- name: move_purged_head
UPDATE operations SET audit_sequence = %(sequence)s, audit_head = %(hash)s
WHERE operation_id = %(id)s;

-- name: insert_tombstone_outbox
INSERT INTO outbox (record_id, topic, key, headers, payload, value)
VALUES (
    %(record_id)s, %(topic)s, %(key)s, %(headers)s::json, convert_to(%(payload)s, 'UTF8'),
    %(value)s
);

-- Timers (migration 0014; `ledger.timers`, `machines.timers`).

-- name: insert_timers
-- The timers a batch's decisions armed, in the batch's write pipeline (after the
-- operations it opens): one binary array per column, as the append-only rows. A timer
-- armed and spent in the same batch is stored spent.
INSERT INTO timers (timer_id, operation_id, kind, machine_name, state, armed_version,
                    armed_at, due_at, event_type, topic, partition, spent_at)
SELECT u.timer_id, u.operation_id, u.kind, u.machine_name, u.state, u.armed_version,
       u.armed_at, u.due_at, u.event_type, u.topic, u.partition,
       CASE WHEN u.spent THEN now() END
FROM unnest(
    %(c0)b::text[], %(c1)b::text[], %(c2)b::text[], %(c3)b::text[], %(c4)b::text[],
    %(c5)b::bigint[], %(c6)b::timestamptz[], %(c7)b::timestamptz[], %(c8)b::text[],
    %(c9)b::text[], %(c10)b::integer[], %(c11)b::boolean[]
) AS u (timer_id, operation_id, kind, machine_name, state, armed_version, armed_at, due_at,
        event_type, topic, partition, spent)
ON CONFLICT (timer_id) DO NOTHING;

-- name: delete_timers
-- The timers a batch disarmed: their state was left, or the operation ended.
DELETE FROM timers WHERE timer_id = ANY(%(ids)s);

-- name: spend_timers
-- The timers whose events a batch decided.
UPDATE timers SET spent_at = now() WHERE timer_id = ANY(%(ids)s) AND spent_at IS NULL;

-- name: due_timers
-- A slice of the timers due at %(now)s on the partitions of one topic this controller
-- owns, earliest first, with their operations' identity for the events; locked, so a
-- second firing in flight (a zombie's, fenced anyway) skips them. Read in due order from
-- the partial index of unfired timers: each call reads about the slice, however many
-- timers are due.
SELECT t.timer_id, t.kind, t.state, t.armed_version, t.armed_at, t.due_at, t.event_type,
       t.operation_id, o.correlation_id, o.machine_name, o.machine_version, o.agent, o.task,
       o.initiating_principal, o.origin_operation, o.parent_operation,
       o.delegated_credentials
FROM timers AS t
JOIN operations AS o ON o.operation_id = t.operation_id
WHERE t.fired_at IS NULL AND t.due_at <= %(now)s
  AND t.topic = %(topic)s AND t.partition = ANY(%(partitions)s)
ORDER BY t.due_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED;

-- name: insert_timer_events
-- The fired timers' events, for the events topic, in due order (so each key's rows keep
-- it). A row stored by an earlier firing of the same timer is kept.
INSERT INTO outbox (record_id, topic, key, headers, payload, value)
SELECT * FROM unnest(
    %(c0)b::text[], %(c1)b::text[], %(c2)b::text[], %(c3)b::text[]::json[],
    %(c4)b::bytea[], %(c5)b::bytea[]
)
ON CONFLICT (record_id) DO NOTHING;

-- name: mark_fired
UPDATE timers SET fired_at = %(at)s WHERE timer_id = ANY(%(ids)s) AND fired_at IS NULL;

-- name: waiting_operations
-- Operations waiting per machine and state on one topic's partitions: every operation
-- in a state that is not final has that state's timer (a timeout or the stall bound)
-- until it leaves, so the table answers without reading the operations.
SELECT machine_name, state, count(*), min(armed_at),
       count(*) FILTER (WHERE kind = 'stalled' AND spent_at IS NOT NULL)
FROM timers
WHERE kind IN ('state', 'stalled') AND topic = %(topic)s AND partition = ANY(%(partitions)s)
GROUP BY machine_name, state
ORDER BY machine_name, state;

-- name: timer_counts
-- Armed timers on one topic's partitions, and those overdue: not decided yet (unfired,
-- or fired with the event not decided) though due before %(before)s.
SELECT count(*), count(*) FILTER (WHERE spent_at IS NULL AND due_at < %(before)s)
FROM timers
WHERE topic = %(topic)s AND partition = ANY(%(partitions)s);
