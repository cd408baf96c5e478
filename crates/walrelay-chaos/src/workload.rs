//! The workload: units run one after another on one connection to the
//! source database, so that unit order is commit order.
//!
//! A unit is either a transaction or a standalone non-transactional
//! message batch. A transaction holds 1 to 10,000 events in one to three
//! segments, each of one kind: `walrelay.emit` helper messages, raw
//! transactional messages, outbox `INSERT ... SELECT`, or outbox `COPY`.
//! Some transactions also write non-transactional messages, and some are
//! rolled back on purpose. Every transaction inserts its unit number into
//! `chaos_ledger`, so what committed can be read back from PostgreSQL even
//! when the connection broke before the client learnt the outcome.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use futures_util::SinkExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;

use crate::services::{EMIT_TOPIC, RAW_PREFIX};

/// One segment of a transaction: `n` events of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    Emit(u32),
    Raw(u32),
    Outbox(u32),
    Copy(u32),
}

impl Segment {
    pub fn events(self) -> u32 {
        match self {
            Segment::Emit(n) | Segment::Raw(n) | Segment::Outbox(n) | Segment::Copy(n) => n,
        }
    }
}

/// What the client learnt about a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientOutcome {
    Committed,
    RolledBack,
    /// The connection failed: `chaos_ledger` decides.
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Unit {
    pub unit: u64,
    /// Empty for a standalone non-transactional unit.
    pub segments: Vec<Segment>,
    /// Non-transactional messages it writes (before its other events).
    pub non_tx: u32,
    pub rollback: bool,
    pub outcome: ClientOutcome,
}

impl Unit {
    pub fn tx_events(&self) -> u32 {
        self.segments.iter().map(|s| s.events()).sum()
    }

    pub fn is_transaction(&self) -> bool {
        !self.segments.is_empty()
    }
}

/// Counters the orchestrator reads while the workload runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Transactional events in units the client saw commit.
    pub committed_events: AtomicU64,
    /// Events the consumer has applied (polled from the service database).
    pub applied: AtomicU64,
    pub errors: AtomicU64,
}

/// Workload shape.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Events per second, at most.
    pub rate: f64,
    /// At most this many committed events not yet applied by the consumer.
    pub max_backlog: u64,
    /// Largest transaction.
    pub max_tx_events: u32,
    /// Chances of a transaction of 1-20, 21-500, 501-3,000 and 3,001 to
    /// `max_tx_events` events (summing to 1).
    pub sizes: [f64; 4],
}

pub struct Workload {
    rng: StdRng,
    config: WorkloadConfig,
    url: String,
    pub units: Vec<Unit>,
}

impl Workload {
    pub fn new(seed: u64, config: WorkloadConfig, url: String) -> Workload {
        Workload {
            rng: StdRng::seed_from_u64(seed ^ 0x5745_4c4f_4144),
            config,
            url,
            units: Vec::new(),
        }
    }

    fn size(&mut self) -> u32 {
        let r: f64 = self.rng.random();
        let max = self.config.max_tx_events;
        let [a, b, c, _] = self.config.sizes;
        let n = if r < a {
            self.rng.random_range(1..=20)
        } else if r < a + b {
            self.rng.random_range(21..=500)
        } else if r < a + b + c {
            self.rng.random_range(501..=3000)
        } else {
            self.rng.random_range(3001..=10_000)
        };
        n.min(max)
    }

    fn plan(&mut self, unit: u64) -> Unit {
        if self.rng.random_bool(0.04) {
            return Unit {
                unit,
                segments: Vec::new(),
                non_tx: self.rng.random_range(1..=3),
                rollback: false,
                outcome: ClientOutcome::Unknown,
            };
        }
        let total = self.size();
        let parts = self.rng.random_range(1..=3u32).min(total);
        let mut segments = Vec::new();
        let mut left = total;
        for p in 0..parts {
            let n = if p + 1 == parts {
                left
            } else {
                self.rng.random_range(1..=left - (parts - p - 1))
            };
            left -= n;
            segments.push(match self.rng.random_range(0..4) {
                0 => Segment::Emit(n),
                1 => Segment::Raw(n),
                2 => Segment::Outbox(n),
                _ => Segment::Copy(n),
            });
        }
        Unit {
            unit,
            segments,
            non_tx: if self.rng.random_bool(0.1) {
                self.rng.random_range(1..=2)
            } else {
                0
            },
            rollback: self.rng.random_bool(0.08),
            outcome: ClientOutcome::Unknown,
        }
    }

