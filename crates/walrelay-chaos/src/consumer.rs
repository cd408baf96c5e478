//! The harness's consumer: `walrelay-chaos consumer`, a
//! [`walrelay_consumer::ConsumerLoop`] that applies every record to
//! `chaos_applied` in the service database, exactly once by its
//! high-water mark.
//!
//! `chaos_applied` has no unique constraint and a `bigserial` column, so
//! a record applied twice shows up as two rows, and the rows' order is
//! the order of application.
//!
//! Records are applied in batches (one multi-row insert per batch
//! transaction), as a production service would.
//!
//! The fault hook: on SIGUSR1 the consumer arms itself. The next batch is
//! applied as usual, and its insert returns the highest `seq` it wrote. A
//! watcher task then polls, on its own connection, until that row is
//! visible, that is until the batch's transaction committed, and kills
//! the process with SIGKILL at once. The loop stores the batch's offset
//! right after the commit and commits offsets only every
//! [`COMMIT_INTERVAL`], asynchronously, so the kill lands a few
//! milliseconds into a two-second window: after the database commit,
//! before the offset commit, the window the high-water mark exists for.
//!
//! Earlier hooks waited for the *next* batch of the armed partition and
//! killed there. That missed the window whenever the partition's next
//! batch came more than the commit interval later (a bursty workload, or
//! a relay fault right after arming), and a short run with only a few
//! kills could then show none in the window. The harness checks afterwards
//! that the group's committed offsets were behind the applied records.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use rdkafka::ClientConfig;
use tokio::sync::watch;
use walrelay_consumer::{ConsumerLoop, Database, Delivery, PgHwmStore};

use crate::event::EventId;

/// The consumer's fault state (see the module docs).
#[derive(Debug, Default)]
struct KillSwitch {
    /// Set by SIGUSR1; the next batch takes it.
    armed: AtomicBool,
}

impl KillSwitch {
    /// Whether the batch about to be applied is the one to die after:
    /// true once per SIGUSR1.
    fn take(&self) -> bool {
        self.armed.swap(false, Ordering::SeqCst)
    }
}

/// How often the watcher looks for the armed batch's commit.
const WATCH_POLL: Duration = Duration::from_millis(2);

/// How long the watcher waits for the armed batch to commit. A batch
/// rolled back by a database fault never shows; the harness then falls
/// back to a plain kill -9.
const WATCH_LIMIT: Duration = Duration::from_secs(60);

/// Kills this process as soon as row `seq` of `chaos_applied` is visible
/// to another session: right after the batch that wrote it committed.
fn kill_after_commit(dsn: String, seq: i64) {
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + WATCH_LIMIT;
        let mut client = None;
        while tokio::time::Instant::now() < deadline {
            if client.is_none() {
                client = crate::workload::connect(&dsn).await.ok();
            }
            if let Some(c) = &client {
                match c
                    .query_opt("SELECT 1 FROM chaos_applied WHERE seq = $1", &[&seq])
                    .await
                {
                    Ok(Some(_)) => {
                        eprintln!("chaos consumer: SIGKILL between a database commit and the offset commit");
                        let _ = std::process::Command::new("kill")
                            .args(["-KILL", &std::process::id().to_string()])
                            .status();
                        std::future::pending::<()>().await;
                    }
                    Ok(None) => {}
                    Err(_) => client = None,
                }
            }
            tokio::time::sleep(WATCH_POLL).await;
        }
        eprintln!("chaos consumer: the armed batch never committed; not killing");
    });
}

/// Offsets are committed this often: a long window between the database
/// commit and the offset commit, on purpose.
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(2);

/// One batch into `chaos_applied`; WITH ORDINALITY keeps the batch's
/// order in `seq`.
const INSERT_APPLIED: &str =
    "INSERT INTO chaos_applied (event, topic, kafka_partition, kafka_offset, idempotency_key)
     SELECT e, t, p, o, k
     FROM unnest($1::text[], $2::text[], $3::int4[], $4::int8[], $5::text[])
          WITH ORDINALITY AS u(e, t, p, o, k, n)
     ORDER BY n";

