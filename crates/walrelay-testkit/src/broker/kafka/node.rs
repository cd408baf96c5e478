//! One Apache Kafka node (broker and controller in one JVM): formatting
//! its storage, the process with a watchdog, and killing it.
//!
//! Its watchdog ([`crate::watched`]) kills the JVM and removes the node's
//! directory when this process ends without dropping the node, e.g. a test
//! binary exiting with a broker still shared in a `static`.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use anyhow::{bail, Context};

use super::config::{server_properties, NodePorts};
use super::home::KafkaHome;
use super::security::KafkaSecurity;
use crate::broker::util::{keep_broker, last_lines};
use crate::watched::WatchedChild;

/// The JVM heap of a test node.
const HEAP: &str = "512m";

/// How a node's JVM runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Jvm {
    /// For tests: a 512 MB heap and the serial collector, a small
    /// footprint on a 2-core machine running many nodes. Its
    /// stop-the-world collections pause the broker for tens to hundreds of
    /// milliseconds under load, so latencies measured on it are not a
    /// user's.
    #[default]
    Test,
    /// As Kafka's own start scripts run a broker (`kafka-server-start.sh`,
    /// `kafka-run-class.sh`): a 1 GB heap and G1 with a 20 ms pause
    /// target. What users run; for the bench.
    Stock,
    /// [`Jvm::Stock`] with the Z collector instead of G1: collections run
    /// beside the application threads, with pauses under a millisecond.
    /// For the bench's A/B of what G1's pauses add to a latency.
    StockZgc,
}

