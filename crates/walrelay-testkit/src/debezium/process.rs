//! The Kafka Connect worker's JVM: started as Kafka's
//! `connect-standalone.sh` starts it, with a watchdog, its log appended to
//! one file, killed or stopped on demand, and its CPU time and peak
//! resident memory read from `/proc`.
//!
//! The watchdog (`sh`, its stdin a pipe only this process writes to) kills
//! the JVM when this process ends without dropping the worker (a test
//! binary that panics in a `static`, or is killed): the kernel closes the
//! pipe, `read` returns, the JVM dies.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::home::DebeziumHome;
use crate::broker::util::kill_child;

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

/// The worker's main class (standalone mode).
const MAIN_CLASS: &str = "org.apache.kafka.connect.cli.ConnectStandalone";

/// `sh -c WATCHDOG watchdog PID`: waits for EOF on stdin, then kills the
/// JVM.
const WATCHDOG: &str = r#"read -r _; kill -9 "$1" 2>/dev/null"#;

/// A running worker JVM.
#[derive(Debug)]
pub(crate) struct WorkerProcess {
    java: Child,
    watchdog: Child,
    /// Held open: the watchdog acts when it closes.
    _pipe: ChildStdin,
    started: Instant,
}

impl WorkerProcess {
    /// Starts `ConnectStandalone worker connector` with the install's class
    /// path and logging, appending its output to `log`.
    pub(crate) fn spawn(
        home: &DebeziumHome,
        dir: &Path,
        worker: &Path,
        connector: &Path,
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
            .arg(MAIN_CLASS)
            .arg(worker)
            .arg(connector)
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
        let mut java = cmd
            .spawn()
            .context("starting java for Kafka Connect (is Java 17 installed?)")?;
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "walrelay-connect-watchdog"])
            .arg(java.id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut watchdog = match watchdog {
            Ok(w) => w,
            Err(e) => {
                let _ = kill_child(&mut java);
                return Err(e).context("starting the worker's watchdog (sh)");
            }
        };
        let pipe = watchdog.stdin.take().context("the watchdog's stdin")?;
        Ok(WorkerProcess {
            java,
            watchdog,
            _pipe: pipe,
            started,
        })
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
        Ok(self.java.try_wait()?)
    }

    /// SIGKILL, and waits for the JVM to be gone.
    pub(crate) fn kill(mut self) -> anyhow::Result<()> {
        // The watchdog first: then the JVM's pid cannot be reused under it.
        let _ = kill_child(&mut self.watchdog);
        kill_child(&mut self.java)
    }

    /// SIGTERM (Connect stops its tasks and commits their offsets), waits
    /// up to `timeout`, then SIGKILL. Returns whether it exited by itself.
    pub(crate) fn terminate(mut self, timeout: Duration) -> anyhow::Result<bool> {
        let status = Command::new("kill")
            .args(["-TERM", &self.java.id().to_string()])
            .status()
            .context("running kill -TERM")?;
        let mut exited = false;
        if status.success() {
            let deadline = Instant::now() + timeout;
            loop {
                if self.java.try_wait()?.is_some() {
                    exited = true;
                    break;
                }
                if Instant::now() >= deadline {
                    break;
                }
                // The JVM's exit cannot be awaited without a second thread
                // or a pidfd; 20 ms steps keep the stop prompt.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill()?;
        Ok(exited)
    }
}
