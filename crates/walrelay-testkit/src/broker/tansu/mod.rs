//! Throwaway [Tansu](https://github.com/tansu-io/tansu) brokers (a small
//! Kafka-compatible broker) with in-memory storage on a free port of
//! 127.0.0.1, killed on drop.
//!
//! The `tansu` binary comes from `scripts/install-tansu.sh` (pinned version,
//! verified hash) or from `$WALRELAY_TANSU_BIN`.
//!
//! Known Tansu 0.6.0 limitations tests must live with:
//! * the high watermark it reports is wrong: count records by consuming them
//!   (see [`crate::kafka`]), never from watermarks or partition EOF;
//! * partitions cannot be added to an existing topic;
//! * transactions are accepted, but `read_committed` consumers still see
//!   aborted records;
//! * storage is in memory: a restart loses every topic and record;
//! * auto-created topics get 4 partitions.

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::util::{free_port, keep_broker, kill_child, workspace_root, KEEP_BROKER_ENV};
use crate::cluster::HOST;
use crate::kafka::client_config;

mod topics;

/// Environment variable naming the `tansu` binary to use; it wins over the
/// copy `scripts/install-tansu.sh` puts in `target/tools/bin/tansu`.
pub const TANSU_BIN_ENV: &str = "WALRELAY_TANSU_BIN";

/// How often a start is retried when another process took the chosen port.
const PORT_ATTEMPTS: usize = 8;
/// How long one start may take until the broker answers metadata requests.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`TansuBroker::stop`] waits for a graceful exit before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Environment variables Tansu reads that must not leak in from the
/// caller's environment (everything it needs is passed as arguments).
const SCRUBBED_ENV: &[&str] = &[
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

static BROKER_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A Tansu broker with in-memory storage, listening on `127.0.0.1:port`.
///
/// [`TansuBroker::start`] returns once the broker answers Kafka metadata
/// requests. Dropping it kills the broker and removes its directory
/// (`WALRELAY_KEEP_BROKER=1` keeps the log).
///
/// ```no_run
/// # fn demo() -> anyhow::Result<()> {
/// use walrelay_testkit::TansuBroker;
/// let broker = TansuBroker::start()?;
/// broker.create_topic("events", 3)?;
/// let bootstrap = broker.bootstrap_servers(); // "127.0.0.1:PORT"
/// # let _ = bootstrap; Ok(()) }
/// ```
pub struct TansuBroker {
    bin: PathBuf,
    dir: PathBuf,
    log: PathBuf,
    port: u16,
    cluster_id: String,
    child: Option<Child>,
    starts: u32,
    /// The address clients are told to connect to, when it is not the
    /// listener's own (e.g. a fault-injecting proxy in front of it).
    advertised: Option<String>,
}

impl fmt::Debug for TansuBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TansuBroker")
            .field("bin", &self.bin)
            .field("port", &self.port)
            .field("log", &self.log)
            .field("pid", &self.child.as_ref().map(Child::id))
            .finish_non_exhaustive()
    }
}

enum StartOutcome {
    Ready,
    /// The port was (or became) someone else's: try another one.
    PortTaken(anyhow::Error),
}

impl TansuBroker {
    /// Finds the binary ([`TansuBroker::find_binary`]), starts a broker on a
    /// free port and waits (at most ~10 s) until it answers metadata
    /// requests. Blocking. Errors carry the tail of the broker log.
    pub fn start() -> anyhow::Result<TansuBroker> {
        let bin = Self::find_binary()?;
        Self::start_with_binary(bin)
    }

    /// Like [`TansuBroker::start`], with an explicit `tansu` binary.
    pub fn start_with_binary(bin: impl Into<PathBuf>) -> anyhow::Result<TansuBroker> {
        Self::start_inner(bin.into(), None, &mut |_| {})
    }

    /// Like [`TansuBroker::start`], but the broker tells clients (in its
    /// metadata) to connect to `advertised` (`HOST:PORT`) instead of its
    /// own listener: after bootstrapping, every client talks to that
    /// address. Used to put a fault-injecting TCP proxy in front of the
    /// broker that forwards `advertised` to [`TansuBroker::port`].
    ///
    /// `on_port` gets the broker's own port before the broker is checked
    /// for readiness (and again if a taken port makes it retry another):
    /// the readiness check's metadata request may already go through the
    /// advertised address, so the proxy must forward by then.
    pub fn start_advertising(
        advertised: &str,
        mut on_port: impl FnMut(u16),
    ) -> anyhow::Result<TansuBroker> {
        Self::start_inner(
            Self::find_binary()?,
            Some(advertised.to_owned()),
            &mut on_port,
        )
    }

