//! The periodic publication check beside the stream.
//!
//! One task per `walrelay run`, living across sessions, on a plain SQL
//! connection of its own, renewed every few seconds (see
//! [`CONNECTION_MAX_AGE`]; not the walsender: the stream's connection is busy in CopyBoth mode, and
//! PostgreSQL 18 does not even report a dropped publication on it). Every `postgres.publication_check_interval` it runs
//! [`publication::check`] and publishes a [`Report`]; sessions stop on a
//! drift and confirm nothing past the last vouched position. Each check
//! also feeds the server's current WAL position to the lag gauge, so
//! `walrelay_slot_lag_bytes` keeps growing while the relay does not read
//! (Kafka down, between sessions).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};
use walrelay_pg::{Config as PgConfig, ReplicationConnection};
use walrelay_pgoutput::Lsn;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::source::publication::{self, PublicationError};
use crate::source::slot_failover::{Finding, FindingsLog, LogAction};

/// A check that takes longer than this (a hanging server, a connection
/// attempt without connect_timeout) counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// The outcome of one check.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Nothing wrong: WAL up to this position may be confirmed.
    Vouched(Lsn),
    /// Running on would skip events.
    Drift(PublicationError),
    /// The check could not run (connection lost, timeout): vouches for
    /// nothing, so confirmation waits.
    Unavailable(String),
    /// The server is shutting down or restarting (it refused or ended the
    /// check's connection with SQLSTATE 57P03, 57P01 or 57P02). No check
    /// can vouch for anything until it is back, and a logical walsender
    /// stopping for the shutdown waits for its client to confirm all it
    /// sent: a session that stayed would hold the shutdown (`pg_ctl stop`
    /// gives up after 60 s), so it ends and the next one resumes from
    /// the slot's confirmed position.
    ServerGoingAway(String),
}

/// One check, and when it started (a session ignores checks that started
/// before its own start-up check).
#[derive(Debug, Clone)]
pub struct Report {
    pub started: Instant,
    pub outcome: Outcome,
}

/// The latest report, `None` before the first.
pub type Reports = watch::Receiver<Option<Arc<Report>>>;

/// The running check; dropping it stops the task.
pub struct Monitor {
    reports: Reports,
    task: JoinHandle<()>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Monitor {
    /// Start checking at once, then every interval.
    pub fn spawn(pg: PgConfig, config: Config, metrics: Option<Metrics>) -> Monitor {
        let (tx, reports) = watch::channel(None);
        let task = tokio::spawn(run(pg, config, metrics, tx));
        Monitor { reports, task }
    }

    /// A receiver of the reports.
    pub fn reports(&self) -> Reports {
        self.reports.clone()
    }
}

async fn run(
    pg: PgConfig,
    config: Config,
    metrics: Option<Metrics>,
    tx: watch::Sender<Option<Arc<Report>>>,
) {
    let mut conn = KeptConnection::default();
    let mut failover_log = FindingsLog::default();
    let mut ticker = tokio::time::interval(config.postgres.publication_check_interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let started = Instant::now();
        let outcome = match tokio::time::timeout(CHECK_TIMEOUT, conn.check(&pg, &config)).await {
            Ok(Ok(mut checked)) => {
                let findings = std::mem::take(&mut checked.failover);
                log_failover(&mut failover_log, &findings);
                if let Some(m) = &metrics {
                    m.set_failover(&findings);
                    m.set_server_wal_end(checked.wal_lsn);
                    m.set_slot_wal(checked.slot_wal.as_ref());
                    if let Some(confirmed) = checked.slot_confirmed {
                        m.set_server_slot_lag(checked.wal_lsn.0.saturating_sub(confirmed.0));
                    }
                }
                match checked.verdict() {
                    Ok(lsn) => Outcome::Vouched(lsn),
                    Err(e) => Outcome::Drift(e),
                }
            }
            Ok(Err(e)) if e.is_server_going_away() => Outcome::ServerGoingAway(e.to_string()),
            Ok(Err(e)) => Outcome::Unavailable(e.to_string()),
            // The cancelled check had taken the kept connection: the next
            // one starts on a new connection.
            Err(_) => Outcome::Unavailable(format!("no answer within {CHECK_TIMEOUT:?}")),
        };
        debug!(?outcome, "publication check");
        if tx
            .send(Some(Arc::new(Report { started, outcome })))
            .is_err()
        {
            return;
        }
    }
}

/// A warning when a failover finding appears, changes or lasts (see
/// [`FindingsLog`]); the gauges say it at every check.
fn log_failover(log: &mut FindingsLog, findings: &[Finding]) {
    match log.observe(findings, std::time::Instant::now()) {
        LogAction::Nothing => {}
        LogAction::Warn => {
            for f in findings {
                let kind = if f.is_risk() { "RISK" } else { "waiting" };
                warn!(kind, "PostgreSQL failover: {f}");
            }
        }
        LogAction::Cleared => info!("PostgreSQL failover: the findings logged before are resolved"),
    }
}

/// How long the periodic check keeps one SQL connection.
///
/// Not for ever: an idle client session holds a smart shutdown
/// (`pg_ctl stop -m smart` waits for every client session to end by
/// itself) for as long as it stays open, and only a new connection learns
/// that the server is shutting down (57P03). Not one per check either: at
/// the bench's 100 ms interval that would start ten backends a second.
const CONNECTION_MAX_AGE: Duration = Duration::from_secs(5);

/// The periodic check's connection: kept between checks, replaced when
/// older than [`CONNECTION_MAX_AGE`] or when it failed.
#[derive(Default)]
struct KeptConnection {
    conn: Option<(ReplicationConnection, Instant)>,
}

impl KeptConnection {
    /// One check. When the kept connection fails (a fast shutdown
    /// terminated it, an idle timeout closed it), the check is tried again
    /// at once on a new one, so that a server going down is told as such
    /// now, not a tick later.
    async fn check(
        &mut self,
        pg: &PgConfig,
        config: &Config,
    ) -> Result<publication::Checked, walrelay_pg::Error> {
        if let Some((mut old, opened)) = self.conn.take() {
            if opened.elapsed() >= CONNECTION_MAX_AGE {
                let _ = old.close().await;
            } else {
                match publication::check(&mut old, config).await {
                    Ok(checked) => {
                        self.conn = Some((old, opened));
                        return Ok(checked);
                    }
                    Err(e) => {
                        debug!(error = %e, "the check's kept connection failed; trying a new one")
                    }
                }
            }
        }
        let mut new = ReplicationConnection::connect_sql(pg).await?;
        let checked = publication::check(&mut new, config).await?;
        self.conn = Some((new, Instant::now()));
        Ok(checked)
    }
}

/// One check on a connection of its own, closed after it: the drain
/// before a stop.
pub async fn check_once(
    pg: &PgConfig,
    config: &Config,
) -> Result<publication::Checked, walrelay_pg::Error> {
    let mut conn = ReplicationConnection::connect_sql(pg).await?;
    let checked = publication::check(&mut conn, config).await;
    let _ = conn.close().await;
    checked
}
