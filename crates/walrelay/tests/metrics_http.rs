//! `/metrics`, `/healthz` and `/readyz` against a real PostgreSQL and a
//! real Kafka-compatible broker (Tansu): the relay in-process with a
//! metrics handle, scraped over plain HTTP/1.1 and parsed; and the binary
//! with `--metrics-addr` and JSON logs.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use support::{Env, WAIT};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use walrelay::engine::pipeline;
use walrelay::http::HttpServer;
use walrelay::metrics::Metrics;
use walrelay_testkit::await_condition;

const POLL: Duration = Duration::from_millis(50);

/// One plain HTTP/1.1 request: status and body.
async fn request(addr: SocketAddr, method: &str, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let raw = String::from_utf8(raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no end of headers")?;
    let status = head.split(' ').nth(1).context("no status code")?.parse()?;
    ensure!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "unexpected chunked body"
    );
    Ok((status, body.to_owned()))
}

async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    request(addr, "GET", path).await
}

/// One sample of the text exposition: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text format: samples, skipping comments (`# HELP`, `# TYPE`,
/// `# UNIT`, `# EOF`) and blank lines. Label values may contain escaped
/// quotes and backslashes.
fn parse_exposition(text: &str) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .with_context(|| format!("no value in {line:?}"))?;
        let name = line[..name_end].to_owned();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices();
            let mut key = String::new();
            loop {
                let Some((i, c)) = chars.next() else {
                    bail!("unterminated labels in {line:?}");
                };
                match c {
                    '}' => {
                        rest = &inner[i + 1..];
                        break;
                    }
                    ',' => {}
                    '=' => {
                        ensure!(chars.next().map(|(_, c)| c) == Some('"'), "{line:?}");
                        let mut value = String::new();
                        loop {
                            match chars.next() {
                                Some((_, '\\')) => match chars.next() {
                                    Some((_, 'n')) => value.push('\n'),
                                    Some((_, c)) => value.push(c),
                                    None => bail!("{line:?}"),
                                },
                                Some((_, '"')) => break,
                                Some((_, c)) => value.push(c),
                                None => bail!("unterminated label value in {line:?}"),
                            }
                        }
                        labels.insert(std::mem::take(&mut key), value);
                    }
                    c => key.push(c),
                }
            }
        }
        // A value, then an optional timestamp.
        let value = rest
            .split_whitespace()
            .next()
            .with_context(|| format!("no value in {line:?}"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .with_context(|| format!("bad value in {line:?}"))?,
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    Ok(out)
}

struct Scrape(Vec<Sample>);

impl Scrape {
    async fn take(addr: SocketAddr) -> Result<Scrape> {
        let (status, body) = get(addr, "/metrics").await?;
        ensure!(status == 200, "/metrics: {status} {body}");
        ensure!(body.ends_with("# EOF\n"), "incomplete exposition: {body}");
        Ok(Scrape(parse_exposition(&body)?))
    }

    /// The value of the sample with this name and exactly these labels.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.0
            .iter()
            .find(|s| s.name == name && s.labels == labels)
            .map(|s| s.value)
    }

    fn value(&self, name: &str) -> f64 {
        self.get(name, &[])
            .unwrap_or_else(|| panic!("no sample {name}"))
    }

    fn all(&self, name: &str) -> Vec<&Sample> {
        self.0.iter().filter(|s| s.name == name).collect()
    }
}