pub const APPLIED_SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS chaos_applied (
        seq bigserial PRIMARY KEY,
        event text NOT NULL,
        topic text NOT NULL,
        kafka_partition int NOT NULL,
        kafka_offset bigint NOT NULL,
        idempotency_key text NOT NULL
    );";

#[derive(Debug, Args)]
pub struct ConsumerArgs {
    #[arg(long)]
    pub bootstrap: String,
    #[arg(long)]
    pub dsn: String,
    #[arg(long)]
    pub group: String,
    #[arg(long = "topic", required = true)]
    pub topics: Vec<String>,
}

pub async fn run(args: ConsumerArgs) -> Result<()> {
    // Signal handlers first: the harness may signal a fresh process.
    let switch = Arc::new(KillSwitch::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut usr1 = signal(SignalKind::user_defined1())?;
        let switch = Arc::clone(&switch);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => {
                        let _ = stop_tx.send(true);
                        return;
                    }
                    _ = usr1.recv() => switch.armed.store(true, Ordering::SeqCst),
                }
            }
        });
    }

    let (client, connection) = tokio_postgres::connect(&args.dsn, tokio_postgres::NoTls)
        .await
        .context("connecting to the service database")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::error!("service database connection lost: {e}");
        }
    });
    walrelay_consumer::migrate(&client).await?;
    client.batch_execute(APPLIED_SCHEMA).await?;

    let mut kafka = ClientConfig::new();
    kafka
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        // Tansu joins groups in about half the session timeout.
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("reconnect.backoff.max.ms", "500");
    let topics: Vec<&str> = args.topics.iter().map(String::as_str).collect();
    let consumer = ConsumerLoop::new(
        kafka,
        &topics,
        PgHwmStore::new(),
        Database::from_dsn(&args.dsn).context("parsing --dsn")?,
    )?
    .with_commit_interval(COMMIT_INTERVAL);

    let dsn = args.dsn.clone();
    consumer
        .run_batches(
            async |tx: &tokio_postgres::Transaction<'_>, batch: &[Delivery<'_>]| {
                let armed = switch.take();
                let mut events = Vec::with_capacity(batch.len());
                let mut topics = Vec::with_capacity(batch.len());
                let mut partitions = Vec::with_capacity(batch.len());
                let mut offsets = Vec::with_capacity(batch.len());
                let mut keys = Vec::with_capacity(batch.len());
                for d in batch {
                    events.push(
                        d.payload()
                            .and_then(EventId::from_payload)
                            .map(|e| e.to_string())
                            .unwrap_or_else(|| {
                                format!("?{}", String::from_utf8_lossy(d.payload().unwrap_or_default()))
                            }),
                    );
                    topics.push(d.position.topic.as_str());
                    partitions.push(d.position.partition);
                    offsets.push(d.offset());
                    keys.push(d.meta.key.to_hex());
                }
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                    [&events, &topics, &partitions, &offsets, &keys];
                if armed {
                    let last: Option<i64> = tx
                        .query_one(&format!("WITH ins AS ({INSERT_APPLIED} RETURNING seq) SELECT max(seq) FROM ins"), &params)
                        .await?
                        .get(0);
                    if let Some(seq) = last {
                        kill_after_commit(dsn.clone(), seq);
                    }
                    Ok(())
                } else {
                    tx.execute(INSERT_APPLIED, &params).await.map(|_| ())
                }
            },
            stop_rx,
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_signal_arms_exactly_one_batch() {
        let switch = KillSwitch::default();
        assert!(!switch.take(), "not armed: no kill");
        switch.armed.store(true, Ordering::SeqCst);
        assert!(switch.take(), "the first batch after the signal");
        assert!(!switch.take(), "later batches are applied as usual");
    }
}
