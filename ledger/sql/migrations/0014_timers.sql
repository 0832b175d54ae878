-- Durable timers (issue #29; DESIGN "Time is a recorded fact too"; docs/ledger.md,
-- "Timers"). One row per timer an operation's view holds armed (`machines.timers`): a
-- state's timeout or stall bound, the operation's deadline, a paced retry. The batch
-- commit that arms a timer inserts its row, the one that leaves the state (or ends the
-- operation) deletes it, and the one that decides its event marks it spent, all in the
-- batch's transaction, so this table is always the view's timers as committed.
--
-- Only the controller owning the partition the operation's events arrive on
-- (`topic`, `partition`, from the event that armed it) fires a timer: in a transaction
-- of its own that share-locks the partition's epoch (fenced like a batch), it writes
-- the timer's event to the outbox for recovery.events and sets `fired_at`. The event's
-- id is the timer's, so a timer fires once whatever crashes; its decision is what
-- spends it. Not history (the decision records are): rows go when their state does.
--
-- `timers_due_idx` serves the firing, a bounded slice in due order per call (a row
-- leaves the index once fired); `timers_operation_idx` the commit's deletes and
-- `recoveryctl ops show`. The waiting gauges read the table, one row per waiting
-- operation and timer, which holds live operations only.
CREATE TABLE timers (
    timer_id      text PRIMARY KEY,
    operation_id  text NOT NULL REFERENCES operations (operation_id),
    kind          text NOT NULL,
    machine_name  text NOT NULL,
    state         text NOT NULL,
    armed_version bigint NOT NULL CHECK (armed_version > 0),
    armed_at      timestamptz NOT NULL,
    due_at        timestamptz NOT NULL,
    event_type    text NOT NULL,
    topic         text,
    partition     integer CHECK (partition >= 0),
    fired_at      timestamptz,
    spent_at      timestamptz
);

CREATE INDEX timers_due_idx ON timers (due_at) WHERE fired_at IS NULL;
CREATE INDEX timers_operation_idx ON timers (operation_id);