#[test]
fn the_test_parser_reads_the_text_format() {
    let samples = parse_exposition(
        "# HELP a_total A.\n# TYPE a counter\na_total{topic=\"x\",k=\"q\\\"\\\\,}\"} 3\nb 1.5e3\nc_bucket{le=\"+Inf\"} 2 1700000000\n# EOF\n",
    )
    .unwrap();
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].name, "a_total");
    assert_eq!(samples[0].labels["topic"], "x");
    assert_eq!(samples[0].labels["k"], "q\"\\,}");
    assert_eq!(samples[0].value, 3.0);
    assert_eq!(samples[1].value, 1500.0);
    assert_eq!(samples[2].labels["le"], "+Inf");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_readiness_follow_the_relay() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;

    let metrics = Metrics::new();
    let server =
        HttpServer::start("127.0.0.1:0".parse()?, metrics.clone(), Some(&config.kafka)).await?;
    let addr = server.local_addr();

    // Before the relay runs: alive, not ready, everything registered.
    assert_eq!(get(addr, "/healthz").await?.0, 200);
    let (status, body) = get(addr, "/readyz").await?;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not streaming"), "{body}");
    let before = Scrape::take(addr).await?;
    assert_eq!(before.value("walrelay_up"), 1.0);
    assert_eq!(before.value("walrelay_ready"), 0.0);
    assert_eq!(before.value("walrelay_sessions_total"), 0.0);
    assert_eq!(
        before.get(
            "walrelay_dead_letter_records_total",
            &[("kind", "malformed-envelope")]
        ),
        Some(0.0)
    );
    assert_eq!(
        before.get(
            "walrelay_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert!(before.all("walrelay_events_total").is_empty());

    // Not the metrics paths.
    assert_eq!(get(addr, "/").await?.0, 404);
    assert_eq!(get(addr, "/metricsx").await?.0, 404);
    assert_eq!(request(addr, "POST", "/metrics").await?.0, 405);

    let (stop, stop_rx) = watch::channel(false);
    let relay = tokio::spawn(pipeline::run_with(
        config.clone(),
        stop_rx,
        None,
        Some(metrics.clone()),
    ));

    // Streaming from the slot, and the probe reached Tansu.
    await_condition(WAIT, POLL, || async {
        Ok(get(addr, "/readyz").await?.0 == 200)
    })
    .await
    .context("/readyz never became 200")?;

    let c = &env.client;
    c.batch_execute(
        "SELECT walrelay.emit('payments', 'p-' || g, jsonb_build_object('g', g)) FROM generate_series(1, 3) g;
         BEGIN;
         SELECT pg_logical_emit_message(true, 'orders', 'raw-1');
         INSERT INTO outbox VALUES ('e-1', 'order', 'o-1', 'OrderCreated', '{\"total\": 42}', NULL);
         SELECT pg_logical_emit_message(true, 'orders', 'raw-2');
         COMMIT;",
    )
    .await?;
    let end_of_workload = env.current_wal_lsn().await?;

    // Every event acknowledged and its transaction confirmed.
    let last = Mutex::new(None);
    await_condition(WAIT, POLL, || {
        let last = &last;
        async move {
            let s = Scrape::take(addr).await?;
            let done = s.get("walrelay_events_total", &[("topic", "payments")]) == Some(3.0)
                && s.get("walrelay_events_total", &[("topic", "orders")]) == Some(2.0)
                && s.get("walrelay_events_total", &[("topic", "outbox.event.order")]) == Some(1.0)
                && s.value("walrelay_in_flight_events") == 0.0
                && s.value("walrelay_confirmed_flush_lsn") > 0.0;
            *last.lock().unwrap() = Some(s);
            Ok(done)
        }
    })
    .await
    .with_context(|| {
        format!(
            "last scrape: {:?}",
            last.lock().unwrap().as_ref().map(|s| &s.0)
        )
    })?;
    let s = last.into_inner().unwrap().expect("scraped");

    // Exactly what was emitted, per topic, nothing else.
    let events: BTreeMap<&str, f64> = s
        .all("walrelay_events_total")
        .into_iter()
        .map(|x| (x.labels["topic"].as_str(), x.value))
        .collect();
    assert_eq!(
        events,
        BTreeMap::from([
            ("orders", 2.0),
            ("outbox.event.order", 1.0),
            ("payments", 3.0)
        ])
    );
    for topic in ["orders", "outbox.event.order", "payments"] {
        let bytes = s
            .get("walrelay_event_bytes_total", &[("topic", topic)])
            .context("bytes per topic")?;
        assert!(
            bytes > 100.0,
            "{topic}: {bytes} bytes (headers alone are more)"
        );
    }
    assert_eq!(s.value("walrelay_in_flight_bytes"), 0.0);
    assert_eq!(s.value("walrelay_sessions_total"), 1.0);
    assert_eq!(s.value("walrelay_reconnects_total"), 0.0);
    assert!(s.all("walrelay_kafka_errors_total").is_empty());
    assert_eq!(s.value("walrelay_ready"), 1.0);

    // Positions: confirmed within the WAL written, the server's end of WAL
    // at or past it, the lag their difference.
    let confirmed = s.value("walrelay_confirmed_flush_lsn");
    let wal_end = s.value("walrelay_server_wal_end_lsn");
    assert!(confirmed > 0.0 && confirmed <= end_of_workload.0 as f64);
    assert!(wal_end >= confirmed, "{wal_end} < {confirmed}");
    assert_eq!(s.value("walrelay_slot_lag_bytes"), wal_end - confirmed);

    // Commit to ack: one observation per transactional event, in the
    // +Inf bucket and counted; buckets cumulative.
    assert_eq!(s.value("walrelay_commit_to_ack_seconds_count"), 6.0);
    assert_eq!(
        s.get("walrelay_commit_to_ack_seconds_bucket", &[("le", "+Inf")]),
        Some(6.0)
    );
    let buckets: Vec<f64> = s
        .all("walrelay_commit_to_ack_seconds_bucket")
        .iter()
        .map(|b| b.value)
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert!(s
        .get("walrelay_commit_to_ack_seconds_bucket", &[("le", "0.001")])
        .is_some());
    assert!(s
        .get("walrelay_commit_to_ack_seconds_bucket", &[("le", "60.0")])
        .is_some());

    // The slot agrees with the gauge once the status update arrived.
    await_condition(WAIT, POLL, || async {
        let gauge = Scrape::take(addr)
            .await?
            .value("walrelay_confirmed_flush_lsn");
        Ok(env.confirmed_flush_lsn("walrelay").await?.0 as f64 == gauge)
    })
    .await
    .context("the slot's confirmed_flush_lsn never matched the gauge")?;

    // Stopped: alive (the process still runs) but not ready.
    stop.send(true)?;
    relay.await??;
    assert_eq!(get(addr, "/healthz").await?.0, 200);
    let (status, body) = get(addr, "/readyz").await?;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("stopped"), "{body}");
    assert_eq!(Scrape::take(addr).await?.value("walrelay_ready"), 0.0);

    // The server stops with the relay.
    server.shutdown().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_kafka_is_unreachable() -> Result<()> {
    let env = Env::postgres_only(Default::default()).await?;
    // Nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = env.config(&closed.to_string());
    walrelay::commands::setup::setup(&config).await?;

    let metrics = Metrics::new();
    let server =
        HttpServer::start("127.0.0.1:0".parse()?, metrics.clone(), Some(&config.kafka)).await?;
    let addr = server.local_addr();
    let (stop, stop_rx) = watch::channel(false);
    let relay = tokio::spawn(pipeline::run_with(
        config,
        stop_rx,
        None,
        Some(metrics.clone()),
    ));

    // The session streams (nothing to send yet, so it does not fail), but
    // the probe cannot reach Kafka.
    await_condition(WAIT, POLL, || async {
        let s = Scrape::take(addr).await?;
        Ok(s.value("walrelay_sessions_total") >= 1.0 && metrics.is_streaming())
    })
    .await?;
    let body = Mutex::new(String::new());
    await_condition(WAIT, POLL, || {
        let body = &body;
        async move {
            let (status, b) = get(addr, "/readyz").await?;
            ensure!(status == 503, "ready without Kafka: {b}");
            let unreachable = b.contains("Kafka unreachable");
            *body.lock().unwrap() = b;
            Ok(unreachable)
        }
    })
    .await
    .with_context(|| format!("last /readyz: {}", body.lock().unwrap()))?;
    assert_eq!(get(addr, "/healthz").await?.0, 200);

    stop.send(true)?;
    relay.await??;
    server.shutdown().await;
    Ok(())
}

/// Kills the child if the test fails half-way.
struct Child(tokio::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_metrics_and_logs_json_with_the_slot() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    // A free port, released for the binary to bind.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;

    let mut child = Child(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
            .args([
                "--postgres-url",
                &config.postgres.url,
                "--bootstrap-servers",
                &bootstrap,
                "--status-interval",
                "200ms",
                "--log-format",
                "json",
                "run",
            ])
            .env("WALRELAY_METRICS_ADDR", addr.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?,
    );
    let stderr = child.0.stderr.take().context("stderr")?;
    let logs = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        let mut out = Vec::new();
        while let Ok(Some(l)) = lines.next_line().await {
            out.push(l);
        }
        out
    });

    await_condition(WAIT, POLL, || async {
        Ok(matches!(get(addr, "/readyz").await, Ok((200, _))))
    })
    .await
    .context("the binary never became ready")?;
    env.client
        .batch_execute("SELECT walrelay.emit('payments', 'p-1', '{}'::jsonb)")
        .await?;
    await_condition(WAIT, POLL, || async {
        let s = Scrape::take(addr).await?;
        Ok(s.get("walrelay_events_total", &[("topic", "payments")]) == Some(1.0))
    })
    .await?;
    assert_eq!(get(addr, "/healthz").await?.0, 200);

    // SIGTERM: drains, exits 0, and the endpoint goes away with it.
    let pid = child.0.id().context("pid")?;
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    assert!(killed.success());
    let status = tokio::time::timeout(WAIT, child.0.wait()).await??;
    assert!(status.success(), "{status}");
    assert!(TcpStream::connect(addr).await.is_err());

    // JSON logs whose relay lines carry the slot in their span.
    let lines = logs.await?;
    let mut with_slot = 0;
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        if v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("relaying from the slot's confirmed position"))
        {
            assert_eq!(v["span"]["slot"], "walrelay", "{line}");
            with_slot += 1;
        }
    }
    assert_eq!(with_slot, 1, "{lines:#?}");
    Ok(())
}