impl Jvm {
    fn options(self) -> Vec<String> {
        match self {
            Jvm::Test => vec![
                format!("-Xmx{HEAP}"),
                "-Xms64m".into(),
                "-XX:+UseSerialGC".into(),
            ],
            Jvm::Stock => [
                "-Xmx1G",
                "-Xms1G",
                "-server",
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-XX:InitiatingHeapOccupancyPercent=35",
                "-XX:+ExplicitGCInvokesConcurrent",
            ]
            .map(String::from)
            .to_vec(),
            Jvm::StockZgc => ["-Xmx1G", "-Xms1G", "-server", "-XX:+UseZGC"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// `sh -c WATCHDOG watchdog PID NODE_DIR keep|remove`: waits for EOF on
/// stdin, then kills the JVM and removes the node's directory (and the
/// cluster's, once empty).
const WATCHDOG: &str = r#"read -r _; kill -9 "$1" 2>/dev/null
[ "$3" = keep ] || { rm -rf "$2"; rmdir "$(dirname "$2")" 2>/dev/null; }"#;

/// One node of a [`super::KafkaCluster`].
#[derive(Debug)]
pub struct KafkaNode {
    id: usize,
    ports: NodePorts,
    dir: PathBuf,
    process: Option<WatchedChild>,
    jvm: Jvm,
    /// JVM options `security` needs (the OAuth URL allow list).
    security_jvm: Vec<String>,
}

impl KafkaNode {
    /// Writes `server.properties` for node `id` of `all` into `dir`
    /// (advertising `advertised` instead of its own listener, if given;
    /// secured by `security`, if given).
    pub(crate) fn new(
        id: usize,
        all: &[NodePorts],
        dir: PathBuf,
        advertised: Option<&str>,
        security: Option<&KafkaSecurity>,
        jvm: Jvm,
    ) -> anyhow::Result<KafkaNode> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let data = dir.join("data");
        // Holds the node's TLS key: readable by its owner only.
        crate::tls::write_private_file(
            &dir.join("server.properties"),
            server_properties(id, all, &data, advertised, security).as_bytes(),
        )?;
        Ok(KafkaNode {
            id,
            ports: all[id - 1],
            dir,
            process: None,
            jvm,
            security_jvm: security.map(KafkaSecurity::jvm_options).unwrap_or_default(),
        })
    }

    /// The node id (1-based).
    pub fn id(&self) -> usize {
        self.id
    }

    /// The broker listener's port (clients connect here).
    pub fn port(&self) -> u16 {
        self.ports.broker
    }

    /// The SASL_SSL listener's port, on a secured node.
    pub fn secure_port(&self) -> Option<u16> {
        self.ports.secure
    }

    /// The CONTROLLER listener's port.
    pub fn controller_port(&self) -> u16 {
        self.ports.controller
    }

    /// The node's log (every start appends to it).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("broker.log")
    }

    /// The node's directory (`server.properties`, `data/`, `broker.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The JVM's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.id())
    }

    /// The last `n` lines of the node's log.
    pub fn log_tail(&self, n: usize) -> String {
        let bytes = std::fs::read(self.log_path()).unwrap_or_default();
        last_lines(&String::from_utf8_lossy(&bytes), n)
    }

    /// `kafka.tools.StorageTool format` of the node's data directory for
    /// `cluster_id` (with the static voters of its configuration), creating
    /// the SCRAM users of `security` and setting `features`.
    pub(crate) fn format(
        &self,
        home: &KafkaHome,
        cluster_id: &str,
        security: Option<&KafkaSecurity>,
        features: &[(String, u16)],
    ) -> anyhow::Result<()> {
        let mut cmd = home.java("256m")?;
        cmd.arg("kafka.tools.StorageTool")
            .args(["format", "--ignore-formatted", "-t", cluster_id, "-c"])
            .arg(self.dir.join("server.properties"))
            .args(security.map(KafkaSecurity::format_args).unwrap_or_default());
        for (name, level) in features {
            cmd.arg("--feature").arg(format!("{name}={level}"));
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .context("running kafka.tools.StorageTool (is Java 17 installed?)")?;
        if !out.status.success() {
            bail!(
                "formatting node {} failed ({}): {}{}",
                self.id,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Starts the node's JVM (and its watchdog); does not wait for it.
    pub(crate) fn spawn(&mut self, home: &KafkaHome) -> anyhow::Result<()> {
        if self.process.is_some() {
            bail!("node {} is already running", self.id);
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .with_context(|| format!("opening {}", self.log_path().display()))?;
        let mut jvm = self.jvm.options();
        jvm.extend(self.security_jvm.iter().cloned());
        let jvm: Vec<&str> = jvm.iter().map(String::as_str).collect();
        let mut cmd = home.java_with(&jvm)?;
        cmd.arg("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .current_dir(&self.dir)
            .env_remove("KAFKA_OPTS")
            .env_remove("KAFKA_HEAP_OPTS")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        tracing::debug!("starting Kafka node {}: {cmd:?}", self.id);
        let keep = if keep_broker() { "keep" } else { "remove" };
        self.process = Some(WatchedChild::spawn(
            &mut cmd,
            &format!("java for Kafka node {}", self.id),
            WATCHDOG,
            "walrelay-kafka-watchdog",
            [self.dir.as_os_str(), keep.as_ref()],
        )?);
        Ok(())
    }

    /// The JVM's exit status, if it exited; an error when not started.
    pub(crate) fn exit_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match &mut self.process {
            Some(p) => p.try_wait(),
            None => bail!("node {} is not running", self.id),
        }
    }

    /// Stops the JVM as an operator does (SIGTERM: a controlled shutdown
    /// that hands its partitions' leadership to other brokers first) and
    /// waits for it; SIGKILL after `timeout`. The data stays.
    pub fn terminate(&mut self, timeout: std::time::Duration) -> anyhow::Result<()> {
        match self.process.take() {
            Some(p) => p.terminate(timeout).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Kills the JVM (SIGKILL) and waits for it; the data stays, so
    /// [`KafkaNode::spawn`] starts it again. No-op when not running.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        match self.process.take() {
            Some(p) => p.kill(),
            None => Ok(()),
        }
    }
}

impl Drop for KafkaNode {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            tracing::warn!("killing Kafka node {}: {e:#}", self.id);
        }
    }
}
