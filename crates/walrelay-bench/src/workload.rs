//! The workloads and the SQL that generates them.
//!
//! Every event carries its sequence number: a logical message's content
//! starts with it (20 zero-padded digits), an outbox row's `id` is it. The
//! latency runner uses it to join the commit, the ack and the consumer's
//! receipt of one event.

use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tokio_postgres::Client;

/// How events are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `pg_logical_emit_message(true, 'bench', content)`, relayed by a raw
    /// route (keyless records).
    Messages,
    /// An insert into the outbox table `bench_outbox` (keyed by
    /// `aggregateid`, 1,000 distinct keys).
    Outbox,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Messages => "messages",
            Kind::Outbox => "outbox",
        })
    }
}

/// One backlog shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// Short id, e.g. `msg-100tx-200b`.
    pub id: String,
    pub kind: Kind,
    /// Events per transaction.
    pub per_tx: u64,
    /// Bytes of payload per event (message content or outbox `payload`).
    pub payload: usize,
    /// Events in the backlog.
    pub events: u64,
}

impl Workload {
    pub fn new(kind: Kind, per_tx: u64, payload: usize, events: u64) -> Workload {
        let k = match kind {
            Kind::Messages => "msg",
            Kind::Outbox => "outbox",
        };
        let size = if payload >= 1024 && payload.is_multiple_of(1024) {
            format!("{}kb", payload / 1024)
        } else {
            format!("{payload}b")
        };
        Workload {
            id: format!("{k}-{per_tx}tx-{size}"),
            kind,
            per_tx: per_tx.min(events.max(1)),
            payload,
            events,
        }
    }

    /// A human label, e.g. "messages, 100/tx, 200 B".
    pub fn label(&self) -> String {
        let size = if self.payload >= 1024 {
            format!("{} KB", self.payload / 1024)
        } else {
            format!("{} B", self.payload)
        };
        format!("{}, {}/tx, {size}", self.kind, self.per_tx)
    }
}

/// The issue's workloads: messages 1, 100 and 10,000 per transaction and
/// outbox inserts 1 and 100 per transaction with 200-byte payloads; and
/// 100 per transaction with 4 KB payloads for both kinds. `events` is the
/// backlog size of the 200-byte workloads, `large_events` of the 4 KB ones
/// (a 4 KB backlog of 1,000,000 events is 4 GB of WAL and, in Tansu's
/// memory storage, about 4.5 GB of RSS per copy).
pub fn standard(events: u64, large_events: u64) -> Vec<Workload> {
    vec![
        Workload::new(Kind::Messages, 1, 200, events),
        Workload::new(Kind::Messages, 100, 200, events),
        Workload::new(Kind::Messages, 10_000, 200, events),
        Workload::new(Kind::Messages, 100, 4096, large_events),
        Workload::new(Kind::Outbox, 1, 200, events),
        Workload::new(Kind::Outbox, 100, 200, events),
        Workload::new(Kind::Outbox, 100, 4096, large_events),
    ]
}

/// The message prefix the bench routes.
pub const PREFIX: &str = "bench";
/// The publication every tool reads.
pub const PUBLICATION: &str = "bench";
/// The outbox table (in the publication).
pub const OUTBOX_TABLE: &str = "public.bench_outbox";

/// Tables, publication and the generator procedures. Idempotent.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS bench_outbox (
    id bigint PRIMARY KEY,
    aggregatetype text NOT NULL,
    aggregateid text NOT NULL,
    type text NOT NULL,
    payload text
);
-- Unlogged: its copy of the backlog writes no WAL, so no slot decodes it
-- (a logged copy was one transaction of every backlog row right after
-- the backlog's end, which each walsender decoded, and spilled to disk,
-- while its relay finished the backlog: up to 2 s of server CPU in the
-- drain's window, and on 2 cores, time taken from the relay).
CREATE UNLOGGED TABLE IF NOT EXISTS bench_outbox_copy (LIKE bench_outbox INCLUDING ALL);
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'bench') THEN
        CREATE PUBLICATION bench FOR TABLE bench_outbox;
    END IF;
