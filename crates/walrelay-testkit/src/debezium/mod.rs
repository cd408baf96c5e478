//! Debezium's PostgreSQL connector on a Kafka Connect worker, run as its
//! users run it, beside walrelay: same database, same broker,
//! same workloads.
//!
//! [`DebeziumWorker::start`] writes the worker's and the connector's
//! properties from the templates in `bench/debezium/` (the [`Variant`]
//! picks them: Debezium's defaults or tuned), starts the JVM from the
//! install `scripts/install-debezium.sh` makes ([`DebeziumHome`]) with a
//! REST port and an offsets file of its own, and returns once the
//! connector streams: its task is `RUNNING` (polled on
//! `/connectors/<name>/status`) and its replication slot is active. The
//! worker can be killed (`kill -9`), stopped (SIGTERM) and restarted with
//! the same offsets; its CPU seconds and peak resident memory come from
//! `/proc`. Its log goes to one file (every start appends to it), whose
//! tail every error shows.
//!
//! [`ConnectDelivery`] picks the worker: standalone (at least once: the
//! connector's file on the command line, offsets in a local file), or
//! distributed with Kafka Connect's exactly-once source support (KIP-618:
//! its state in three topics of its own, the connector created with
//! `PUT /connectors/<name>/config` from the same filled file once the
//! worker has joined its group, and found in its config topic on a
//! restart).
//!
//! Dropping the worker kills the JVM and removes its directory
//! (`WALRELAY_KEEP_BROKER=1` keeps it); the slot stays in the database,
//! which the test drops with its cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::broker::util::{free_port, keep_broker, last_lines};
use crate::cluster::{PgCluster, HOST, SUPERUSER};

mod config;
mod home;
mod process;
mod rest;

pub use crate::procstat::{cpu_seconds, peak_rss_bytes};
pub use config::{ConnectDelivery, Variant};

/// The old name of [`ConnectDelivery`].
pub type Delivery = ConnectDelivery;
pub use home::{DebeziumHome, DEBEZIUM_HOME_ENV, DEBEZIUM_VERSION};
pub use rest::{ConnectorStatus, TaskStatus};

use process::WorkerProcess;

/// Every `${NAME}` the runner fills in the templates (a unit test checks
/// that the templates use no other).
pub(crate) const PLACEHOLDERS: &[&str] = &[
    "BOOTSTRAP",
    "OFFSETS_FILE",
    "PLUGIN_PATH",
    "REST_PORT",
    "CONNECTOR_NAME",
    "PG_HOST",
    "PG_PORT",
    "PG_USER",
    "PG_PASSWORD",
    "PG_DBNAME",
    "TOPIC_PREFIX",
    "SLOT",
    "PUBLICATION",
    "OUTBOX_TABLE",
    "MESSAGE_PREFIXES",
];

/// How often the readiness wait asks the REST API and the database.
const POLL: Duration = Duration::from_millis(100);
/// Lines of the worker's log an error shows.
const LOG_LINES: usize = 40;
/// How long a SIGTERM may take before the JVM is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What to run: the variant, and the names the connector uses.
#[derive(Clone, Debug)]
pub struct DebeziumOptions {
    /// Debezium's defaults, or tuned ([`Variant::Tuned`] by default).
    pub variant: Variant,
    /// A standalone worker (at least once, the default), or a distributed
    /// one with Kafka Connect's exactly-once source support (KIP-618).
    pub delivery: ConnectDelivery,
    /// The connector's name in Kafka Connect.
    pub name: String,
    /// `topic.prefix`: logical messages go to `<prefix>.message`.
    pub topic_prefix: String,
    /// The connector's own replication slot.
    pub slot: String,
    /// The connector's own publication (Debezium creates it for the outbox
    /// table).
    pub publication: String,
    /// `schema.table` of the outbox table.
    pub outbox_table: String,
    /// The logical-message prefixes captured (regular expressions).
    pub message_prefixes: Vec<String>,
    /// The database the connector reads.
    pub dbname: String,
    /// How long a start may take until the connector streams (a JVM start
    /// and a plugin scan: tens of seconds on a busy 2-core machine).
    pub start_timeout: Duration,
    /// Connector properties of the caller's own, appended after the
    /// variant's files (a later line wins): `(name, text)`, the name
    /// written above them in the filled file. For what the table the
    /// connector reads needs (the bench's outbox payload is text, not
    /// JSON: `bench/debezium/connector-bench.properties`).
    pub connector_overlay: Option<(String, String)>,
}

