//! The operations kit (deploy/) against the real thing: Prometheus (the
//! Debian package's server, on a free loopback port with a throwaway data
//! directory) scrapes a running `walrelay run` and both example consumers
//! (`apply_events --metrics-addr`, `python/examples/consumer.py
//! --metrics-addr`) through a short workload, with
//! deploy/prometheus/walrelay.rules.yml loaded. Checked through its HTTP
//! API: every rule loads and evaluates, every query of
//! deploy/grafana/walrelay.json returns data, a poison record parks in
//! one consumer (`walrelay_consumer_parked_records` 1, read from the
//! table) and stops a partition in the other (`WalrelayConsumerStopped`
//! fires), no relay alert fires, and every walrelay metric the three
//! processes expose is documented in docs/metrics.md.
//!
//! promtool's checks and unit tests of the rules, and the dashboard's
//! structure, are scripts/test.sh's "ops kit" stage. Runs in its Apache
//! Kafka stage, which has the Python virtualenv.

mod support;

#[path = "ops_kit/prom.rs"]
mod prom;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use prom::{free_addr, Prometheus};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use serde_json::Value;
use support::{Env, WAIT};
use tokio::process::{Child, Command};
use walrelay_testkit::python_interpreter;

const POLL: Duration = Duration::from_millis(250);
/// Grafana's `$__rate_interval` at a 1 s scrape interval, about.
const RATE_INTERVAL: &str = "10s";
/// Series that exist only after an event this test does not cause (a
/// Kafka error, a replay after a crash, a changed layout; until then the
/// relay exposes no sample of them, and no `# TYPE` line either): their
/// queries must run, not return data. scripts/check-ops-kit.py checks
/// that their names are documented ones.
const EVENT_ONLY: [&str; 4] = [
    "walrelay_kafka_errors_total",
    "walrelay_fence_skipped_records_total",
    "walrelay_fence_unfenced_topics_total",
    "walrelay_fence_untrusted_partitions_total",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every query of the dashboard: (panel title, expression).
fn dashboard_queries() -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/walrelay.json"))?;
    let d: Value = serde_json::from_str(&text)?;
    let mut out = Vec::new();
    for p in d["panels"].as_array().context("no panels")? {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().context("a query without expr")?;
            out.push((
                p["title"].as_str().unwrap_or("?").to_owned(),
                expr.replace("$__rate_interval", RATE_INTERVAL),
            ));
        }
    }
    ensure!(!out.is_empty(), "the dashboard has no queries");
    Ok(out)
}

/// The alert names of the rules file.
fn alert_names() -> Result<BTreeSet<String>> {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/walrelay.rules.yml"))?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect())
}

/// The metric names docs/metrics.md documents (its tables' first column).
fn documented() -> Result<BTreeSet<String>> {
    let text = std::fs::read_to_string(repo().join("docs/metrics.md"))?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("| `walrelay_"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| format!("walrelay_{name}"))
        .collect())
}

