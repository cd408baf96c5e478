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
//! duplicate row would show it.
//!
//! * `--mode batch` (the default) applies each batch with one multi-row
//!   `INSERT ... SELECT FROM unnest(...)`; `--mode record` inserts one row
//!   per record, inside the same batch transaction.
//! * `--on-poison stop|park`: what to do with a record that keeps failing
//!   (see `walrelay_consumer::OnPoison`); `--redrive` applies the parked
//!   records of the group once and exits.
//! * `--pool-size N`, `--max-batch-records N`: see
//!   `walrelay_consumer::Settings`; `--handler-timeout-ms N`: see
//!   `ConsumerLoop::with_handler_timeout`.
//! * `--instance-id ID` (or `$WALRELAY_CONSUMER_INSTANCE_ID`): static
//!   group membership (`group.instance.id`), so that a restarted process
//!   gets its partitions back at once instead of after the dead one's
//!   session timeout. One id per running instance, stable across its
//!   restarts (docs/consumer.md, Settings).
//! * `--metrics-addr HOST:PORT`: serves the loop's metrics
//!   (`walrelay_consumer_*`, docs/metrics.md) at `GET /metrics` for
//!   Prometheus, in the OpenMetrics text format (a few lines of plain
//!   HTTP/1.1 here; a service would add them to its own endpoint).
//!
//! SIGTERM or SIGINT stops it gracefully (finish the batches in flight,
//! commit offsets, leave the group) and prints what it applied and where
//! the partitions' time went (partition-seconds per phase, see
//! `walrelay_consumer::Phase`). A partition stopped by a poison record
//! makes the process exit 1 at shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use prometheus_client::registry::Registry;
use rdkafka::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_postgres::Transaction;
use walrelay_consumer::{
    ConsumerLoop, Database, Delivery, OAuthOptions, OnPoison, PgHwmStore, ProviderName, Settings,
};

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

const INSERT_ONE: &str = "INSERT INTO applied_events \
     (idempotency_key, source, topic, kafka_partition, kafka_offset, payload) \
     VALUES ($1, $2, $3, $4, $5, $6)";

const INSERT_BATCH: &str = "INSERT INTO applied_events \
     (idempotency_key, source, topic, kafka_partition, kafka_offset, payload) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int8[], $6::text[])";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Batch,
    Record,
}

struct Args {
    bootstrap: String,
    topics: Vec<String>,
    dsn: String,
    group: String,
    kafka: Vec<(String, String)>,
    mode: Mode,
    settings: Settings,
    handler_timeout: Option<std::time::Duration>,
    instance_id: Option<String>,
    metrics_addr: Option<std::net::SocketAddr>,
    redrive: bool,
    oauth: OAuthOptions,
}

const USAGE: &str = "usage: apply_events --bootstrap HOST:PORT --topic T [--topic T...] \
    --dsn CONNINFO --group G [--mode batch|record] [--on-poison stop|park] [--pool-size N] \
    [--max-batch-records N] [--handler-timeout-ms N] [--instance-id ID] [--metrics-addr HOST:PORT] [--redrive] \
    [--kafka-property K=V...] [--oauth-provider aws-msk-iam] [--aws-region REGION]
    (a --kafka-property value env:NAME is read from the environment variable NAME)";