    fn start_inner(
        bin: PathBuf,
        advertised: Option<String>,
        on_port: &mut dyn FnMut(u16),
    ) -> anyhow::Result<TansuBroker> {
        let dir = tempfile::Builder::new()
            .prefix("walrelay-tansu-")
            .tempdir()
            .context("creating the broker directory")?
            .keep();
        let n = BROKER_COUNTER.fetch_add(1, Ordering::Relaxed);
        // From here on, `Drop` of `broker` cleans up after failures.
        let mut broker = TansuBroker {
            bin,
            log: dir.join("tansu.log"),
            dir,
            port: 0,
            cluster_id: format!("walrelay-testkit-{}-{n}", std::process::id()),
            child: None,
            starts: 0,
            advertised,
        };
        let mut last_error = None;
        for _ in 0..PORT_ATTEMPTS {
            broker.port = free_port()?;
            on_port(broker.port);
            match broker.spawn_and_wait()? {
                StartOutcome::Ready => return Ok(broker),
                StartOutcome::PortTaken(e) => {
                    tracing::debug!("tansu: port {} was taken, retrying: {e:#}", broker.port);
                    last_error = Some(e);
                }
            }
        }
        let e = last_error.unwrap_or_else(|| anyhow!("no attempt made"));
        Err(e.context(format!(
            "starting tansu failed {PORT_ATTEMPTS} times because the port was taken"
        )))
    }

