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
//! applied as usual and its partition remembered; when the loop hands the
//! handler the next batch **of that partition**, the consumer kills itself
//! with SIGKILL. A partition has at most one batch in flight, so that
//! moment is right after the armed batch's database transaction committed
//! and its offset was stored, and (offsets are committed every
//! [`COMMIT_INTERVAL`], asynchronously) almost always before that offset
//! was committed: the window the high-water mark exists for.
//!
//! Two other choices miss the window. Killing on the first batch after
//! arming misses it whenever the stream had been idle for longer than the
//! commit interval (e.g. after a relay fault), because the offsets had
//! caught up by then. Killing on the next batch of *any* partition misses
//! it because partitions are applied in parallel: another partition's
//! batch can reach the handler before the armed batch committed, and the
//! kill then rolls the armed batch back. The harness checks afterwards
//! that the group's committed offsets were behind the applied records.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
    /// The partition of the armed batch: the next batch of this partition
    /// kills the process.
    watched: Mutex<Option<(String, i32)>>,
}

impl KillSwitch {
    /// Whether the batch of `topic`/`partition` about to be applied is the
    /// one to die on.
    fn kill_now(&self, topic: &str, partition: i32) -> bool {
        let mut watched = self.watched.lock().expect("kill switch lock");
        if self.armed.swap(false, Ordering::SeqCst) {
            *watched = Some((topic.to_owned(), partition));
            return false;
        }
        watched
            .as_ref()
            .is_some_and(|(t, p)| t == topic && *p == partition)
    }
}

/// Offsets are committed this often: a long window between the database
/// commit and the offset commit, on purpose.
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(2);

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

    consumer
        .run_batches(
            async |tx: &tokio_postgres::Transaction<'_>, batch: &[Delivery<'_>]| {
                let first = batch.first().map(|d| d.position);
                if first.is_some_and(|p| switch.kill_now(&p.topic, p.partition)) {
                    // The previous batch of this partition has committed;
                    // its offset is stored but (most likely) not committed.
                    eprintln!("chaos consumer: SIGKILL between a database commit and the offset commit");
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &std::process::id().to_string()])
                        .status();
                    std::future::pending::<()>().await;
                }
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
                // WITH ORDINALITY keeps the batch's order in `seq`.
                tx.execute(
                    "INSERT INTO chaos_applied (event, topic, kafka_partition, kafka_offset, idempotency_key)
                     SELECT e, t, p, o, k
                     FROM unnest($1::text[], $2::text[], $3::int4[], $4::int8[], $5::text[])
                          WITH ORDINALITY AS u(e, t, p, o, k, n)
                     ORDER BY n",
                    &[&events, &topics, &partitions, &offsets, &keys],
                )
                .await
                .map(|_| ())
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
    fn the_kill_waits_for_the_next_batch_of_the_armed_partition() {
        let switch = KillSwitch::default();
        assert!(!switch.kill_now("a", 0), "not armed: no kill");
        switch.armed.store(true, Ordering::SeqCst);
        assert!(
            !switch.kill_now("a", 1),
            "the armed batch itself is applied"
        );
        assert!(
            !switch.kill_now("a", 0),
            "another partition's batch is applied"
        );
        assert!(!switch.kill_now("b", 1), "another topic's batch is applied");
        assert!(
            switch.kill_now("a", 1),
            "the next batch of the armed partition"
        );
    }
}
