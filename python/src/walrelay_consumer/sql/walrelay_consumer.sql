-- walrelay-consumer: high-water marks for exactly-once processing of
-- walrelay records (crate `walrelay-consumer`, see its crate docs).
--
-- Idempotent: safe to run on every start (`walrelay_consumer::migrate`).
--
-- One row per (consumer group, topic, partition, source). `hwm` is the
-- highest idempotency key whose side effects this group has committed for
-- that partition and source. A consumer processes a record only when its
-- key is greater than `hwm`, and raises `hwm` to the key in the SAME
-- transaction as the record's side effects, holding the row lock
-- (SELECT ... FOR UPDATE) so that concurrent deliveries of one record
-- serialize and all but the first see it as a duplicate.
--
-- Keys are 128-bit numbers written as exactly 32 lowercase hex digits, so
-- comparing them as text (in any collation: digits and a-f sort the same
-- way everywhere) gives numeric order. A new row starts at 32 zeros, below
-- every real key.
--
-- Keys of different sources (`walrelay-source` header: cluster, database
-- and slot) are not comparable; that is why `source` is part of the key.
--
-- Rows are never deleted by the consumer. Lowering `hwm` by hand makes the
-- group process those records again; raising it skips them. Do either only
-- while every consumer of the group is stopped.

CREATE TABLE IF NOT EXISTS walrelay_consumer_hwm (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL,
    source         text        NOT NULL,
    hwm            text        NOT NULL CHECK (hwm ~ '^[0-9a-f]{32}$'),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition, source)
);

COMMENT ON TABLE walrelay_consumer_hwm IS
    'walrelay-consumer high-water marks: the highest idempotency key processed per (consumer_group, topic, partition, source)';
COMMENT ON COLUMN walrelay_consumer_hwm.hwm IS
    '32 lowercase hex digits; text order equals key order; 32 zeros = nothing processed yet';

-- Parked (dead-lettered) records: records whose handler kept failing, or
-- that carry no walrelay headers, when the consumer's poison policy is
-- `park`. A record with a key is parked in the SAME transaction that raises
-- the mark past it, so it is never lost and never applied twice; the batch
-- fails unless its row was written.
--
-- A parked row is unique on what identifies its event, not on its Kafka
-- offset: offsets repeat when a topic is deleted and recreated or a group
-- fails over to a mirror cluster, events do not.
-- * With walrelay's headers: (group, topic, partition, source, key). The
--   same event parked again (its mark lowered by hand) updates its row.
-- * Without them nothing walrelay wrote identifies the record, so it is
--   (group, topic, partition, offset) plus its content: the consumer parks
--   it when the offset is free, takes an identical row at that offset for
--   the same record delivered again, and refuses (stops the partition,
--   parks nothing) when the row at that offset holds a different record.
--
-- `walrelay_consumer::parked::redrive` applies parked records through the
-- handler and deletes each one in the handler's transaction.
CREATE TABLE IF NOT EXISTS walrelay_consumer_parked (
    id              bigserial   PRIMARY KEY,
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    partition       int         NOT NULL,
    kafka_offset    bigint      NOT NULL,
    idempotency_key text        CHECK (idempotency_key ~ '^[0-9a-f]{32}$'),
    source          text,
    kafka_key       bytea,
    payload         bytea,
    header_names    text[]      NOT NULL,
    header_values   bytea[]     NOT NULL,
    error           text        NOT NULL,
    attempts        int         NOT NULL,
    parked_at       timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE walrelay_consumer_parked IS
    'walrelay-consumer dead letters: records parked by the poison policy, with their error; re-driven by walrelay_consumer::parked::redrive';

-- The indexes are created only when missing (checked first, so that a
-- start does not lock the table when they exist).
DO $$
DECLARE
    old_unique name;
BEGIN
    IF to_regclass('walrelay_consumer_parked_event') IS NULL THEN
        CREATE UNIQUE INDEX IF NOT EXISTS walrelay_consumer_parked_event
            ON walrelay_consumer_parked (consumer_group, topic, partition, source, idempotency_key)
            WHERE idempotency_key IS NOT NULL;
    END IF;
    IF to_regclass('walrelay_consumer_parked_unkeyed') IS NULL THEN
        CREATE UNIQUE INDEX IF NOT EXISTS walrelay_consumer_parked_unkeyed
            ON walrelay_consumer_parked (consumer_group, topic, partition, kafka_offset)
            WHERE idempotency_key IS NULL;
    END IF;
    -- Upgrade of a table created by an earlier version: its rows were
    -- unique on (group, topic, partition, offset), which let a new poison
    -- record at a reused offset vanish (nothing written, mark raised). The
    -- indexes above replace that constraint.
    FOR old_unique IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = 'walrelay_consumer_parked'::regclass AND contype = 'u'
          AND pg_get_constraintdef(oid) = 'UNIQUE (consumer_group, topic, partition, kafka_offset)'
    LOOP
        EXECUTE format('ALTER TABLE walrelay_consumer_parked DROP CONSTRAINT %I', old_unique);
    END LOOP;
END
$$;