/// The apply_events example, built by `cargo build --examples` (the build
/// stage of scripts/test.sh), and not older than its source.
fn apply_events() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .context("no target dir")?;
    let bin = profile.join("examples/apply_events");
    let source = repo().join("crates/walrelay-consumer/examples/apply_events.rs");
    let built = std::fs::metadata(&bin).and_then(|m| m.modified());
    match built {
        Ok(built) if built >= std::fs::metadata(&source)?.modified()? => Ok(bin),
        _ => bail!(
            "{} is missing or older than its source: cargo build -p walrelay-consumer --example \
             apply_events (scripts/test.sh's build stage builds every example)",
            bin.display()
        ),
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Result<Child> {
    let out = std::fs::File::create(log)?;
    Ok(cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()?)
}

/// Emits events until `stop`: transactions of 1 to 5 events, every 50 ms.
async fn workload(dsn: String, stop: Arc<AtomicBool>) -> Result<u64> {
    let (client, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let events = n % 5 + 1;
        client
            .batch_execute(&format!(
                "SELECT walrelay.emit('orders', 'k-' || g, '{{}}'::jsonb) \
                 FROM generate_series({n}, {}) AS g",
                n + events - 1
            ))
            .await?;
        n += events;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(n)
}

/// A record without walrelay headers to partition 0: parked by one
/// consumer, stopping the partition in the other.
async fn poison(bootstrap: &str) -> Result<()> {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    p.send(
        FutureRecord::<str, str>::to("orders")
            .partition(0)
            .key("poison")
            .payload("not from walrelay"),
        Duration::from_secs(10),
    )
    .await
    .map_err(|(e, _)| e)?;
    Ok(())
}

fn scrape_config(relay: &str, consumers: &[String]) -> String {
    let rules = repo().join("deploy/prometheus/walrelay.rules.yml");
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {}\n\
         scrape_configs:\n\
         \x20 - job_name: walrelay\n    static_configs:\n      - targets: ['{relay}']\n\
         \x20 - job_name: walrelay-consumer\n    static_configs:\n      - targets: ['{}']\n",
        rules.display(),
        consumers.join("', '")
    )
}

/// What is still missing; empty when everything was seen.
struct Pending {
    queries: Vec<(String, String)>,
    parked: bool,
    stopped: bool,
    rules: BTreeSet<String>,
}

impl Pending {
    async fn check(&mut self, p: &mut Prometheus) -> Result<()> {
        let mut left = Vec::new();
        for (title, expr) in std::mem::take(&mut self.queries) {
            let samples = p
                .query(&expr)
                .await
                .with_context(|| format!("{title}: {expr}"))?;
            let event_only = EVENT_ONLY.iter().any(|m| expr.contains(m));
            if !event_only && !samples.iter().any(prom::finite) {
                left.push((title, expr));
            }
        }
        self.queries = left;
        if !self.parked {
            let q = "walrelay_consumer_parked_records{job=\"walrelay-consumer\"} == 1";
            self.parked = !p.query(q).await?.is_empty();
        }
        if !self.stopped {
            let alerts = p.api("alerts").await?;
            self.stopped = alerts["alerts"].as_array().into_iter().flatten().any(|a| {
                a["labels"]["alertname"] == "WalrelayConsumerStopped" && a["state"] == "firing"
            });
        }
        let groups = p.api("rules").await?;
        for g in groups["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().into_iter().flatten() {
                let name = r["name"].as_str().unwrap_or_default();
                if r["health"] == "err" {
                    bail!("rule {name} does not evaluate: {}", r["lastError"]);
                }
                if r["health"] == "ok" {
                    self.rules.remove(name);
                }
            }
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.queries.is_empty() && self.parked && self.stopped && self.rules.is_empty()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_loads_the_rules_and_every_dashboard_query_has_data() -> Result<()> {
    let began = Instant::now();
    prom::installed("prometheus")?;
    let python = python_interpreter()?.context(
        "the Python example consumer is part of this test: run scripts/install-python-venv.sh \
         or set WALRELAY_PYTHON",
    )?;
    let apply_events = apply_events()?;
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    env.create_topics(&["orders"])?;
    // A limit, so that the slot has a safe_wal_size to show.
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'",
        "SELECT pg_reload_conf()",
        "CREATE DATABASE rust_app",
        "CREATE DATABASE python_app",
    ] {
        env.client.batch_execute(sql).await?;
    }
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let dir = tempfile::tempdir()?;
    let (relay, rust, py) = (free_addr()?, free_addr()?, free_addr()?);

    let _relay = spawn(
        Command::new(env!("CARGO_BIN_EXE_walrelay"))
            .args(["--postgres-url", &config.postgres.url])
            .args(["--bootstrap-servers", &bootstrap])
            .args(["--status-interval", "200ms", "run"])
            .env("WALRELAY_METRICS_ADDR", relay.to_string()),
        &dir.path().join("relay.log"),
    )?;
    let _rust = spawn(
        Command::new(&apply_events)
            .args(["--bootstrap", &bootstrap, "--topic", "orders"])
            .args(["--dsn", &env.cluster.url("postgres", "rust_app")])
            .args(["--group", "ops-kit-rust", "--on-poison", "park"])
            .args(["--metrics-addr", &rust.to_string()]),
        &dir.path().join("rust.log"),
    )?;
    let _python = spawn(
        Command::new(&python)
            .arg(repo().join("python/examples/consumer.py"))
            .args(["--bootstrap", &bootstrap, "--topic", "orders"])
            .args(["--dsn", &env.cluster.url("postgres", "python_app")])
            .args(["--group", "ops-kit-python", "--on-poison", "stop"])
            .args(["--metrics-addr", &py.to_string()]),
        &dir.path().join("python.log"),
    )?;
    let mut p = Prometheus::start(
        dir.path(),
        &scrape_config(&relay.to_string(), &[rust.to_string(), py.to_string()]),
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(workload(
        env.cluster.url("postgres", "postgres"),
        Arc::clone(&stop),
    ));
    let logs = |p: &Prometheus| {
        let mut out = format!("prometheus:\n{}\n", p.log_tail());
        for name in ["relay", "rust", "python"] {
            let tail = prom::tail(&dir.path().join(format!("{name}.log")), 15);
            out.push_str(&format!("{name}:\n{tail}\n"));
        }
        out
    };

    // Every target up, and both consumers applying, before the poison.
    let deadline = Instant::now() + WAIT;
    loop {
        // Until the server listens, a refused connection.
        let seen = async {
            let targets = p.api("targets").await?;
            let active = targets["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let up = active.iter().filter(|t| t["health"] == "up").count();
            let q = "walrelay_consumer_records_applied_total > 0";
            anyhow::Ok((up, p.query(q).await?.len()))
        }
        .await;
        match seen {
            Ok((3, 2)) => break,
            _ if Instant::now() > deadline => bail!(
                "after {WAIT:?}, (targets up, consumers applying) of (3, 2): {seen:?}\n{}",
                logs(&p)
            ),
            _ => p.exited()?,
        }
        tokio::time::sleep(POLL).await;
    }
    let applying = began.elapsed();
    poison(&bootstrap).await?;

    let mut pending = Pending {
        queries: dashboard_queries()?,
        parked: false,
        stopped: false,
        rules: alert_names()?,
    };
    let deadline = Instant::now() + WAIT;
    while !pending.done() {
        if Instant::now() > deadline {
            bail!(
                "after {WAIT:?}: queries without data {:?}; parked record seen: {}; \
                 WalrelayConsumerStopped firing: {}; rules not evaluated: {:?}\n{}",
                pending.queries,
                pending.parked,
                pending.stopped,
                pending.rules,
                logs(&p)
            );
        }
        pending.check(&mut p).await?;
        tokio::time::sleep(POLL).await;
    }
    stop.store(true, Ordering::Relaxed);
    let events = load.await??;

    // No relay alert fires on this healthy relay.
    let alerts = p.api("alerts").await?;
    let firing: Vec<&Value> = alerts["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "firing" && a["labels"]["job"] == "walrelay")
        .collect();
    ensure!(firing.is_empty(), "relay alerts firing: {firing:?}");
    // Every walrelay metric the three expose is documented.
    let docs = documented()?;
    let names = p.api("label/__name__/values").await?;
    let mut undocumented = Vec::new();
    for name in names
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let base = ["_bucket", "_count", "_sum", "_created"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        let known = [base.to_owned(), format!("{base}_total")]
            .iter()
            .any(|n| docs.contains(n));
        if name.starts_with("walrelay_") && !known {
            undocumented.push(name.to_owned());
        }
    }
    ensure!(
        undocumented.is_empty(),
        "exposed but not in docs/metrics.md: {undocumented:?}"
    );
    eprintln!(
        "ops kit: {events} events; all three scraped and both consumers applying after {:.1} s, \
         every dashboard query with data and every rule evaluated after {:.1} s",
        applying.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
    Ok(())
}
