//! Shared set-up for the relay's end-to-end tests: a throwaway PostgreSQL
//! with an outbox table, a throwaway broker (Tansu, or Apache Kafka with
//! `WALRELAY_BROKER=kafka`), and checks over what arrived in Kafka.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use walrelay::config::{Config, MessageRoute, OutboxConfig};
use walrelay::engine::key::EventKey;
use walrelay::engine::pipeline::Trace;
use walrelay_pgoutput::Lsn;
use walrelay_testkit::{
    db, outbox_table, BrokerKind, ClusterOptions, ConsumedRecord, OutboxKeys, PgCluster,
    TestBroker, TestDb, BUSY_TABLE,
};

/// Keys first seen, per (topic, partition), in offset order.
pub type FreshKeys = BTreeMap<(String, i32), Vec<EventKey>>;

pub const WAIT: Duration = Duration::from_secs(90);

/// The partition count of [`Env::create_topics`]: what Tansu auto-creates.
pub const PARTITIONS: i32 = 4;

/// The outbox (keys optional: some tests write rows the relay must refuse)
/// and a table outside every publication.
pub fn schema() -> String {
    format!("{}{}", outbox_table(OutboxKeys::Optional), BUSY_TABLE)
}

pub struct Env {
    pub cluster: PgCluster,
    pub client: tokio_postgres::Client,
    pub broker: Option<TestBroker>,
}

impl Env {
    /// PostgreSQL and the broker `WALRELAY_BROKER` names (Tansu unless it
    /// says `kafka`).
    pub async fn start() -> Result<Env> {
        Self::start_on(BrokerKind::from_env()?).await
    }

    /// PostgreSQL and a broker of `kind`, for tests that need one (e.g.
    /// Tansu, to stop and restart it).
    pub async fn start_on(kind: BrokerKind) -> Result<Env> {
        let mut env = Self::postgres_only(ClusterOptions::default()).await?;
        env.broker =
            Some(tokio::task::spawn_blocking(move || TestBroker::start_kind(kind)).await??);
        Ok(env)
    }

    /// The broker.
    pub fn broker(&self) -> &TestBroker {
        self.broker.as_ref().expect("started with a broker")
    }

    /// Creates `topics` with [`PARTITIONS`] partitions each, before the
    /// relay auto-creates them: Tansu would give them four, Apache Kafka
    /// one (`num.partitions`), and a test should see one layout on both.
    pub fn create_topics(&self, topics: &[&str]) -> Result<()> {
        for topic in topics {
            self.broker().create_topic(topic, PARTITIONS)?;
        }
        Ok(())
    }

    pub async fn postgres_only(opts: ClusterOptions) -> Result<Env> {
        let TestDb { cluster, client } = TestDb::start(opts, &schema()).await?;
        Ok(Env {
            cluster,
            client,
            broker: None,
        })
    }

    pub fn bootstrap(&self) -> String {
        self.broker
            .as_ref()
            .expect("started with a broker")
            .bootstrap_servers()
    }

    /// A relay configuration for this environment: the outbox table, one
    /// raw route (`orders` → `orders`), envelope messages, fast status
    /// updates.
    pub fn config(&self, bootstrap: &str) -> Config {
        let mut c = Config::default();
        c.postgres.url = format!(
            "{}?sslmode=disable",
            self.cluster.url("postgres", "postgres")
        );
        c.postgres.status_interval = Duration::from_millis(200);
        c.kafka.bootstrap_servers = bootstrap.to_owned();
        c.messages.push(MessageRoute {
            prefix: "orders".into(),
            topic: "orders".into(),
        });
        c.outbox.push(OutboxConfig {
            table: "public.outbox".into(),
            topic: "outbox.event.{aggregatetype}".into(),
            columns: Default::default(),
        });
        c.relay.max_backoff = Duration::from_millis(500);
        c
    }

    pub async fn confirmed_flush_lsn(&self, slot: &str) -> Result<Lsn> {
        db::confirmed_flush_lsn(&self.client, slot)
            .await?
            .context("slot has no confirmed_flush_lsn")
    }

    pub async fn current_wal_lsn(&self) -> Result<Lsn> {
        db::current_wal_lsn(&self.client).await
    }

    pub async fn system_identifier(&self) -> Result<String> {
        db::system_identifier(&self.client).await
    }
}