impl Default for DebeziumOptions {
    fn default() -> Self {
        DebeziumOptions {
            variant: Variant::Tuned,
            delivery: ConnectDelivery::AtLeastOnce,
            name: "walrelay-debezium".into(),
            topic_prefix: "dbz".into(),
            slot: "debezium".into(),
            publication: "debezium".into(),
            outbox_table: "public.outbox".into(),
            message_prefixes: vec!["demo".into()],
            dbname: "postgres".into(),
            start_timeout: Duration::from_secs(180),
            connector_overlay: None,
        }
    }
}

/// How long a start took, from spawning the JVM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartTimings {
    /// Until the REST API reported the connector and its task `RUNNING`.
    pub running: Duration,
    /// Until the task's walsender was attached to the slot: from here on
    /// every commit is streamed to the connector.
    pub streaming: Duration,
}

/// A Kafka Connect standalone worker running Debezium's PostgreSQL
/// connector against one cluster and one broker.
#[derive(Debug)]
pub struct DebeziumWorker {
    home: DebeziumHome,
    opts: DebeziumOptions,
    pg: tokio_postgres::Config,
    dir: PathBuf,
    /// Removes `dir` on drop, unless it is kept.
    _tmp: Option<tempfile::TempDir>,
    rest_port: u16,
    process: Option<WorkerProcess>,
    /// A distributed worker's connector configuration (the connector's
    /// file as Java reads it), for `PUT /connectors/<name>/config`; `None`
    /// for a standalone worker, which reads the file itself.
    rest_config: Option<BTreeMap<String, String>>,
    /// Whether the distributed worker's connector was created: it lives in
    /// the worker's config topic from then on, and a restart finds it
    /// there.
    created: bool,
    /// The walsender of the last start, so a restart waits for a new one
    /// (the killed worker's may still hold the slot for a moment).
    walsender: Option<i32>,
    timings: Option<StartTimings>,
}

impl DebeziumWorker {
    /// Writes the worker's files for `pg` and the broker at `bootstrap`,
    /// starts the JVM and waits until the connector streams.
    pub async fn start(
        pg: &PgCluster,
        bootstrap: &str,
        opts: DebeziumOptions,
    ) -> anyhow::Result<DebeziumWorker> {
        let home = DebeziumHome::find()?;
        let tmp = tempfile::Builder::new()
            .prefix("walrelay-debezium-")
            .tempdir()
            .context("creating the worker's directory")?;
        let dir = tmp.path().to_path_buf();
        let tmp = if keep_broker() {
            eprintln!("keeping the Debezium worker's directory {}", dir.display());
            let _ = tmp.keep();
            None
        } else {
            Some(tmp)
        };
        let rest_port = free_port()?;
        let password = pg.superuser_password().unwrap_or_default().to_owned();
        let values: BTreeMap<&str, String> = BTreeMap::from([
            ("BOOTSTRAP", bootstrap.to_owned()),
            ("OFFSETS_FILE", path_str(&dir.join("offsets.dat"))?),
            ("PLUGIN_PATH", path_str(&home.plugin_path())?),
            ("REST_PORT", rest_port.to_string()),
            ("CONNECTOR_NAME", opts.name.clone()),
            ("PG_HOST", HOST.to_owned()),
            ("PG_PORT", pg.port().to_string()),
            ("PG_USER", SUPERUSER.to_owned()),
            ("PG_PASSWORD", password.clone()),
            ("PG_DBNAME", opts.dbname.clone()),
            ("TOPIC_PREFIX", opts.topic_prefix.clone()),
            ("SLOT", opts.slot.clone()),
            ("PUBLICATION", opts.publication.clone()),
            ("OUTBOX_TABLE", opts.outbox_table.clone()),
            ("MESSAGE_PREFIXES", opts.message_prefixes.join(",")),
        ]);
        debug_assert!(
            values.len() == PLACEHOLDERS.len()
                && PLACEHOLDERS.iter().all(|p| values.contains_key(p)),
            "PLACEHOLDERS (which the templates' test checks) and the values filled differ"
        );
        let worker = config::render(&opts.delivery.worker_template(opts.variant), &values)
            .context("filling bench/debezium's worker template")?;
        let mut connector_template = opts.delivery.connector_template(opts.variant);
        if let Some((name, text)) = &opts.connector_overlay {
            connector_template.push_str(&format!("\n# ---- appended: {name} ----\n{text}"));
        }
        let connector = config::render(&connector_template, &values)
            .context("filling bench/debezium's connector template")?;
        // The connector's file holds the database password.
        crate::tls::write_private_file(&dir.join("worker.properties"), worker.as_bytes())?;
        crate::tls::write_private_file(&dir.join("connector.properties"), connector.as_bytes())?;
        let rest_config = match opts.delivery {
            ConnectDelivery::AtLeastOnce => None,
            ConnectDelivery::ExactlyOnce => Some(
                config::parse_properties(&connector)
                    .context("reading the filled connector properties")?,
            ),
        };

        let pg = pg.client_config(
            SUPERUSER,
            (!password.is_empty()).then_some(password.as_str()),
            &opts.dbname,
        );
        let mut worker = DebeziumWorker {
            home,
            opts,
            pg,
            dir,
            _tmp: tmp,
            rest_port,
            process: None,
            rest_config,
            created: false,
            walsender: None,
            timings: None,
        };
        worker.restart().await?;
        Ok(worker)
    }

