//! The system under test and its surroundings: a source PostgreSQL (the
//! one faults hit; a primary and a failover standby with
//! `--pg-failover`, [`Source`]), a service PostgreSQL for the consumers' side effects
//! (never crashed: its `synchronous_commit=off` is safe only without
//! crashes), the brokers ([`Brokers`]: one, Tansu or Apache Kafka with
//! WALRELAY_BROKER=kafka, behind a [`Proxy`]; or three Apache Kafka
//! nodes), the `walrelay` binary and the harness's consumer processes.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use tokio::process::{Child, Command};
use walrelay_testkit::{
    outbox_table, BrokerKind, ClusterOptions, KafkaCluster, KafkaOptions, OutboxKeys, PgCluster,
    TestBroker,
};

use crate::proxy::Proxy;
use crate::source::Source;

/// Topic of `walrelay.emit` events (keyed).
pub const EMIT_TOPIC: &str = "chaos.emit";
/// Prefix and topic of raw messages (keyless).
pub const RAW_PREFIX: &str = "chaos";
pub const RAW_TOPIC: &str = "chaos.raw";
/// Topic of the outbox rows (`aggregatetype = 'chaos'`).
pub const OUTBOX_TOPIC: &str = "outbox.event.chaos";
pub const TOPICS: [(&str, i32); 3] = [(EMIT_TOPIC, 4), (RAW_TOPIC, 3), (OUTBOX_TOPIC, 4)];
/// The consumer group of the harness's consumer.
pub const GROUP: &str = "chaos";
/// The relay's slot, and the harness's own audit slot (test_decoding).
pub const SLOT: &str = "walrelay";
pub const AUDIT_SLOT: &str = "chaos_audit";
/// The producer's `message.timeout.ms`: broker outages last longer.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_millis(3000);

/// The outbox, and one row per committed workload unit, written in the
/// unit's own transaction: the ground truth of what committed.
fn source_schema() -> String {
    format!(
        "{}\n    CREATE TABLE chaos_ledger (unit bigint PRIMARY KEY, events int NOT NULL);",
        outbox_table(OutboxKeys::Required)
    )
}

/// Where the relay's records go.
pub enum Brokers {
    /// One broker behind the fault-injecting proxy (outages are the
    /// proxy's refusals and stalls).
    Proxied {
        broker: Box<TestBroker>,
        proxy: Proxy,
    },
    /// Three Apache Kafka nodes (replication factor 3,
    /// `min.insync.replicas=2`, no unclean election), clients straight to
    /// them: broker faults kill, restart, move and elect
    /// ([`crate::faults`]). Behind a mutex: faults restart nodes from
    /// blocking tasks while the run reads the bootstrap list.
    Cluster {
        cluster: Arc<std::sync::Mutex<KafkaCluster>>,
        bootstrap: String,
    },
}

/// The settings of the chaos topics on three brokers: what
/// docs/operations.md recommends for production.
pub const CLUSTER_TOPIC_CONFIG: [(&str, &str); 2] = [
    ("min.insync.replicas", "2"),
    ("unclean.leader.election.enable", "false"),
];