fn args() -> Result<Args> {
    let mut a = Args {
        bootstrap: String::new(),
        topics: Vec::new(),
        dsn: String::new(),
        group: String::new(),
        kafka: Vec::new(),
        mode: Mode::Batch,
        settings: Settings::default(),
        handler_timeout: None,
        instance_id: std::env::var("WALRELAY_CONSUMER_INSTANCE_ID")
            .ok()
            .filter(|id| !id.is_empty()),
        metrics_addr: None,
        redrive: false,
        oauth: OAuthOptions::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bootstrap" => a.bootstrap = value()?,
            "--topic" => a.topics.push(value()?),
            "--dsn" => a.dsn = value()?,
            "--group" => a.group = value()?,
            "--mode" => {
                a.mode = match value()?.as_str() {
                    "batch" => Mode::Batch,
                    "record" => Mode::Record,
                    other => bail!("--mode takes batch or record, not {other:?}"),
                }
            }
            "--on-poison" => {
                a.settings.on_poison = value()?.parse::<OnPoison>().map_err(anyhow::Error::msg)?
            }
            "--pool-size" => a.settings.pool_size = value()?.parse().context("--pool-size")?,
            "--max-batch-records" => {
                a.settings.max_batch_records = value()?.parse().context("--max-batch-records")?
            }
            "--handler-timeout-ms" => {
                let ms = value()?.parse().context("--handler-timeout-ms")?;
                a.handler_timeout = Some(std::time::Duration::from_millis(ms));
            }
            "--instance-id" => a.instance_id = Some(value()?),
            "--metrics-addr" => a.metrics_addr = Some(value()?.parse().context("--metrics-addr")?),
            "--redrive" => a.redrive = true,
            "--oauth-provider" => match value()?.as_str() {
                "aws-msk-iam" => a.oauth.oauth_provider = Some(ProviderName::AwsMskIam),
                other => bail!("--oauth-provider takes aws-msk-iam, not {other:?}"),
            },
            "--aws-region" => a.oauth.aws_region = Some(value()?),
            "--kafka-property" => {
                let v = value()?;
                let (k, v) = v
                    .split_once('=')
                    .context("--kafka-property takes NAME=VALUE")?;
                // A secret (the OAuth client secret, a SASL password)
                // need not be on the command line.
                let v = match v.strip_prefix("env:") {
                    Some(name) => std::env::var(name)
                        .with_context(|| format!("--kafka-property {k}: reading ${name}"))?,
                    None => v.to_owned(),
                };
                a.kafka.push((k.to_owned(), v));
            }
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    let needs_kafka = !a.redrive && (a.bootstrap.is_empty() || a.topics.is_empty());
    if needs_kafka || a.dsn.is_empty() || a.group.is_empty() {
        bail!("{USAGE}");
    }
    Ok(a)
}

async fn apply_one(tx: &Transaction<'_>, d: &Delivery<'_>) -> Result<(), tokio_postgres::Error> {
    let payload = d.payload().map(|p| String::from_utf8_lossy(p).into_owned());
    tx.execute(
        INSERT_ONE,
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
}

async fn apply_batch(
    tx: &Transaction<'_>,
    batch: &[Delivery<'_>],
) -> Result<(), tokio_postgres::Error> {
    let keys: Vec<String> = batch.iter().map(|d| d.meta.key.to_hex()).collect();
    let sources: Vec<&str> = batch.iter().map(|d| d.meta.source.as_str()).collect();
    let topics: Vec<&str> = batch.iter().map(|d| d.position.topic.as_str()).collect();
    let partitions: Vec<i32> = batch.iter().map(|d| d.position.partition).collect();
    let offsets: Vec<i64> = batch.iter().map(Delivery::offset).collect();
    let payloads: Vec<Option<String>> = batch
        .iter()
        .map(|d| d.payload().map(|p| String::from_utf8_lossy(p).into_owned()))
        .collect();
    tx.execute(
        INSERT_BATCH,
        &[&keys, &sources, &topics, &partitions, &offsets, &payloads],
    )
    .await
    .map(|_| ())
}

/// Answers each connection's one request: the registry at `GET /metrics`,
/// 404 for any other path; then closes it.
async fn serve_metrics(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let answered = tokio::time::timeout(Duration::from_secs(10), answer(stream, &registry));
            if let Ok(Err(e)) = answered.await {
                tracing::debug!("metrics request failed: {e}");
            }
        });
    }
}

async fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let mut words = line.split_whitespace();
    let (status, content_type, body) = match (words.next(), words.next()) {
        (Some("GET"), Some("/metrics")) => {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry)
                .map_err(std::io::Error::other)?;
            let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            ("200 OK", content_type, text)
        }
        _ => (
            "404 Not Found",
            "text/plain",
            "try GET /metrics\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
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
    let database = Database::from_dsn(&args.dsn).context("parsing --dsn")?;
    let mut client = database
        .connect()
        .await
        .context("connecting to the service database")?;
    walrelay_consumer::migrate(&client).await?;
    client.batch_execute(SCHEMA).await?;

    if args.redrive {
        let report = walrelay_consumer::redrive(&mut client, &args.group, async |tx, d| {
            apply_one(tx, d).await
        })
        .await?;
        println!(
            "re-driven: {} applied, {} failed again, {} without walrelay headers",
            report.applied, report.failed, report.unusable
        );
        return Ok(());
    }
    drop(client);

    let mut kafka = ClientConfig::new();
    kafka
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group);
    if let Some(id) = &args.instance_id {
        kafka.set("group.instance.id", id);
    }
    for (k, v) in &args.kafka {
        kafka.set(k, v);
    }
    let topics: Vec<&str> = args.topics.iter().map(String::as_str).collect();
    let mut consumer =
        ConsumerLoop::with_oauth(kafka, &topics, PgHwmStore::new(), database, &args.oauth)?
            .with_settings(args.settings);
    if let Some(timeout) = args.handler_timeout {
        consumer = consumer.with_handler_timeout(timeout);
    }
    let counters = consumer.counters();
    let metrics = consumer.metrics();
    if let Some(addr) = args.metrics_addr {
        let mut registry = Registry::default();
        counters.register(&mut registry);
        metrics.register(&mut registry);
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding --metrics-addr {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "serving /metrics");
        tokio::spawn(serve_metrics(listener, Arc::new(registry)));
    }

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

    let result = match args.mode {
        Mode::Batch => consumer.run_batches(apply_batch, stop_rx).await,
        Mode::Record => consumer.run(apply_one, stop_rx).await,
    };
    let c = counters.snapshot();
    println!(
        "stopped: {} processed, {} duplicates skipped, {} gaps, {} parked, {} failed attempts",
        c.processed, c.duplicates, c.gaps, c.parked, c.errors
    );
    // Where the partitions' time went (partition-seconds per phase).
    let phases: Vec<String> = metrics
        .time_breakdown()
        .into_iter()
        .filter(|(_, seconds)| *seconds > 0.0)
        .map(|(phase, seconds)| format!("{} {seconds:.2}", phase.name()))
        .collect();
    println!("partition-seconds: {}", phases.join(", "));
    result?;
    Ok(())
}