    /// Starts the JVM again (after [`kill`](Self::kill) or
    /// [`stop`](Self::stop)) with the same files and offsets, and waits
    /// until the connector streams again. Errors if it still runs.
    pub async fn restart(&mut self) -> anyhow::Result<StartTimings> {
        if self.process.is_some() {
            bail!("the Debezium worker is still running (kill or stop it first)");
        }
        let connector = self.dir.join("connector.properties");
        let process = WorkerProcess::spawn(
            &self.home,
            &self.dir,
            &self.dir.join("worker.properties"),
            self.rest_config.is_none().then_some(connector.as_path()),
            &self.log_path(),
        )?;
        self.process = Some(process);
        let timings = self.await_streaming().await?;
        self.timings = Some(timings);
        Ok(timings)
    }

    /// Polls the REST API until the connector and its task run, then the
    /// database until a new walsender holds the slot; fails at once when
    /// the JVM exits or the task fails, and after the start timeout.
    async fn await_streaming(&mut self) -> anyhow::Result<StartTimings> {
        let started = self.process.as_ref().context("not started")?.started();
        let deadline = started + self.opts.start_timeout;
        let mut running: Option<Duration> = None;
        let mut last = String::from("no answer from the REST API yet");
        loop {
            if let Some(status) = self
                .process
                .as_mut()
                .context("not started")?
                .exit_status()?
            {
                // Reaps the watchdog too.
                if let Some(p) = self.process.take() {
                    let _ = p.kill();
                }
                bail!(
                    "the Kafka Connect worker exited ({status}) before its connector streamed\n{}",
                    self.log_excerpt()
                );
            }
            if let (Some(config), false) = (&self.rest_config, self.created) {
                match rest::put_connector_config(self.rest_port, &self.opts.name, config).await {
                    Ok(Ok(())) => self.created = true,
                    Ok(Err(why)) => last = why,
                    Err(e) => bail!(
                        "Kafka Connect refused Debezium's connector {:?}: {e:#}\n{}",
                        self.opts.name,
                        self.log_excerpt()
                    ),
                }
            }
            if running.is_none() && (self.rest_config.is_none() || self.created) {
                match rest::connector_status(self.rest_port, &self.opts.name).await {
                    Ok(Some(status)) if status.running() => running = Some(started.elapsed()),
                    Ok(Some(status)) => {
                        if let Some(failure) = status.failure() {
                            bail!(
                                "Debezium's connector {:?} failed to start: {failure}\n{}",
                                self.opts.name,
                                self.log_excerpt()
                            );
                        }
                        last = format!("status {status:?}");
                    }
                    Ok(None) => last = "the connector is not created yet (404)".into(),
                    Err(e) => last = format!("{e:#}"),
                }
            }
            if running.is_some() {
                match self.slot_walsender().await {
                    Ok(Some(pid)) if Some(pid) != self.walsender => {
                        self.walsender = Some(pid);
                        return Ok(StartTimings {
                            running: running.unwrap_or_default(),
                            streaming: started.elapsed(),
                        });
                    }
                    Ok(_) => {
                        last = format!("slot {:?} not held by a new walsender yet", self.opts.slot)
                    }
                    Err(e) => last = format!("{e:#}"),
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "Debezium's connector {:?} did not stream within {:?} ({last})\n{}",
                    self.opts.name,
                    self.opts.start_timeout,
                    self.log_excerpt()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The pid of the walsender holding the connector's slot, if any.
    async fn slot_walsender(&self) -> anyhow::Result<Option<i32>> {
        let (client, connection) = self
            .pg
            .connect(tokio_postgres::NoTls)
            .await
            .context("connecting to the database to look at the slot")?;
        let conn = tokio::spawn(connection);
        let row = client
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.opts.slot],
            )
            .await;
        drop(client);
        let _ = conn.await;
        Ok(row?.and_then(|r| r.get::<_, Option<i32>>(0)))
    }

    /// `kill -9` of the worker's JVM (nothing is flushed or committed);
    /// waits until it is gone. A no-op when it does not run.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        match self.process.take() {
            Some(p) => p.kill(),
            None => Ok(()),
        }
    }

