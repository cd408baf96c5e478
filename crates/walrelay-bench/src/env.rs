//! The bench's own PostgreSQL cluster and broker (Apache Kafka or Tansu),
//! and the SQL it needs around them (slots, positions, the database's CPU).

use anyhow::{Context, Result};
use tokio_postgres::Client;
use walrelay_testkit::{BrokerKind, ClusterOptions, Jvm, PgCluster, TestBroker};

use crate::procstat;
use crate::workload::SCHEMA;

/// Topics get this many partitions (created by the bench, stated).
pub const PARTITIONS: i32 = 4;

pub struct BenchEnv {
    pub cluster: PgCluster,
    pub client: Client,
    kind: BrokerKind,
    jvm: Jvm,
    broker: Option<TestBroker>,
}

/// The broker's CPU from [`BenchEnv::broker_cpu_window`] on.
pub struct BrokerCpuWindow {
    cpu0: Option<f64>,
    t0: std::time::Instant,
}

impl BrokerCpuWindow {
    /// The broker's CPU seconds since the window began, net of
    /// `idle_per_s` (what it spends idle) over the window's wall time;
    /// never below zero.
    pub fn finish(&self, env: &BenchEnv, idle_per_s: f64) -> Option<f64> {
        let used = env.broker_cpu_seconds()? - self.cpu0?;
        Some((used - idle_per_s * self.t0.elapsed().as_secs_f64()).max(0.0))
    }
}

/// A broker of `kind` of the bench's own (a single KRaft node for Kafka,
/// its JVM run as Kafka's start scripts run it, or with `jvm`'s collector).
async fn start_broker(kind: BrokerKind, jvm: Jvm) -> Result<TestBroker> {
    tokio::task::spawn_blocking(move || TestBroker::start_own_jvm(kind, jvm))
        .await?
        .with_context(|| format!("starting {kind}"))
}

impl BenchEnv {
    /// A fresh cluster (room for many slots, a large `max_wal_size` so
    /// generation does not checkpoint constantly) with the bench schema,
    /// and a fresh broker of `kind`.
    pub async fn start(kind: BrokerKind, jvm: Jvm) -> Result<BenchEnv> {
        let opts = ClusterOptions::default()
            .conf("max_replication_slots", "32")
            .conf("max_wal_senders", "32")
            .conf("max_wal_size", "8GB")
            .conf("shared_buffers", "256MB")
            // The consumer bench's end-to-end runs time both ends of an
            // event by the commit timestamps of their transactions.
            .conf("track_commit_timestamp", "on");
        let cluster = tokio::task::spawn_blocking(move || PgCluster::start(opts))
            .await?
            .context("starting PostgreSQL")?;
        let client = cluster.client().await?;
        client.batch_execute(SCHEMA).await.context("bench schema")?;
        let broker = start_broker(kind, jvm).await?;
        Ok(BenchEnv {
            cluster,
            client,
            kind,
            jvm,
            broker: Some(broker),
        })
    }

    pub fn bootstrap(&self) -> String {
        self.broker
            .as_ref()
            .expect("a broker runs")
            .bootstrap_servers()
    }

    /// The broker's process (the Kafka node's JVM, or Tansu), for its CPU
    /// time.
    pub fn broker_pid(&self) -> Option<u32> {
        let broker = self.broker.as_ref()?;
        match broker.as_kafka() {
            Some(kafka) => kafka.nodes().first()?.pid(),
            None => broker.as_tansu()?.pid(),
        }
    }

    /// The broker's CPU seconds so far (`None` without a process to read).
    pub fn broker_cpu_seconds(&self) -> Option<f64> {
        procstat::cpu_seconds(self.broker_pid()?).ok()
    }

    /// The broker's CPU seconds per second while nothing uses it, over
    /// `window` (a JVM broker spends some on its own: timers, the KRaft
    /// quorum's heartbeats, its collector), so that a run's broker CPU can
    /// be told net of it.
    pub async fn broker_idle_cpu_per_s(&self, window: std::time::Duration) -> Option<f64> {
        let w = self.broker_cpu_window();
        tokio::time::sleep(window).await;
        w.finish(self, 0.0).map(|cpu| cpu / window.as_secs_f64())
    }

    /// Starts counting the broker's CPU seconds (see
    /// [`BrokerCpuWindow::finish`]).
    pub fn broker_cpu_window(&self) -> BrokerCpuWindow {
        BrokerCpuWindow {
            cpu0: self.broker_cpu_seconds(),
            t0: std::time::Instant::now(),
        }
    }