    /// Runs units until `stop` is set. Connection failures (PostgreSQL
    /// restarts) leave the unit's outcome unknown; the workload reconnects
    /// and goes on.
    pub async fn run(
        mut self,
        mut stop: watch::Receiver<bool>,
        progress: Arc<Progress>,
    ) -> Result<Vec<Unit>> {
        let started = Instant::now();
        let mut issued: u64 = 0;
        let mut client: Option<tokio_postgres::Client> = None;
        let mut consecutive_failures = 0u32;
        while !*stop.borrow() {
            // Pace: a rate limit, and a bound on the consumer's backlog.
            let due = Duration::from_secs_f64(issued as f64 / self.config.rate);
            let wait = due.saturating_sub(started.elapsed());
            let backlogged = progress
                .committed_events
                .load(Ordering::Relaxed)
                .saturating_sub(progress.applied.load(Ordering::Relaxed))
                > self.config.max_backlog;
            if backlogged || !wait.is_zero() {
                let nap = if backlogged {
                    Duration::from_millis(100)
                } else {
                    wait.min(Duration::from_millis(200))
                };
                tokio::select! {
                    _ = tokio::time::sleep(nap) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            let c = match &client {
                Some(c) if !c.is_closed() => c,
                _ => {
                    client = connect(&self.url).await.ok();
                    if client.is_none() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    continue;
                }
            };
            let unit_no = self.units.len() as u64 + 1;
            let mut unit = self.plan(unit_no);
            issued += u64::from(unit.tx_events() + unit.non_tx);
            match execute(c, &unit).await {
                Ok(outcome) => {
                    consecutive_failures = 0;
                    unit.outcome = outcome;
                    if outcome == ClientOutcome::Committed {
                        progress
                            .committed_events
                            .fetch_add(u64::from(unit.tx_events()), Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    consecutive_failures += 1;
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("workload unit {unit_no}: {e}; outcome unknown");
                    anyhow::ensure!(
                        consecutive_failures < 50,
                        "the workload failed 50 times in a row, last: {e}"
                    );
                    client = None;
                }
            }
            self.units.push(unit);
        }
        Ok(self.units)
    }
}

pub async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn non_tx_sql(unit: u64, n: u32) -> String {
    format!(
        "SELECT count(pg_logical_emit_message(false, '{RAW_PREFIX}', 'n:{unit}:' || g)) FROM generate_series(0, {}) g",
        n - 1
    )
}

async fn execute(client: &tokio_postgres::Client, unit: &Unit) -> Result<ClientOutcome> {
    let u = unit.unit;
    if !unit.is_transaction() {
        client.batch_execute(&non_tx_sql(u, unit.non_tx)).await?;
        return Ok(ClientOutcome::Committed);
    }
    let mut sql = String::from("BEGIN;");
    if unit.non_tx > 0 {
        sql.push_str(&non_tx_sql(u, unit.non_tx));
        sql.push(';');
    }
    sql.push_str(&format!(
        "INSERT INTO chaos_ledger (unit, events) VALUES ({u}, {});",
        unit.tx_events()
    ));
    let mut index = 0u32;
    // Statements up to the first COPY go in one round trip; each COPY
    // needs its own.
    let mut batches: Vec<(String, Option<(u32, u32)>)> = Vec::new();
    for seg in &unit.segments {
        let (from, to) = (index, index + seg.events() - 1);
        match seg {
            Segment::Emit(_) => sql.push_str(&format!(
                "SELECT count(walrelay.emit('{EMIT_TOPIC}', 'k' || (g % 17), jsonb_build_object('e', '{u}:' || g))) FROM generate_series({from}, {to}) g;"
            )),
            Segment::Raw(_) => sql.push_str(&format!(
                "SELECT count(pg_logical_emit_message(true, '{RAW_PREFIX}', '{u}:' || g)) FROM generate_series({from}, {to}) g;"
            )),
            Segment::Outbox(_) => sql.push_str(&format!(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                 SELECT '{u}:' || g, 'chaos', 'a' || (g % 23), 'Ev', jsonb_build_object('e', '{u}:' || g)
                 FROM generate_series({from}, {to}) g;"
            )),
            Segment::Copy(_) => {
                batches.push((std::mem::take(&mut sql), Some((from, to))));
            }
        }
        index += seg.events();
    }
    batches.push((sql, None));
    for (statements, copy) in batches {
        if !statements.is_empty() {
            client.batch_execute(&statements).await?;
        }
        if let Some((from, to)) = copy {
            copy_rows(client, u, from, to).await?;
        }
    }
    if unit.rollback {
        client.batch_execute("ROLLBACK").await?;
        Ok(ClientOutcome::RolledBack)
    } else {
        client.batch_execute("COMMIT").await?;
        Ok(ClientOutcome::Committed)
    }
}

async fn copy_rows(client: &tokio_postgres::Client, u: u64, from: u32, to: u32) -> Result<()> {
    let mut data = String::new();
    for i in from..=to {
        data.push_str(&format!(
            "{u}:{i}\tchaos\ta{}\tEv\t{{\"e\": \"{u}:{i}\"}}\n",
            i % 23
        ));
    }
    let sink = client
        .copy_in("COPY outbox (id, aggregatetype, aggregateid, type, payload) FROM STDIN")
        .await?;
    futures_util::pin_mut!(sink);
    sink.send(Bytes::from(data)).await?;
    sink.finish().await?;
    Ok(())
}
