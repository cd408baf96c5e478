//! walrelay end to end on throwaway servers (the README's first command,
//! `scripts/demo.sh`):
//!
//! 1. starts a throwaway PostgreSQL (wal_level=logical) and a broker:
//!    Tansu, or Apache Kafka with `WALRELAY_BROKER=kafka`
//!    (`scripts/demo.sh --kafka`);
//! 2. creates an outbox table and runs `walrelay setup` and `walrelay run`
//!    (the real binary, `WALRELAY_BIN` or `target/debug/walrelay`);
//! 3. emits a few thousand events from SQL: walrelay.emit helpers, raw
//!    messages and outbox rows, in several transactions, one rolled back;
//! 4. reads them back from Kafka and prints topic / partition / key / value;
//! 5. stops the relay with SIGTERM and everything else it started.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use walrelay_testkit::{
    await_condition, db, outbox_table, read_until_quiet, BrokerKind, ClusterOptions, OutboxKeys,
    PgCluster, TestBroker,
};

fn walrelay_bin() -> PathBuf {
    std::env::var_os("WALRELAY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/walrelay")
        })
}

/// The servers the demo starts, and the relay's configuration file.
struct Servers {
    cluster: PgCluster,
    broker: TestBroker,
    kind: BrokerKind,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Servers {
    /// `walrelay --config CONFIG ARGS...`.
    fn walrelay(&self, bin: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(bin);
        c.arg("--config").arg(&self.config).args(args);
        c
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let bin = walrelay_bin();
    ensure!(
        bin.exists(),
        "{} not found: build it first (cargo build -p walrelay)",
        bin.display()
    );
    let servers = start_servers().await?;
    let client = servers.cluster.client().await?;
    client
        .batch_execute(&format!(
            "{}\n    ALTER TABLE outbox ALTER COLUMN id SET DEFAULT gen_random_uuid()::text;",
            outbox_table(OutboxKeys::Required)
        ))
        .await?;

    println!("\n== walrelay setup");
    let out = servers.walrelay(&bin, &["setup"]).output()?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!(
            "walrelay setup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    println!("\n== walrelay run (in the background)");
    let log_path = servers.dir.path().join("walrelay.log");
    let log = std::fs::File::create(&log_path)?;
    let mut relay = servers
        .walrelay(&bin, &["--log", "info", "run"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;

    let expected = emit(&client).await?;
    let end = db::current_wal_lsn(&client).await?;
    await_condition(
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { Ok(db::confirmed_flush_lsn(&client, "walrelay").await? >= Some(end)) },
    )
    .await
    .with_context(|| std::fs::read_to_string(&log_path).unwrap_or_default())?;
    println!("   Kafka acknowledged everything; slot confirmed_flush_lsn >= {end}");

    read_back(&servers.broker, expected).await?;

    println!("\n== stopping walrelay (SIGTERM: drain, final status update, exit 0)");
    ensure!(Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()?
        .success());
    let status = relay.wait()?;
    ensure!(
        status.success(),
        "walrelay exited with {status}: {}",
        std::fs::read_to_string(&log_path)?
    );
    println!(
        "   walrelay exited 0; stopping PostgreSQL and {}",
        servers.kind
    );
    Ok(())
}

/// A throwaway PostgreSQL and broker, and the relay's configuration.
async fn start_servers() -> Result<Servers> {
    let kind = BrokerKind::from_env()?;
    println!("== starting a throwaway PostgreSQL and {kind}");
    let cluster = tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default()))
        .await?
        .context("starting PostgreSQL (scripts/install-postgres.sh installs it)")?;
    let broker = tokio::task::spawn_blocking(move || TestBroker::start_own(kind))
        .await?
        .with_context(|| match kind {
            BrokerKind::Kafka => "starting Apache Kafka (scripts/install-kafka.sh installs it)",
            BrokerKind::Tansu => "starting Tansu (scripts/install-tansu.sh installs it)",
        })?;
    println!(
        "   {} on port {}, {kind} at {}",
        cluster.version(),
        cluster.port(),
        broker.bootstrap_servers()
    );
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("walrelay.toml");
    std::fs::write(
        &config,
        format!(
            r#"[postgres]
url = "{}?sslmode=disable"
status_interval = "200ms"

[kafka]
bootstrap_servers = "{}"

[[messages]]
prefix = "audit"
topic = "audit-log"

[[outbox]]
table = "public.outbox"
"#,
            cluster.url("postgres", "postgres"),
            broker.bootstrap_servers()
        ),
    )?;
    Ok(Servers {
        cluster,
        broker,
        kind,
        dir,
        config,
    })
}

/// The demo's events, written from SQL; returns how many must arrive.
async fn emit(client: &tokio_postgres::Client) -> Result<usize> {
    println!("\n== emitting events from SQL");
    let workload: &[(&str, &str)] = &[
        (
            "1,000 orders through walrelay.emit (10 transactions of 100)",
            "SELECT count(walrelay.emit('orders', 'customer-' || (g % 10), jsonb_build_object('order', g, 'total', g * 3))) FROM generate_series(1, 100) g",
        ),
        (
            "2,000 outbox rows (10 transactions of 200)",
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers) SELECT 'invoice', 'invoice-' || (g % 20), 'InvoiceIssued', jsonb_build_object('invoice', g), '{\"tenant\": \"acme\"}' FROM generate_series(1, 200) g",
        ),
        (
            "500 raw messages with prefix 'audit' (10 transactions of 50)",
            "SELECT count(pg_logical_emit_message(true, 'audit', 'user ' || g || ' logged in')) FROM generate_series(1, 50) g",
        ),
    ];
    for (what, sql) in workload {
        for _ in 0..10 {
            client.batch_execute(sql).await?;
        }
        println!("   {what}");
    }
    client
        .batch_execute(
            "BEGIN;
             SELECT walrelay.emit('orders', 'rolled-back', '{\"never\": true}'::jsonb);
             INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('invoice', 'rolled-back', 'X', '{}');
             ROLLBACK;",
        )
        .await?;
    println!("   1 transaction rolled back (2 events that must never appear)");
    Ok(1000 + 2000 + 500)
}

/// Reads the topics back: `expected` records, none rolled back; prints
/// each partition's key range and a few records.
async fn read_back(broker: &TestBroker, expected: usize) -> Result<()> {
    println!("\n== reading back from Kafka");
    let records = read_until_quiet(
        &broker.bootstrap_servers(),
        &["orders", "outbox.event.invoice", "audit-log"],
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        records.len() == expected,
        "expected {expected} records, read {}",
        records.len()
    );
    ensure!(
        !records.iter().any(|r| r.key_str() == Some("rolled-back")),
        "a rolled-back event was published"
    );
    let mut per_partition: BTreeMap<(String, i32), (usize, String, String)> = BTreeMap::new();
    for r in &records {
        let e = per_partition
            .entry((r.topic.clone(), r.partition))
            .or_insert_with(|| (0, String::new(), String::new()));
        e.0 += 1;
        let key = r
            .header_str("idempotency-key")
            .unwrap_or_default()
            .to_owned();
        if e.1.is_empty() || key < e.1 {
            e.1 = key.clone();
        }
        if key > e.2 {
            e.2 = key;
        }
    }
    println!(
        "\n{:<22} {:>9} {:>8}  {:<32}  {:<32}",
        "topic", "partition", "records", "first idempotency-key", "last idempotency-key"
    );
    for ((topic, partition), (n, first, last)) in &per_partition {
        println!("{topic:<22} {partition:>9} {n:>8}  {first:<32}  {last:<32}");
    }
    println!("\nsample records (topic / partition / key / value):");
    for topic in ["orders", "outbox.event.invoice", "audit-log"] {
        for r in records.iter().filter(|r| r.topic == topic).take(3) {
            println!(
                "  {:<22} {:>2}  {:<14} {}",
                r.topic,
                r.partition,
                r.key_str().unwrap_or("(none)"),
                r.value_str().unwrap_or("(binary)")
            );
        }
    }
    println!(
        "\n{} records: every committed event once, nothing from the rolled-back transaction.",
        records.len()
    );
    Ok(())
}