pub fn key_of(r: &ConsumedRecord) -> EventKey {
    let hex = r
        .header_str("idempotency-key")
        .expect("every record has an idempotency-key header");
    hex.parse().expect("idempotency-key is 32 hex digits")
}

/// The consumer's view: per (topic, partition) in offset order, a record
/// whose key is above the high-water mark is new, anything else is a
/// replayed duplicate. Checks that duplicates are exact repeats of keys
/// seen before in that partition (never a new key arriving late, which
/// would be lost by a high-water-mark consumer) and returns the new
/// records' keys per partition.
pub fn apply_high_water_marks(records: &[ConsumedRecord]) -> Result<(FreshKeys, usize)> {
    let mut by_partition: BTreeMap<(String, i32), Vec<&ConsumedRecord>> = BTreeMap::new();
    for r in records {
        by_partition
            .entry((r.topic.clone(), r.partition))
            .or_default()
            .push(r);
    }
    let mut fresh = BTreeMap::new();
    let mut duplicates = 0;
    for (tp, mut rs) in by_partition {
        rs.sort_by_key(|r| r.offset);
        let mut seen = HashSet::new();
        let mut hwm: Option<EventKey> = None;
        let mut new_keys = Vec::new();
        for r in rs {
            let k = key_of(r);
            if hwm.is_none_or(|h| k > h) {
                hwm = Some(k);
                seen.insert(k);
                new_keys.push(k);
            } else {
                ensure!(
                    seen.contains(&k),
                    "{tp:?} offset {}: key {k} is below the high-water mark but was never seen: it would be lost",
                    r.offset
                );
                duplicates += 1;
            }
        }
        fresh.insert(tp, new_keys);
    }
    Ok((fresh, duplicates))
}

/// "Nothing is confirmed to PostgreSQL before Kafka acknowledged it": at
/// every confirmation, every record produced with a key below the
/// confirmed LSN (its transaction committed before it, or it is a
/// non-transactional message ending at or before it) was acknowledged.
pub fn check_confirmations_follow_acks(trace: &[Trace]) -> Result<usize> {
    let mut produced: HashMap<u64, EventKey> = HashMap::new();
    let mut acked: HashSet<u64> = HashSet::new();
    let mut confirmations = 0;
    for t in trace {
        match t {
            Trace::SessionStarted { .. } | Trace::SessionEnded { .. } => {
                // Each session numbers its events from zero, and what a
                // failed session left unacknowledged is replayed by the
                // next one under new numbers.
                produced.clear();
                acked.clear();
            }
            Trace::Produced { seq, key, .. } => {
                produced.insert(*seq, *key);
            }
            Trace::Acked { seq, .. } => {
                acked.insert(*seq);
            }
            Trace::Confirmed { lsn } => {
                confirmations += 1;
                for (seq, key) in &produced {
                    if key.high() < lsn.0 {
                        ensure!(
                            acked.contains(seq),
                            "confirmed {lsn} before the ack of event {seq} (key {key})"
                        );
                    }
                }
                produced.retain(|seq, _| !acked.contains(seq));
            }
        }
    }
    Ok(confirmations)
}

/// The real `walrelay run` against this environment, configured by flags:
/// the PostgreSQL URL and bootstrap servers, then `extra` (before `run`).
/// Output goes to `log` (appended, so restarts share one file).
pub fn spawn_relay(
    env: &Env,
    bootstrap: &str,
    log: &std::path::Path,
    extra: &[&str],
) -> Result<std::process::Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Ok(std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args([
            "--postgres-url",
            &format!(
                "{}?sslmode=disable",
                env.cluster.url("postgres", "postgres")
            ),
        ])
        .args(["--bootstrap-servers", bootstrap])
        .args(extra)
        .arg("run")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?)
}

/// `GET path` from walrelay's metrics endpoint at `addr`: the status and
/// the body.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no end of headers in {raw:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("no status in {head:?}"))?
        .parse()?;
    Ok((status, body.to_owned()))
}

/// `walrelay [global] status [args]` against `env`'s cluster (as the
/// superuser, logging at WARN): the exit code and standard output.
pub fn walrelay_status(env: &Env, global: &[&str], args: &[&str]) -> Result<(i32, String)> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .arg("--postgres-url")
        .arg(format!(
            "{}?sslmode=disable",
            env.cluster.url("postgres", "postgres")
        ))
        .args(["--log", "warn"])
        .args(global)
        .arg("status")
        .args(args)
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
    ))
}
