-- Crash quarantine across starts (issue #17; docs/controller.md, "Crash quarantine").
-- A crash the controller cannot catch (a segfault, an OOM kill, SIGKILL) leaves no
-- trace in the batch transaction, so before deciding its first batch of a partition
-- after a claim the controller records here, in a transaction of its own, which offsets
-- that start is attempting. The next claim reads the row back: when the partition's
-- stored offset has not moved past it for `starts` starts in a row, the controller
-- decides that range one record at a time (`single`), and a record that as many starts
-- in a row died on alone (`record_starts`) is dead-lettered as `record-quarantined`, so
-- a restart always makes progress.
--
-- One row per partition, rewritten as attempts move on; not history (the dead letter
-- and its audit record on the intake chain are). `epoch` is the claim that recorded it:
-- the write is fenced like a batch commit, so a zombie cannot move it.
CREATE TABLE partition_attempts (
    consumer_group text NOT NULL,
    topic          text NOT NULL,
    partition      integer NOT NULL CHECK (partition >= 0),
    first_offset   bigint NOT NULL CHECK (first_offset >= 0),
    last_offset    bigint NOT NULL CHECK (last_offset >= first_offset),
    starts         integer NOT NULL CHECK (starts > 0),
    single         boolean NOT NULL,
    record_starts  integer NOT NULL CHECK (record_starts >= 0),
    epoch          bigint NOT NULL CHECK (epoch > 0),
    owner          text NOT NULL,
    attempted_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);
