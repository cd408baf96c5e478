-- Runs once, as the superuser, when the PostgreSQL container creates its
-- data directory (/docker-entrypoint-initdb.d). Database: app.
--
-- walrelay connects as its own role with the REPLICATION attribute. It
-- owns the outbox table (CREATE PUBLICATION ... FOR TABLE needs the
-- table's owner) and the walrelay schema, where `walrelay setup` installs
-- walrelay.emit(...). The application (here: the superuser) inserts into
-- the outbox or calls walrelay.emit in its own transactions.

CREATE ROLE walrelay WITH LOGIN REPLICATION PASSWORD 'walrelay';
GRANT CREATE ON DATABASE app TO walrelay;

CREATE SCHEMA walrelay AUTHORIZATION walrelay;

-- Debezium-compatible outbox columns (docs/relay.md).
CREATE TABLE public.outbox (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype text NOT NULL,
    aggregateid   text NOT NULL,
    type          text NOT NULL,
    payload       jsonb,
    headers       jsonb
);
ALTER TABLE public.outbox OWNER TO walrelay;

-- Try it (docker compose exec postgres psql -U postgres app):
--   BEGIN;
--   INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
--        VALUES ('order', 'order-1', 'OrderPlaced', '{"total": 30}');
--   SELECT walrelay.emit('orders', 'customer-42', '{"order": 1}');
--   COMMIT;
