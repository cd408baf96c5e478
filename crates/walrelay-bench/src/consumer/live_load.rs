//! The end-to-end runs' live load and their measure.
//!
//! The load: [`CLIENTS`] database clients commit one-event transactions
//! (`synchronous_commit = on`) at a fixed total rate, open loop (event `j`
//! of a client is due at `start + j / rate_per_client`; one that falls
//! behind sends at once, and the achieved rate is reported). Keyless: a
//! logical message; keyed: an outbox row keyed by one of 1,000
//! aggregates. Each transaction returns its transaction id. For the plain
//! reference the same transaction writes where no slot reads it, and the
//! client then sends the record itself with walrelay's producer settings
//! (the same key, an `idempotency-key` header).
//!
//! The measure: the source transaction's commit timestamp
//! (`pg_xact_commit_timestamp` of its id) and that of the consumer's
//! transaction that wrote the event's effect row (of the row's `xmin`),
//! both taken by the server as it writes the commit record. Neither
//! includes its own commit's WAL flush and reply, so their difference
//! stands for the application's commit reply to the consumer's: each end
//! leaves out one commit's flush.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_postgres::{Client, Statement};

use crate::env::BenchEnv;
use crate::runs::Percentiles;
use crate::workload::{payload, PREFIX};

/// Database clients of the live load.
pub(super) const CLIENTS: u64 = 8;

/// Payload bytes per event.
const SIZE: usize = 200;

/// Delivery reports by idempotency key (for the plain reference, the
/// sequence number), with the time this process received each.
pub(super) type Acks = Arc<Mutex<Vec<(u128, Instant)>>>;

/// One committed event: its sequence number and transaction id.
#[derive(Debug, Clone, Copy)]
pub(super) struct Committed {
    pub seq: u64,
    pub xid: i64,
}

/// One stretch of load: `rate` events/s in total (none: one event per
/// client) for `duration`, sequence numbers from `first`.
pub(super) struct Stretch {
    rate: Option<u64>,
    duration: Duration,
    first: u64,
}

impl Stretch {
    pub fn one_each(first: u64) -> Stretch {
        Stretch {
            rate: None,
            duration: Duration::ZERO,
            first,
        }
    }

    pub fn at(rate: u64, duration: Duration, first: u64) -> Stretch {
        Stretch {
            rate: Some(rate),
            duration,
            first,
        }
    }
}

/// The load's clients, each with its prepared statement, and for the
/// plain reference the producer.
pub(super) struct Load<'a> {
    clients: Vec<(Client, Statement)>,
    keyed: bool,
    producer: Option<&'a FutureProducer>,
    topic: &'a str,
    acks: &'a Acks,
}

