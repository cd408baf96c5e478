-- walrelay SQL helpers, installed by `walrelay setup` (idempotent: every
-- object is created with OR REPLACE / IF NOT EXISTS).
--
-- walrelay.emit(topic, key, payload, headers) publishes one event inside the
-- caller's transaction: nothing is published unless the transaction commits.
-- It writes a transactional logical decoding message with the prefix
-- 'walrelay.v1' whose content is the envelope documented in
-- docs/envelope.md:
--
--   u32 big-endian header length | header JSON | payload bytes
--   header = {"topic": ..., "key": ... | null, "headers": {...} | null,
--             "tombstone": true (only when payload IS NULL)}
--
-- Overloads: payload jsonb (its text form is the record value), bytea
-- (byte-exact), and text (parsed as JSON, so an untyped literal such as
-- '{"id": 1}' resolves to it and invalid JSON fails at emit time, inside the
-- application's transaction, not later in the relay).
--
-- Header names walrelay reserves for itself (idempotency-key and every
-- walrelay-*, in any letter case) are refused at emit time.
--
-- Returns the LSN of the emitted message.

CREATE SCHEMA IF NOT EXISTS walrelay;

COMMENT ON SCHEMA walrelay IS 'walrelay helpers: walrelay.emit(topic, key, payload, headers)';

CREATE OR REPLACE FUNCTION walrelay.emit(topic text, key text, payload bytea, headers jsonb DEFAULT NULL)
RETURNS pg_lsn
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog
AS $fn$
DECLARE
    header bytea;
    reserved text;
BEGIN
    IF topic IS NULL OR topic = '' THEN
        RAISE EXCEPTION 'walrelay.emit: topic must be a non-empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF topic !~ '^[a-zA-Z0-9._-]{1,249}$' OR topic IN ('.', '..') THEN
        RAISE EXCEPTION 'walrelay.emit: % is not a valid Kafka topic name', quote_literal(topic)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'use 1 to 249 characters of letters, digits, ".", "_" and "-"';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'walrelay.emit: headers must be a JSON object, not %', jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- walrelay's own header names (the rule of walrelay::record::header::
    -- is_reserved): a copy from the application could forge a key or a gap.
    -- Refused here, in the caller's transaction, rather than later in the
    -- relay.
    IF headers IS NOT NULL THEN
        SELECT name INTO reserved
          FROM jsonb_object_keys(headers) AS name
         WHERE lower(name) = 'idempotency-key' OR lower(name) LIKE 'walrelay-%'
         ORDER BY name
         LIMIT 1;
        IF reserved IS NOT NULL THEN
            RAISE EXCEPTION 'walrelay.emit: header % is reserved for walrelay (idempotency-key and every walrelay-* header)', quote_literal(reserved)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'rename the header: walrelay sets its own headers on every record, and a copy from the application could make consumers take a forged key or gap for walrelay''s';
        END IF;
    END IF;
    header := convert_to(
        jsonb_strip_nulls(jsonb_build_object(
            'topic', topic,
            'key', key,
            'headers', headers,
            'tombstone', CASE WHEN payload IS NULL THEN true END
        ))::text,
        'UTF8');
    RETURN pg_logical_emit_message(
        true,
        'walrelay.v1',
        int4send(octet_length(header)) || header || coalesce(payload, '\x'::bytea));
END
$fn$;

CREATE OR REPLACE FUNCTION walrelay.emit(topic text, key text, payload jsonb, headers jsonb DEFAULT NULL)
RETURNS pg_lsn
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog
AS $fn$
    SELECT walrelay.emit(topic, key, convert_to(payload::text, 'UTF8'), headers)
$fn$;

CREATE OR REPLACE FUNCTION walrelay.emit(topic text, key text, payload text, headers jsonb DEFAULT NULL)
RETURNS pg_lsn
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog
AS $fn$
    SELECT walrelay.emit(topic, key, payload::jsonb, headers)
$fn$;

COMMENT ON FUNCTION walrelay.emit(text, text, bytea, jsonb) IS
    'Publish an event (byte-exact payload) through walrelay when the current transaction commits';
COMMENT ON FUNCTION walrelay.emit(text, text, jsonb, jsonb) IS
    'Publish an event (JSON payload) through walrelay when the current transaction commits';
COMMENT ON FUNCTION walrelay.emit(text, text, text, jsonb) IS
    'Publish an event whose payload is JSON given as text (validated now) when the current transaction commits';

-- What `walrelay setup` created: one row per replication slot, kept in the
-- database itself. A base backup holds no replication slots but holds this
-- table, and so does a promoted standby and an upgraded cluster: `setup`
-- finds a slot it created gone and refuses to create a new one in silence
-- (docs/operations.md, "A lost replication slot"). Only `setup` writes it.
CREATE TABLE IF NOT EXISTS walrelay.slots (
    slot_name text PRIMARY KEY,
    system_identifier text NOT NULL,
    database text NOT NULL,
    source_id text NOT NULL,
    created_lsn pg_lsn NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_lsn pg_lsn NOT NULL,
    last_seen_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE walrelay.slots IS
    'Replication slots walrelay setup created, so that a slot lost in a restore, failover or upgrade is noticed';
