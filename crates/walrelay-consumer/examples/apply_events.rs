//! An example service that applies walrelay events to its own table exactly
//! once.
//!
//! ```text
//! cargo run -p walrelay-consumer --example apply_events -- \
//!     --bootstrap 127.0.0.1:9092 --topic orders \
//!     --dsn "host=127.0.0.1 user=app dbname=app" --group orders-service
//! ```
//!
//! Each new record becomes one row of `applied_events`, written in the same
//! transaction that raises the partition's high-water mark. The table has
//! deliberately no unique constraint: if anything were applied twice, the
//! duplicate row would show it. SIGTERM or SIGINT stops it gracefully
//! (finish the record in progress, commit offsets, leave the group).

use anyhow::{bail, Context, Result};
use rdkafka::ClientConfig;
use tokio::sync::watch;
use walrelay_consumer::{ConsumerLoop, Delivery, PgHwmStore};

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS applied_events (
        idempotency_key text NOT NULL,
        source text NOT NULL,
        topic text NOT NULL,
        kafka_partition int NOT NULL,
        kafka_offset bigint NOT NULL,
        payload text,
        applied_at timestamptz NOT NULL DEFAULT now()
    );";

struct Args {
    bootstrap: String,
    topics: Vec<String>,
    dsn: String,
    group: String,
    kafka: Vec<(String, String)>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        bootstrap: String::new(),
        topics: Vec::new(),
        dsn: String::new(),
        group: String::new(),
        kafka: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bootstrap" => a.bootstrap = value()?,
            "--topic" => a.topics.push(value()?),
            "--dsn" => a.dsn = value()?,
            "--group" => a.group = value()?,
            "--kafka-property" => {
                let v = value()?;
                let (k, v) = v
                    .split_once('=')
                    .context("--kafka-property takes NAME=VALUE")?;
                a.kafka.push((k.to_owned(), v.to_owned()));
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if a.bootstrap.is_empty() || a.topics.is_empty() || a.dsn.is_empty() || a.group.is_empty() {
        bail!("usage: apply_events --bootstrap HOST:PORT --topic T [--topic T...] --dsn CONNINFO --group G [--kafka-property K=V...]");
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = args()?;
    let (client, connection) = tokio_postgres::connect(&args.dsn, tokio_postgres::NoTls)
        .await
        .context("connecting to the service database")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::error!("database connection lost: {e}");
        }
    });
    walrelay_consumer::migrate(&client).await?;
    client.batch_execute(SCHEMA).await?;

    let mut kafka = ClientConfig::new();
    kafka
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group);
    for (k, v) in &args.kafka {
        kafka.set(k, v);
    }
    let topics: Vec<&str> = args.topics.iter().map(String::as_str).collect();
    let consumer = ConsumerLoop::new(kafka, &topics, PgHwmStore::new(), client)?;
    let counters = consumer.counters();

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        let _ = stop_tx.send(true);
    });

    consumer
        .run(
            async |tx: &tokio_postgres::Transaction<'_>, d: &Delivery<'_>| {
                let payload = d.payload().map(|p| String::from_utf8_lossy(p).into_owned());
                tx.execute(
                    "INSERT INTO applied_events (idempotency_key, source, topic, kafka_partition, kafka_offset, payload)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &d.meta.key.to_hex(),
                        &d.meta.source,
                        &d.position.topic,
                        &d.position.partition,
                        &d.offset(),
                        &payload,
                    ],
                )
                .await
                .map(|_| ())
            },
            stop_rx,
        )
        .await?;
    let c = counters.snapshot();
    println!(
        "stopped: {} processed, {} duplicates skipped, {} gaps, {} errors",
        c.processed, c.duplicates, c.gaps, c.errors
    );
    Ok(())
}