impl<'a> Load<'a> {
    /// Connects the clients; with `producer` (the plain reference) the
    /// events go where no slot decodes them, and the clients send them.
    pub async fn connect(
        env: &BenchEnv,
        keyed: bool,
        producer: Option<&'a FutureProducer>,
        topic: &'a str,
        acks: &'a Acks,
    ) -> Result<Load<'a>> {
        let sql = match (keyed, producer.is_some()) {
            (true, _) => {
                "INSERT INTO bench_outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1, 'bench', $2, 'Created', $3) RETURNING txid_current()"
                    .to_owned()
            }
            (false, false) => format!(
                "SELECT txid_current() FROM pg_logical_emit_message(true, '{PREFIX}', $1::text)"
            ),
            // A prefix nothing routes (and no slot reads while it runs).
            (false, true) => {
                "SELECT txid_current() FROM pg_logical_emit_message(true, 'bench-dual', $1::text)"
                    .to_owned()
            }
        };
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let c = env.new_client().await?;
            c.batch_execute("SET synchronous_commit = on").await?;
            let stmt = c.prepare(&sql).await?;
            clients.push((c, stmt));
        }
        Ok(Load {
            clients,
            keyed,
            producer,
            topic,
            acks,
        })
    }

    /// Runs one stretch; every event's transaction id, and for the plain
    /// reference every record delivered.
    pub async fn run(&self, s: Stretch) -> Result<Vec<Committed>> {
        let start = tokio::time::Instant::now();
        let end = start + s.duration;
        let gap = s
            .rate
            .map(|r| Duration::from_secs_f64(CLIENTS as f64 / r as f64));
        let tasks = self
            .clients
            .iter()
            .enumerate()
            .map(|(i, (c, stmt))| async move {
                let mut out = Vec::new();
                let mut pending = Vec::new();
                for j in 0u64.. {
                    match gap {
                        None if j == 1 => break,
                        None => {}
                        Some(gap) => {
                            let due = start + gap.mul_f64(j as f64);
                            if due >= end {
                                break;
                            }
                            tokio::time::sleep_until(due).await;
                        }
                    }
                    let seq = s.first + j * CLIENTS + i as u64;
                    let body = payload(seq, SIZE);
                    let key = format!("agg-{}", seq % 1000);
                    let row = if self.keyed {
                        c.query_one(stmt, &[&(seq as i64), &key, &body]).await?
                    } else {
                        c.query_one(stmt, &[&body]).await?
                    };
                    out.push(Committed {
                        seq,
                        xid: row.get(0),
                    });
                    if let Some(p) = self.producer {
                        pending.push(self.send(
                            p,
                            seq,
                            self.keyed.then_some(key.as_str()),
                            &body,
                        )?);
                    }
                }
                for p in pending {
                    p.await.context("delivery task panicked")??;
                }
                anyhow::Ok(out)
            });
        let mut all = Vec::new();
        for r in futures_util::future::join_all(tasks).await {
            all.extend(r?);
        }
        Ok(all)
    }

    /// The plain reference's send after the commit: the record and its
    /// delivery report's time in `acks`.
    fn send(
        &self,
        producer: &FutureProducer,
        seq: u64,
        key: Option<&str>,
        body: &str,
    ) -> Result<tokio::task::JoinHandle<Result<()>>> {
        let id = format!("{:032x}", u128::from(seq));
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: "idempotency-key",
            value: Some(&id),
        });
        let mut record: FutureRecord<'_, str, str> =
            FutureRecord::to(self.topic).payload(body).headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        let delivery = producer
            .send_result(record)
            .map_err(|(e, _)| e)
            .context("queueing a record")?;
        let acks = self.acks.clone();
        Ok(tokio::spawn(async move {
            let done = delivery.await;
            let at = Instant::now();
            done.context("delivery future dropped")?
                .map_err(|(e, _)| e)
                .context("delivery failed")?;
            acks.lock().expect("lock").push((u128::from(seq), at));
            anyhow::Ok(())
        }))
    }
}

/// This process's monotonic clock against the wall clock (which the
/// server's commit timestamps use), taken once per stretch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    at: Instant,
    wall_us: i64,
}

impl Clock {
    pub fn now() -> Clock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        Clock {
            at: Instant::now(),
            wall_us: wall.as_micros() as i64,
        }
    }

    /// `t` on the wall clock, µs since the epoch.
    fn wall_us(&self, t: Instant) -> i64 {
        match t.checked_duration_since(self.at) {
            Some(d) => self.wall_us + d.as_micros() as i64,
            None => self.wall_us - self.at.duration_since(t).as_micros() as i64,
        }
    }
}

/// One stretch's percentiles (ms).
pub(super) struct Measured {
    pub commit_to_effect: Percentiles,
    pub commit_to_ack: Percentiles,
    pub ack_to_effect: Percentiles,
    pub events_per_tx: f64,
}