END $$;

-- The content of event `seq`: 20 digits, then filler up to `size` bytes.
CREATE OR REPLACE FUNCTION bench_payload(seq bigint, filler text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$ SELECT lpad(seq::text, 20, '0') || filler $$;

-- `n` messages from sequence number `first`, `per_tx` per transaction.
CREATE OR REPLACE PROCEDURE bench_emit(first bigint, n bigint, per_tx bigint, size int)
LANGUAGE plpgsql AS $$
DECLARE
    i bigint := first;
    filler text := repeat('x', greatest(size - 20, 0));
BEGIN
    WHILE i < first + n LOOP
        PERFORM pg_logical_emit_message(true, 'bench', bench_payload(g, filler))
           FROM generate_series(i, least(i + per_tx, first + n) - 1) g;
        COMMIT;
        i := i + per_tx;
    END LOOP;
END $$;

-- `n` outbox rows from id `first`, `per_tx` per transaction.
CREATE OR REPLACE PROCEDURE bench_insert(first bigint, n bigint, per_tx bigint, size int)
LANGUAGE plpgsql AS $$
DECLARE
    i bigint := first;
    filler text := repeat('x', greatest(size - 20, 0));
BEGIN
    WHILE i < first + n LOOP
        INSERT INTO bench_outbox (id, aggregatetype, aggregateid, type, payload)
             SELECT g, 'bench', 'agg-' || (g % 1000), 'Created', bench_payload(g, filler)
               FROM generate_series(i, least(i + per_tx, first + n) - 1) g;
        COMMIT;
        i := i + per_tx;
    END LOOP;
END $$;
"#;

/// Writes a committed backlog of `w` (sequence numbers from `first`) with
/// `synchronous_commit = off`, then a `CHECKPOINT` so everything is
/// flushed (a walsender only sends flushed WAL). Returns the time taken.
pub async fn generate_backlog(client: &Client, w: &Workload, first: u64) -> Result<Duration> {
    let t = Instant::now();
    client.batch_execute("SET synchronous_commit = off").await?;
    let proc_name = match w.kind {
        Kind::Messages => "bench_emit",
        Kind::Outbox => "bench_insert",
    };
    // CALL must run outside a transaction block for its COMMITs to work:
    // one statement, not a multi-statement batch.
    client
        .batch_execute(&format!(
            "CALL {proc_name}({first}, {}, {}, {})",
            w.events, w.per_tx, w.payload
        ))
        .await
        .with_context(|| format!("generating the backlog of {}", w.id))?;
    client
        .batch_execute("SET synchronous_commit = on; CHECKPOINT")
        .await?;
    Ok(t.elapsed())
}

/// The payload of event `seq` as the SQL functions build it.
pub fn payload(seq: u64, size: usize) -> String {
    let mut s = format!("{seq:020}");
    s.extend(std::iter::repeat_n('x', size.saturating_sub(20)));
    s
}

/// The sequence number at the start of a message payload.
pub fn seq_of_payload(payload: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload.get(..20)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_payloads() {
        let w = standard(1_000_000, 250_000);
        let ids: Vec<_> = w.iter().map(|w| w.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "msg-1tx-200b",
                "msg-100tx-200b",
                "msg-10000tx-200b",
                "msg-100tx-4kb",
                "outbox-1tx-200b",
                "outbox-100tx-200b",
                "outbox-100tx-4kb"
            ]
        );
        assert_eq!(w[3].label(), "messages, 100/tx, 4 KB");
        let p = payload(42, 200);
        assert_eq!(p.len(), 200);
        assert_eq!(seq_of_payload(p.as_bytes()), Some(42));
        assert_eq!(seq_of_payload(b"12"), None);
        assert_eq!(Workload::new(Kind::Messages, 10_000, 200, 500).per_tx, 500);
    }
}
