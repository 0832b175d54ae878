-- Operator reads (`ledger.inspection`, `recoveryctl ops|review|approve|dlq`): run in one
-- read-only REPEATABLE READ transaction, so a packet or a timeline is one snapshot.
-- Never on the event path.

-- name: list_operations
-- Filters are optional: a NULL parameter matches every row.
SELECT operation_id, correlation_id, machine_name, machine_version, machine_digest,
       policy_digest, state, version, initiating_principal, agent, task,
       created_at, updated_at
FROM operations
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(machine)s::text IS NULL OR machine_name = %(machine)s::text)
  AND (%(version)s::text IS NULL OR machine_version = %(version)s::text)
  AND (%(before)s::timestamptz IS NULL OR updated_at < %(before)s::timestamptz)
ORDER BY updated_at, operation_id
LIMIT %(limit)s;

-- name: machine_states
-- How many operations each machine version holds in each state (`recoveryctl machines
-- rollout|retire`): a scan of the operations table, for an operator, never on the event path.
SELECT machine_name, machine_version, machine_digest, state, count(*)
FROM operations
GROUP BY machine_name, machine_version, machine_digest, state
ORDER BY machine_name, machine_version, machine_digest, state;

-- name: operation_record
SELECT operation_id, correlation_id, machine_name, machine_version, machine_digest,
       policy_digest, state, version, initiating_principal, agent, runtime, task,
       origin_operation, parent_operation, depth, delegated_credentials, ancestors,
       containing, containment_cause, created_at, updated_at
FROM operations WHERE operation_id = %(id)s;

-- name: events_of
-- One operation's events come from one partition (its key), so the source offset
-- orders them; rows without coordinates (none today) go last.
SELECT event_id, event_type, envelope, source_topic, source_partition, source_offset,
       recorded_at
FROM events WHERE operation_id = %(id)s
ORDER BY source_offset NULLS LAST, recorded_at, event_id;

-- name: approvals_of
SELECT event_id, approver, verdict, state, transition, expires_at, nonce
FROM approvals WHERE operation_id = %(id)s ORDER BY expires_at, event_id;

-- name: outbox_of
SELECT id, record_id, topic, created_at, published_at, held_at, held_reason
FROM outbox WHERE key = %(id)s ORDER BY id;

-- name: dead_letters
SELECT id, record_id, key, headers, payload, created_at, published_at
FROM outbox WHERE topic = %(topic)s ORDER BY id;

-- name: dead_letter
SELECT id, record_id, key, headers, payload, created_at, published_at
FROM outbox WHERE topic = %(topic)s AND record_id = %(record_id)s;

-- name: incidents
-- The security incidents the controller recorded (`machines.opening`): audit records of
-- the intake chains whose body carries an `incident`, in chain order; one operation's
-- (%(id)s), or all. Incidents are rare: the scan reads the intake chains' records only.
SELECT operation_id, sequence, record->'incident'
FROM audit_records
WHERE operation_id LIKE 'intake:%%' AND record->'incident' IS NOT NULL
  AND (%(id)s::text IS NULL OR record->>'operation_id' = %(id)s)
ORDER BY operation_id, sequence;

-- name: search_operations
-- Operations of one agent, task, initiating principal, correlation id or declared
-- idempotency key (each filter optional, a NULL matches every row; %(term)s matches any
-- of them or the operation id), most recently changed first. The idempotency key is read
-- from the declared facts without an index: an operator's read, bounded by %(limit)s.
SELECT operation_id, correlation_id, machine_name, machine_version, machine_digest,
       policy_digest, state, version, initiating_principal, agent, task,
       created_at, updated_at
FROM operations
WHERE (%(agent)s::text IS NULL OR agent = %(agent)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(principal)s::text IS NULL OR initiating_principal = %(principal)s::text)
  AND (%(correlation)s::text IS NULL OR correlation_id = %(correlation)s::text)
  AND (%(key)s::text IS NULL OR facts->>'idempotency_key' = %(key)s::text)
  AND (%(term)s::text IS NULL
       OR %(term)s::text IN (operation_id, agent, task, initiating_principal, correlation_id)
       OR facts->>'idempotency_key' = %(term)s::text)
ORDER BY updated_at DESC, operation_id
LIMIT %(limit)s;

-- name: overdue_timers
-- Timers not decided yet though due before %(before)s, oldest due first
-- (`recoveryctl ops list --overdue`): unfired (no owner fired them), or fired with the
-- event not decided (the relay or the controller is behind, or stopped).
SELECT t.operation_id, t.timer_id, t.kind, t.state, t.event_type, t.armed_at, t.due_at,
       t.fired_at, o.machine_name, o.machine_version
FROM timers AS t
JOIN operations AS o ON o.operation_id = t.operation_id
WHERE t.spent_at IS NULL AND t.due_at < %(before)s
ORDER BY t.due_at, t.timer_id
LIMIT %(limit)s;

-- name: timers_of
-- One operation's armed timers as the table holds them, fired or not (`ops show`).
SELECT timer_id, fired_at, spent_at FROM timers WHERE operation_id = %(id)s;