/// The stretch `commits`: each event's source commit and effect commit
/// timestamps, its delivery report, and their percentiles. Fails unless
/// every event of the stretch has exactly one effect row, one commit
/// timestamp at each end and a delivery report.
pub(super) async fn measure(
    env: &BenchEnv,
    effects: &Client,
    commits: &[Committed],
    acks: &Acks,
    clock: Clock,
) -> Result<Measured> {
    let (seqs, xids): (Vec<i64>, Vec<i64>) = commits.iter().map(|c| (c.seq as i64, c.xid)).unzip();
    let source: HashMap<i64, Option<i64>> = env
        .client
        .query(
            "SELECT s, (extract(epoch FROM pg_xact_commit_timestamp((x % 4294967296)::text::xid)) \
             * 1000000)::int8 FROM unnest($1::int8[], $2::int8[]) AS u(s, x)",
            &[&seqs, &xids],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let (lo, hi) = (
        seqs.iter().min().copied().unwrap_or(0),
        seqs.iter().max().copied().unwrap_or(0),
    );
    let rows = effects
        .query(
            "SELECT left(payload, 20)::int8, event_id, \
             (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::int8, xmin::text \
             FROM applied_events WHERE left(payload, 20)::int8 BETWEEN $1 AND $2",
            &[&lo, &hi],
        )
        .await?;
    if rows.len() != commits.len() {
        bail!(
            "{} events committed in the stretch, {} effect rows for them",
            commits.len(),
            rows.len()
        );
    }
    let by_key: HashMap<u128, Instant> = acks.lock().expect("lock").iter().copied().collect();
    let hist = || Histogram::<u64>::new_with_max(600_000_000, 3);
    let (mut e2e, mut to_ack, mut ack_to_effect) = (hist()?, hist()?, hist()?);
    let mut seen = HashMap::with_capacity(rows.len());
    let mut transactions = std::collections::HashSet::new();
    for row in &rows {
        transactions.insert(row.get::<_, String>(3));
        let seq: i64 = row.get(0);
        if seen.insert(seq, ()).is_some() {
            bail!("event {seq} has two effect rows");
        }
        let event_id: String = row.get(1);
        let effect: i64 = row
            .get::<_, Option<i64>>(2)
            .context("an effect row without a commit timestamp: is track_commit_timestamp on?")?;
        let committed = source
            .get(&seq)
            .copied()
            .with_context(|| {
                format!("an effect row of event {seq}, which the stretch did not commit")
            })?
            .context("a source transaction without a commit timestamp")?;
        let key = u128::from_str_radix(&event_id, 16)
            .with_context(|| format!("event {seq}'s event_id {event_id:?} is not a key"))?;
        let ack = clock.wall_us(
            *by_key
                .get(&key)
                .with_context(|| format!("no delivery report for event {seq} ({event_id})"))?,
        );
        let us = |d: i64| d.max(0) as u64;
        e2e.saturating_record(us(effect - committed));
        to_ack.saturating_record(us(ack - committed));
        ack_to_effect.saturating_record(us(effect - ack));
    }
    Ok(Measured {
        commit_to_effect: Percentiles::of(&e2e),
        commit_to_ack: Percentiles::of(&to_ack),
        ack_to_effect: Percentiles::of(&ack_to_effect),
        events_per_tx: rows.len() as f64 / transactions.len().max(1) as f64,
    })
}

/// Fails unless the consumer's database holds exactly one effect row for
/// each of the `written` events and no other.
pub(super) async fn check_exactly_once(effects: &Client, written: &[Committed]) -> Result<()> {
    let rows = effects
        .query(
            "SELECT left(payload, 20)::int8, count(*) FROM applied_events GROUP BY 1",
            &[],
        )
        .await?;
    let counts: HashMap<i64, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for c in written {
        match counts.get(&(c.seq as i64)) {
            Some(1) => {}
            Some(n) => bail!("event {} applied {n} times", c.seq),
            None => bail!("event {} was never applied", c.seq),
        }
    }
    if counts.len() != written.len() {
        bail!(
            "{} distinct events applied, {} written",
            counts.len(),
            written.len()
        );
    }
    Ok(())
}
