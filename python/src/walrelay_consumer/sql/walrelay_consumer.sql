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
-- the mark past it, so it is never lost and never applied twice; a record
-- without usable headers is parked once per (group, topic, partition,
-- offset). `walrelay_consumer::parked::redrive` applies parked records
-- through the handler and deletes each one in the handler's transaction.
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
    parked_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer_group, topic, partition, kafka_offset)
);

COMMENT ON TABLE walrelay_consumer_parked IS
    'walrelay-consumer dead letters: records parked by the poison policy, with their error; re-driven by walrelay_consumer::parked::redrive';