    /// The `tansu` binary: `$WALRELAY_TANSU_BIN` if set, else
    /// `<workspace root>/target/tools/bin/tansu` as installed by
    /// `scripts/install-tansu.sh`.
    pub fn find_binary() -> anyhow::Result<PathBuf> {
        if let Some(value) = std::env::var_os(TANSU_BIN_ENV).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(&value);
            return resolve_env_binary(&path).ok_or_else(|| {
                anyhow!(
                    "{TANSU_BIN_ENV} is set to {}, which is not a file (relative paths are \
                     tried against the current and the workspace root directory, bare \
                     names against PATH)",
                    path.display()
                )
            });
        }
        let path = Self::installed_binary_path();
        if path.is_file() {
            return Ok(path);
        }
        bail!(
            "the Tansu broker binary is not installed at {}: run scripts/install-tansu.sh \
             (or set {TANSU_BIN_ENV} to a tansu binary)",
            path.display()
        )
    }

    /// Where `scripts/install-tansu.sh` installs the binary:
    /// `<workspace root>/target/tools/bin/tansu`.
    pub fn installed_binary_path() -> PathBuf {
        workspace_root().join("target/tools/bin/tansu")
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        format!("{HOST}:{}", self.port)
    }

    /// The TCP port the broker listens on (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's log file (output of every start, appended).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The process id of the running broker, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the broker process is (still) running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Stops the broker gracefully (SIGTERM, then SIGKILL after 10 s) and
    /// waits for it to exit. Tansu takes about 2 s to exit on SIGTERM; use
    /// [`TansuBroker::kill`] when that does not matter. No-op when stopped.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            tracing::debug!("tansu: kill -TERM failed ({status:?}); using SIGKILL");
            return kill_child(&mut child);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!("tansu did not exit within {STOP_TIMEOUT:?} of SIGTERM; killing it");
        kill_child(&mut child)
    }

    /// Kills the broker (SIGKILL) and waits for it. No-op when stopped.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        match self.child.take() {
            Some(mut child) => kill_child(&mut child),
            None => Ok(()),
        }
    }

    /// Kills the broker (if it runs) and starts it again on the same port,
    /// waiting until it answers metadata requests.
    ///
    /// The storage is in memory: **every topic and record is lost**, and
    /// clients see a broker with no topics. Fails if another process took
    /// the port in the meantime.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill()?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.spawn_and_wait()? {
                StartOutcome::Ready => return Ok(()),
                StartOutcome::PortTaken(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!(
                        "restarting tansu on port {}: the port stayed taken",
                        self.port
                    )))
                }
                StartOutcome::PortTaken(e) => {
                    tracing::debug!("tansu: port {} still taken: {e:#}", self.port);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// The last `n` lines of the broker log (empty if there is none yet).
    pub fn log_tail(&self, n: usize) -> String {
        let bytes = std::fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Spawns tansu on `self.port` and waits until it is ready.
    fn spawn_and_wait(&mut self) -> anyhow::Result<StartOutcome> {
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        writeln!(
            log,
            "=== walrelay-testkit: start #{} of tansu on {HOST}:{} ===",
            self.starts, self.port
        )?;
        let url = format!("tcp://{HOST}:{}", self.port);
        let advertised = match &self.advertised {
            Some(a) => format!("tcp://{a}"),
            None => url.clone(),
        };
        let mut cmd = Command::new(&self.bin);
        cmd.arg("broker")
            .args(["--cluster-id", &self.cluster_id])
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", "memory://tansu/"])
            .env("RUST_LOG", "warn")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        tracing::debug!("starting {cmd:?}");
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        match self.wait_ready() {
            Ok(StartOutcome::Ready) => Ok(StartOutcome::Ready),
            Ok(StartOutcome::PortTaken(e)) => {
                let _ = self.kill();
                Ok(StartOutcome::PortTaken(e))
            }
            Err(e) => {
                let _ = self.kill();
                Err(e.context(format!(
                    "tansu on port {} did not become ready; log {}:\n{}",
                    self.port,
                    self.log.display(),
                    self.log_tail(30)
                )))
            }
        }
    }

    fn child_exit(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(child) => Ok(child.try_wait()?),
            None => bail!("tansu is not running"),
        }
    }

    fn wait_ready(&mut self) -> anyhow::Result<StartOutcome> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let exited = |status: ExitStatus, log_tail: String| {
            // Tansu exits at once when it cannot bind its listener; any exit
            // during startup is treated as a lost race for the port.
            StartOutcome::PortTaken(anyhow!(
                "tansu exited during startup ({status}):\n{log_tail}"
            ))
        };

        // 1. The port accepts TCP connections.
        loop {
            if let Some(status) = self.child_exit()? {
                return Ok(exited(status, self.log_tail(10)));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "port {} accepted no connection within {READY_TIMEOUT:?}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }

        // 2. A metadata request succeeds, and it is our broker answering
        //    (each broker has its own cluster id).
        let client: BaseConsumer = client_config(&self.bootstrap_servers())
            .create()
            .context("creating a Kafka client")?;
        let mut last_error = anyhow!("no metadata request made");
        loop {
            if let Some(status) = self.child_exit()? {
                return Ok(exited(status, self.log_tail(10)));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = remaining.clamp(Duration::from_millis(100), Duration::from_secs(1));
            match client.fetch_metadata(None, timeout) {
                Ok(md) if !md.brokers().is_empty() => {
                    match client.client().fetch_cluster_id(timeout) {
                        Some(id) if id == self.cluster_id => return Ok(StartOutcome::Ready),
                        Some(id) => {
                            return Ok(StartOutcome::PortTaken(anyhow!(
                                "another broker (cluster id {id:?}) answers on port {}",
                                self.port
                            )))
                        }
                        // Without a cluster id, trust that our child is alive.
                        None => {
                            if self.child_exit()?.is_none() {
                                return Ok(StartOutcome::Ready);
                            }
                        }
                    }
                }
                Ok(_) => last_error = anyhow!("metadata lists no brokers"),
                Err(e) => last_error = anyhow!(e).context("fetching metadata"),
            }
            if Instant::now() >= deadline {
                return Err(last_error.context(format!(
                    "tansu answered no metadata request within {READY_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            tracing::warn!("killing tansu on drop: {e:#}");
        }
        if keep_broker() {
            eprintln!(
                "walrelay-testkit: keeping the Tansu broker directory {} (port {}; \
                 {KEEP_BROKER_ENV} is set)",
                self.dir.display(),
                self.port
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

/// `$WALRELAY_TANSU_BIN` as a file: absolute as is; relative against the
/// current directory (tests run in their crate's directory), then against
/// the workspace root; a bare name against `PATH`.
fn resolve_env_binary(path: &Path) -> Option<PathBuf> {
    if path.is_absolute() {
        return path.is_file().then(|| path.to_path_buf());
    }
    if path.components().count() == 1 {
        if let Some(found) = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(path))
            .find(|p| p.is_file())
        {
            return Some(found);
        }
    }
    [std::env::current_dir().ok(), Some(workspace_root())]
        .into_iter()
        .flatten()
        .map(|dir| dir.join(path))
        .find(|p| p.is_file())
}