pub struct Services {
    pub source: Source,
    pub service: PgCluster,
    pub brokers: Brokers,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl Services {
    /// Starts everything; `brokers` is 1 (the proxied broker) or 3 (an
    /// Apache Kafka cluster).
    pub async fn start(keep: bool, brokers: usize, pg_failover: bool) -> Result<Services> {
        let tmp = tempfile::Builder::new()
            .prefix("walrelay-chaos-")
            .tempdir()?;
        let dir = tmp.path().to_path_buf();
        let tmp = if keep {
            let _ = tmp.keep();
            None
        } else {
            Some(tmp)
        };
        let source = tokio::task::spawn_blocking(move || Source::start(pg_failover)).await??;
        let service = tokio::task::spawn_blocking(|| {
            PgCluster::start(
                ClusterOptions::default()
                    .fsync(false)
                    .conf("synchronous_commit", "off"),
            )
        })
        .await??;
        let brokers = match brokers {
            1 => {
                let (proxy, broker) = proxied_broker().await?;
                for (topic, partitions) in TOPICS {
                    broker.create_topic(topic, partitions)?;
                }
                Brokers::Proxied {
                    broker: Box::new(broker),
                    proxy,
                }
            }
            3 => {
                let cluster = tokio::task::spawn_blocking(|| {
                    KafkaCluster::start(
                        KafkaOptions {
                            nodes: 3,
                            ..KafkaOptions::default()
                        }
                        .quick_to_notice_failures(),
                    )
                })
                .await??;
                for (topic, partitions) in TOPICS {
                    cluster.create_topic_with(topic, partitions, 3, &CLUSTER_TOPIC_CONFIG)?;
                }
                Brokers::Cluster {
                    bootstrap: cluster.bootstrap_servers(),
                    cluster: Arc::new(std::sync::Mutex::new(cluster)),
                }
            }
            n => bail!("--brokers {n}: the harness runs one broker or three"),
        };
        let s = Services {
            source,
            service,
            brokers,
            dir,
            _tmp: tmp,
        };
        s.source
            .primary()
            .client()
            .await?
            .batch_execute(&source_schema())
            .await?;
        s.source.protect().await?;
        Ok(s)
    }

    /// The source's connection string (a host list that follows the
    /// primary with `--pg-failover`).
    pub fn source_url(&self) -> String {
        self.source.url()
    }

    pub fn service_dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.service.port()
        )
    }

    /// Kafka clients go through the proxy (the broker advertises it), or
    /// straight to the three nodes.
    pub fn bootstrap(&self) -> String {
        match &self.brokers {
            Brokers::Proxied { proxy, .. } => proxy.addr().to_string(),
            Brokers::Cluster { bootstrap, .. } => bootstrap.clone(),
        }
    }

    /// The proxy in front of the single broker; `None` on three brokers.
    pub fn proxy(&self) -> Option<&Proxy> {
        match &self.brokers {
            Brokers::Proxied { proxy, .. } => Some(proxy),
            Brokers::Cluster { .. } => None,
        }
    }

    /// The three-node cluster; `None` with one broker.
    pub fn cluster(&self) -> Option<Arc<std::sync::Mutex<KafkaCluster>>> {
        match &self.brokers {
            Brokers::Proxied { .. } => None,
            Brokers::Cluster { cluster, .. } => Some(Arc::clone(cluster)),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The broker `WALRELAY_BROKER` names, advertising a [`Proxy`] in front
/// of it, so that every client connects through the proxy.
pub async fn proxied_broker() -> Result<(Proxy, TestBroker)> {
    let proxy = Proxy::bind().await?;
    let advertised = proxy.addr().to_string();
    let upstream = proxy.upstream_setter();
    let kind = BrokerKind::from_env()?;
    let broker = tokio::task::spawn_blocking(move || {
        TestBroker::start_advertising(kind, &advertised, move |port| {
            upstream.set(([127, 0, 0, 1], port).into())
        })
    })
    .await??;
    Ok((proxy, broker))
}

/// Appends to `path`.
fn log_file(path: &Path) -> Result<std::fs::File> {
    Ok(std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?)
}

/// The last `n` lines of a file, Java stack traces cut to their first
/// frames ([`condense_frames`]) so that an exception's own line stays in
/// view.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines = condense_frames(&text, 3);
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `text`'s lines with each run of stack frames (`\tat ...`) cut to its
/// first `keep` and a line saying how many were left out: a JVM's trace is
/// dozens of frames, and the line that names the exception comes first.
pub fn condense_frames(text: &str, keep: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut run = 0usize;
    let flush = |out: &mut Vec<String>, run: usize| {
        if run > keep {
            out.push(format!("\t... {} more frames", run - keep));
        }
    };
    for line in text.lines() {
        if line.trim_start().starts_with("at ") && line.starts_with(char::is_whitespace) {
            run += 1;
            if run <= keep {
                out.push(line.to_owned());
            }
            continue;
        }
        flush(&mut out, run);
        run = 0;
        out.push(line.to_owned());
    }
    flush(&mut out, run);
    out
}

/// Sends `signal` (e.g. "TERM", "USR1") to `pid`.
pub async fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .await?;
    ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

/// A child process the harness restarts after faults: the relay, or the
/// consumer.
pub struct Supervised {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    /// Exits nobody asked for: (status, log tail).
    pub unexpected_exits: Vec<String>,
    pub starts: u32,
}

impl Supervised {
    pub fn new(name: &'static str, program: PathBuf, args: Vec<String>, log: PathBuf) -> Self {
        Supervised {
            name,
            program,
            args,
            log,
            child: None,
            starts: 0,
            unexpected_exits: Vec::new(),
        }
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn start(&mut self) -> Result<()> {
        ensure!(self.child.is_none(), "{} is already running", self.name);
        let log = log_file(&self.log)?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .env("RUST_LOG", "warn")
            // A final error's message, not a backtrace of it, belongs in
            // the log tail a failure report shows (panics keep theirs).
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Restarts the process if it exited on its own, recording the exit.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(child) = &mut self.child {
            if let Some(status) = child.try_wait()? {
                let what = format!(
                    "{} exited on its own ({status}):\n{}",
                    self.name,
                    tail(&self.log, 15)
                );
                tracing::warn!("{what}");
                self.unexpected_exits.push(what);
                self.child = None;
            }
        }
        if self.child.is_none() {
            self.start()?;
        }
        Ok(())
    }

    /// `kill -9` and reap.
    pub async fn kill9(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        Ok(())
    }

    /// Sends `sig` and waits up to `timeout` for the exit.
    pub async fn signal_and_wait(&mut self, sig: &str, timeout: Duration) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("{} is not running", self.name);
        };
        if let Some(pid) = child.id() {
            signal(pid, sig).await?;
        }
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                child.kill().await?;
                bail!(
                    "{} did not exit within {timeout:?} of SIG{sig}: killed",
                    self.name
                )
            }
        }
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let Some(child) = &mut self.child else {
            return Ok(None);
        };
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => {
                self.child = None;
                Ok(Some(status?))
            }
            Err(_) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::condense_frames;

    #[test]
    fn a_java_trace_keeps_its_exception_line_in_a_short_tail() {
        let mut text = String::from("starting\norg.apache.kafka.common.KafkaException: boom\n");
        for i in 0..20 {
            text.push_str(&format!("\tat frame.number{i}(X.java:{i})\n"));
        }
        text.push_str("Caused by: java.io.IOException: cause\n\tat a.b(C.java:1)\n");
        let lines = condense_frames(&text, 3);
        assert_eq!(
            lines,
            [
                "starting",
                "org.apache.kafka.common.KafkaException: boom",
                "\tat frame.number0(X.java:0)",
                "\tat frame.number1(X.java:1)",
                "\tat frame.number2(X.java:2)",
                "\t... 17 more frames",
                "Caused by: java.io.IOException: cause",
                "\tat a.b(C.java:1)",
            ]
        );
    }
}