    /// Stops the worker as an operator does (SIGTERM: Connect stops the
    /// task and commits its offsets), killing it after 30 s. Returns
    /// whether it exited by itself. A no-op (true) when it does not run.
    pub fn stop(&mut self) -> anyhow::Result<bool> {
        match self.process.take() {
            Some(p) => p.terminate(STOP_TIMEOUT),
            None => Ok(true),
        }
    }

    /// The connector's status from the REST API (`None`: not created yet).
    pub async fn status(&self) -> anyhow::Result<Option<ConnectorStatus>> {
        rest::connector_status(self.rest_port, &self.opts.name).await
    }

    /// The JVM's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(WorkerProcess::pid)
    }

    /// When the running JVM was spawned (the start the timings count
    /// from).
    pub fn started_at(&self) -> Option<Instant> {
        self.process.as_ref().map(WorkerProcess::started)
    }

    /// The JVM's exit status if it exited by itself (a crash, an
    /// `OutOfMemoryError`), `None` while it runs or when it does not run.
    pub fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        match self.process.as_mut() {
            Some(p) => p.exit_status(),
            None => Ok(None),
        }
    }

    /// User + system CPU seconds the running JVM has used since it started
    /// (every thread: the connector, the converters, the producer).
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        cpu_seconds(self.pid().context("the Debezium worker is not running")?)
    }

    /// The running JVM's peak resident memory (`VmHWM`), in bytes.
    pub fn peak_rss_bytes(&self) -> anyhow::Result<u64> {
        peak_rss_bytes(self.pid().context("the Debezium worker is not running")?)
    }

    /// How long the last (re)start took.
    pub fn timings(&self) -> Option<StartTimings> {
        self.timings
    }

    /// What this worker runs.
    pub fn options(&self) -> &DebeziumOptions {
        &self.opts
    }

    /// The topic Debezium writes logical messages to: `<topic.prefix>.message`.
    pub fn message_topic(&self) -> String {
        format!("{}.message", self.opts.topic_prefix)
    }

    /// The worker's REST port (on 127.0.0.1).
    pub fn rest_port(&self) -> u16 {
        self.rest_port
    }

    /// The worker's directory: `worker.properties`, `connector.properties`
    /// (as filled), `offsets.dat`, `connect.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The worker's log (every start appends to it).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("connect.log")
    }

    /// The last `n` lines of the worker's log.
    pub fn log_tail(&self, n: usize) -> String {
        let bytes = std::fs::read(self.log_path()).unwrap_or_default();
        last_lines(&String::from_utf8_lossy(&bytes), n)
    }

    fn log_excerpt(&self) -> String {
        format!(
            "--- the worker's log ({}), last {LOG_LINES} lines ---\n{}",
            self.log_path().display(),
            self.log_tail(LOG_LINES)
        )
    }
}

impl Drop for DebeziumWorker {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            tracing::warn!("killing the Debezium worker: {e:#}");
        }
    }
}

fn path_str(path: &Path) -> anyhow::Result<String> {
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}
