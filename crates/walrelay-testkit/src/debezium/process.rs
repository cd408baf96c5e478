//! The Kafka Connect worker's JVM: started as Kafka's
//! `connect-standalone.sh` (or `connect-distributed.sh`) starts it, with
//! a watchdog, its log appended to one file, killed or stopped on demand,
//! and its CPU time and peak resident memory read from `/proc`.
//!
//! Its watchdog ([`crate::watched`]) kills the JVM when this process ends
//! without dropping the worker.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::home::DebeziumHome;
use crate::watched::WatchedChild;

/// The JVM options of Kafka's scripts: `connect-standalone.sh`'s heap
/// (`KAFKA_HEAP_OPTS`) and `kafka-run-class.sh`'s
/// `KAFKA_JVM_PERFORMANCE_OPTS`: a worker as users start it.
const JVM_OPTIONS: &[&str] = &[
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
];

/// The worker's main class in standalone mode (the worker's and the
/// connector's properties on the command line).
const STANDALONE: &str = "org.apache.kafka.connect.cli.ConnectStandalone";
/// The worker's main class in distributed mode (the worker's properties
/// only; connectors are created over REST).
const DISTRIBUTED: &str = "org.apache.kafka.connect.cli.ConnectDistributed";

/// `sh -c WATCHDOG watchdog PID`: waits for EOF on stdin, then kills the
/// JVM.
const WATCHDOG: &str = r#"read -r _; kill -9 "$1" 2>/dev/null"#;

/// A running worker JVM.
#[derive(Debug)]
pub(crate) struct WorkerProcess {
    java: WatchedChild,
    started: Instant,
}

impl WorkerProcess {
    /// Starts `ConnectStandalone worker connector` (or, without a
    /// connector file, `ConnectDistributed worker`) with the install's
    /// class path and logging, appending its output to `log`.
    pub(crate) fn spawn(
        home: &DebeziumHome,
        dir: &Path,
        worker: &Path,
        connector: Option<&Path>,
        log: &Path,
    ) -> anyhow::Result<WorkerProcess> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let java = match std::env::var_os("JAVA_HOME").filter(|v| !v.is_empty()) {
            Some(java_home) => PathBuf::from(java_home).join("bin/java"),
            None => PathBuf::from("java"),
        };
        let mut cmd = Command::new(java);
        cmd.args(JVM_OPTIONS)
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                home.log_config().display()
            ))
            .arg("-cp")
            .arg(home.classpath())
            .arg(if connector.is_some() {
                STANDALONE
            } else {
                DISTRIBUTED
            })
            .arg(worker)
            .args(connector)
            .current_dir(dir)
            // Kafka's scripts read these; a user's leftovers must not
            // change the JVM measured here.
            .env_remove("KAFKA_OPTS")
            .env_remove("KAFKA_HEAP_OPTS")
            .env_remove("JAVA_TOOL_OPTIONS")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out));
        tracing::debug!("starting the Kafka Connect worker: {cmd:?}");
        let started = Instant::now();
        let java = WatchedChild::spawn(
            &mut cmd,
            "java for Kafka Connect",
            WATCHDOG,
            "walrelay-connect-watchdog",
            std::iter::empty::<&str>(),
        )?;
        Ok(WorkerProcess { java, started })
    }

    /// The JVM's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.java.id()
    }

    /// When the JVM was spawned.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// The JVM's exit status, if it exited.
    pub(crate) fn exit_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.java.try_wait()
    }

    /// SIGKILL, and waits for the JVM to be gone.
    pub(crate) fn kill(self) -> anyhow::Result<()> {
        self.java.kill()
    }

    /// SIGTERM (Connect stops its tasks and commits their offsets), waits
    /// up to `timeout`, then SIGKILL. Returns whether it exited by itself.
    pub(crate) fn terminate(self, timeout: Duration) -> anyhow::Result<bool> {
        self.java.terminate(timeout)
    }
}