    /// Bytes the broker stores for `topic`: the size of its partitions'
    /// log segments (`<log.dirs>/<topic>-<partition>/*.log`), batches,
    /// record and header framing included; `None` on Tansu (memory
    /// storage).
    pub fn topic_log_bytes(&self, topic: &str) -> Option<u64> {
        let kafka = self.broker.as_ref()?.as_kafka()?;
        let data = kafka.nodes().first()?.dir().join("data");
        let mut total = 0;
        for p in 0..PARTITIONS {
            let dir = data.join(format!("{topic}-{p}"));
            for entry in std::fs::read_dir(&dir).ok()? {
                let entry = entry.ok()?;
                if entry.path().extension().is_some_and(|e| e == "log") {
                    total += entry.metadata().ok()?.len();
                }
            }
        }
        Some(total)
    }

    /// Replaces the broker by a new, empty one, so that no run pays for
    /// the records of the runs before it (Tansu's memory storage only
    /// grows; a Kafka node's page cache and log segments too).
    pub async fn fresh_broker(&mut self) -> Result<()> {
        drop(self.broker.take());
        self.broker = Some(start_broker(self.kind, self.jvm).await?);
        Ok(())
    }

    /// Creates `topic` with [`PARTITIONS`] partitions (blocks this worker
    /// thread for the admin request; needs the multi-thread runtime).
    pub fn create_topic(&self, topic: &str) -> Result<()> {
        self.create_topic_with(topic, PARTITIONS)
    }

    /// Creates `topic` with `partitions` partitions (see
    /// [`BenchEnv::create_topic`]).
    pub fn create_topic_with(&self, topic: &str, partitions: i32) -> Result<()> {
        let broker = self.broker.as_ref().expect("a broker runs");
        tokio::task::block_in_place(|| broker.create_topic(topic, partitions))
    }

    /// `postgresql://...` for walrelay and the bench's own clients.
    pub fn url(&self) -> String {
        format!(
            "{}?sslmode=disable",
            self.cluster.url(walrelay_testkit::SUPERUSER, "postgres")
        )
    }

    pub async fn new_client(&self) -> Result<Client> {
        self.cluster.client().await
    }

    pub async fn create_slot(&self, slot: &str) -> Result<()> {
        self.client
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            )
            .await
            .with_context(|| format!("creating slot {slot}"))?;
        Ok(())
    }

    pub async fn drop_slot(&self, slot: &str) -> Result<()> {
        self.client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1",
                &[&slot],
            )
            .await?;
        Ok(())
    }

    /// The slot's confirmed flush LSN as a number.
    pub async fn confirmed_flush(&self, slot: &str) -> Result<u64> {
        let v: Option<i64> = self
            .client
            .query_one(
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots \
                 WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .get(0);
        Ok(u64::try_from(
            v.context("slot has no confirmed_flush_lsn")?,
        )?)
    }

    /// `pg_current_wal_lsn()` as a number and as text.
    pub async fn current_lsn(&self) -> Result<(u64, String)> {
        let row = self
            .client
            .query_one(
                "SELECT (pg_current_wal_lsn() - '0/0')::bigint, pg_current_wal_lsn()::text",
                &[],
            )
            .await?;
        Ok((u64::try_from(row.get::<_, i64>(0))?, row.get(1)))
    }

    /// The postmaster's pid (first line of `postmaster.pid`).
    pub fn postmaster_pid(&self) -> Result<u32> {
        let path = self.cluster.data_dir().join("postmaster.pid");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path:?}"))?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .context("no pid in postmaster.pid")
    }

    /// Measures the whole server's CPU (postmaster, backends, walsenders,
    /// background processes) from now until the returned guard is
    /// finished; it samples every 25 ms on a background task.
    pub fn db_cpu_window(&self) -> Result<DbCpuWindow> {
        let mut meter = procstat::TreeCpuMeter::start(self.postmaster_pid()?)?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(25)) => {}
                }
                if let Err(e) = meter.sample() {
                    tracing::debug!("db cpu sample: {e:#}");
                }
            }
            meter.sample().ok();
            meter.seconds()
        });
        Ok(DbCpuWindow { stop, task })
    }

    pub fn pg_tool(&self, name: &str) -> std::path::PathBuf {
        self.cluster.pg_bin().tool(name)
    }
}

/// An open measurement of the server's CPU ([`BenchEnv::db_cpu_window`]).
pub struct DbCpuWindow {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<f64>,
}

impl DbCpuWindow {
    /// Ends the window: CPU seconds the server used in it.
    pub async fn finish(self) -> Result<f64> {
        let _ = self.stop.send(());
        Ok(self.task.await?)
    }
}
