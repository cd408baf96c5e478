//! The relay loop: replication stream → event step (pgoutput decoder,
//! key, router) → placement (partition, tail fence) → Kafka sink →
//! checkpoint tracker → standby status update.
//!
//! ```text
//!   ReplicationStream ──XLogData──▶ EventStep ──Record──▶ Placement ──▶ KafkaSink
//!         ▲  (keepalive wal_end)   (events.rs)   (placement.rs)   seq │    │ delivery(seq)
//!         │                                                          ▼    ▼
//!   StatusHandle::confirm ◀── CheckpointTracker::confirmable ◀── register / ack
//! ```
//!
//! Files: this one runs sessions one after another and decides what a
//! failure means (`AfterFailure`); `connect.rs` sets a session up (the
//! server, publication and slot checks, the producer, START_REPLICATION);
//! `session.rs` is one session's I/O (the select loop, deliveries,
//! confirmation, the drain);
//! `events.rs` is the pure step from a replication message to records
//! and checkpoint facts; `placement.rs` puts a record in its partition.
//!
//! One session is one replication connection and one producer. It ends
//! with an error on any failure: a delivery failure, a lost connection, or
//! bad input. [`run`] then drops both and, for transient failures, starts a
//! new session from the slot's confirmed position, which replays everything
//! not yet confirmed with the same keys. Nothing is confirmed until Kafka
//! acknowledged it and everything before it (the tracker's rule), so a
//! restart loses nothing; consumers drop the replayed duplicates by key.
//!
//! The publication: pgoutput skips the rows of a table the publication
//! does not cover without any error, so each session starts with a
//! publication check (`publication.rs`), and a task beside the sessions
//! (`monitor.rs`) repeats it on a plain SQL connection. A drift ends the
//! session for good; and nothing past the WAL position sampled before the
//! last clean check is ever confirmed (`Session::vouched`), so the slot
//! never moves past rows skipped after a change the checks have not seen
//! yet.
//!
//! Memory: at most `max_in_flight_events` / `max_in_flight_bytes` records
//! wait for Kafka. At the limit the loop stops reading the stream, the
//! stream's bounded channel fills, and TCP backpressure reaches the
//! walsender, while the stream's own task keeps sending status updates.

mod connect;
mod dead_letters;
mod deadline;
mod events;
mod peers;
mod placement;
mod seen;
mod session;

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};
use walrelay_pg::Config as PgConfig;
use walrelay_pgoutput::Lsn;

use crate::config::Config;
use crate::engine::key::EventKey;
use crate::metrics::Metrics;
use crate::source::monitor::Monitor;
use seen::Seen;
use session::Session;

pub use crate::error::{RelayError, DEAD_LETTER_HINT};
pub use dead_letters::DEAD_LETTER_LOG_INTERVAL;

/// What the relay did, for tests and audits: every produced record, every
/// acknowledgement and every position confirmed to PostgreSQL, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trace {
    SessionStarted {
        confirmed_flush_lsn: Lsn,
    },
    Produced {
        seq: u64,
        key: EventKey,
        topic: String,
        partition: u32,
    },
    Acked {
        seq: u64,
        key: EventKey,
        partition: i32,
        offset: i64,
    },
    Confirmed {
        lsn: Lsn,
    },
    SessionEnded {
        error: Option<String>,
    },
}

/// Shared, cheap-to-clone state for tests and metrics.
pub type TraceSender = mpsc::UnboundedSender<Trace>;

/// Run the relay until `shutdown` becomes `true` (then drain and return
/// `Ok`), or a non-transient error happens.
pub async fn run(
    config: Config,
    shutdown: watch::Receiver<bool>,
    trace: Option<TraceSender>,
) -> Result<(), RelayError> {
    run_with(config, shutdown, trace, None).await
}

/// [`run`], updating `metrics` (see `docs/metrics.md`) as it goes.
pub async fn run_with(
    config: Config,
    shutdown: watch::Receiver<bool>,
    trace: Option<TraceSender>,
    metrics: Option<Metrics>,
) -> Result<(), RelayError> {
    let result = relay_sessions(config, shutdown, trace, metrics.as_ref()).await;
    if let Some(m) = &metrics {
        m.stopped();
    }
    result
}

async fn relay_sessions(
    config: Config,
    mut shutdown: watch::Receiver<bool>,
    trace: Option<TraceSender>,
    metrics: Option<&Metrics>,
) -> Result<(), RelayError> {
    let mut backoff = Duration::from_millis(100);
    let mut standing_by = false;
    // Since when no listed host has been a primary (a failover): one
    // warning per episode, not one per retry.
    let mut no_primary_since: Option<tokio::time::Instant> = None;
    // What this process saw of the source: the highest confirmed
    // position (once set, a missing slot was dropped) and timeline.
    let mut seen = Seen::default();
    let pg = PgConfig::from_env_and_str(&config.postgres.url).map_err(walrelay_pg::Error::from)?;
    // Lives across sessions, so that the lag gauge keeps moving while
    // sessions fail and restart.
    let monitor = Monitor::spawn(pg, config.clone(), metrics.cloned());
    loop {
        let started = tokio::time::Instant::now();
        let result = Session::run(
            &config,
            &mut shutdown,
            trace.as_ref(),
            metrics,
            &mut seen,
            monitor.reports(),
        )
        .await
        .map_err(|e| {
            e.about_slot(&config.postgres.slot, seen.confirmed)
                .about_publication(&config.postgres.publication)
        });
        if let Some(t) = &trace {
            let _ = t.send(Trace::SessionEnded {
                error: result.as_ref().err().map(ToString::to_string),
            });
        }
        let e = match result {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let stop_requested = *shutdown.borrow();
        match after_failure(&e, stop_requested) {
            AfterFailure::CleanStop => {
                let confirmed = seen
                    .confirmed
                    .map_or_else(|| "(none yet)".to_owned(), |l| l.to_string());
                warn!(error = %e, %confirmed, "stopped while the session was failing; the next start replays from the slot's confirmed position");
                return Ok(());
            }
            AfterFailure::StandBy => {
                if standing_by {
                    debug!(error = %e, "the slot is still in use; polling again");
                } else {
                    info!(error = %e, poll = ?config.relay.standby_poll, "the slot is in use by another connection; standing by to take over");
                    standing_by = true;
                }
                backoff = Duration::from_millis(100);
                tokio::select! {
                    _ = tokio::time::sleep(config.relay.standby_poll) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
            }
            AfterFailure::Retry => {
                standing_by = false;
                // A session that ran for a while was healthy: start the
                // backoff over.
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = Duration::from_millis(100);
                }
                match (e.is_waiting_for_primary(), no_primary_since) {
                    (true, None) => {
                        no_primary_since = Some(started);
                        warn!(error = %e, retry_in = ?backoff, max_backoff = ?config.relay.max_backoff,
                              "no primary among the hosts; retrying until one is promoted (logged once until a session starts)");
                    }
                    (true, Some(since)) => {
                        debug!(error = %e, retry_in = ?backoff, waiting = ?since.elapsed(), "still no primary among the hosts");
                    }
                    (false, _) => {
                        // A session that reached a primary ends a wait:
                        // its start was logged ("relaying from ...").
                        no_primary_since = None;
                        warn!(error = %e, retry_in = ?backoff, "relay session failed; restarting from the slot's confirmed position");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
                backoff = (backoff * 2).min(config.relay.max_backoff);
                if let Some(m) = metrics {
                    m.reconnecting();
                }
            }
            AfterFailure::Fail => {
                error!(error = %e, "relay stopped");
                return Err(e);
            }
        }
    }
}

/// What the relay does once a session failed.
#[derive(Debug, PartialEq, Eq)]
enum AfterFailure {
    /// A stop was asked for and the failure is one a restart fixes
    /// (PostgreSQL restarting, the broker away, a delivery failing during
    /// the drain): a clean stop, exit 0. The slot holds everything not
    /// confirmed and the next start replays it, so a SIGTERM during an
    /// outage is not a failure of the process.
    CleanStop,
    /// Another walrelay streams from the slot (PostgreSQL allows one
    /// walsender per slot): poll at a short, fixed interval, so that this
    /// one takes over within about `standby_poll` once the other is gone.
    StandBy,
    /// Start a new session from the slot after a backoff.
    Retry,
    /// Bad input, a broken invariant or a set-up problem: it would fail
    /// again at the same place, so stop and say why (exit non-zero), also
    /// when a stop was asked for.
    Fail,
}

fn after_failure(e: &RelayError, stop_requested: bool) -> AfterFailure {
    let restart_helps = e.is_transient() || e.is_slot_in_use();
    match (restart_helps, stop_requested) {
        (false, _) => AfterFailure::Fail,
        (true, true) => AfterFailure::CleanStop,
        (true, false) if e.is_slot_in_use() => AfterFailure::StandBy,
        (true, false) => AfterFailure::Retry,
    }
}

/// The identity of a source of keys.
pub fn default_source_id(system_id: &str, dbname: &str, slot: &str) -> String {
    format!("{system_id}/{dbname}/{slot}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sink::SinkError;
    use rdkafka::error::RDKafkaErrorCode;
    use tokio::net::TcpListener;

    fn config_for(port: u16) -> Config {
        let mut c = Config::default();
        c.postgres.url = format!("postgres://walrelay@127.0.0.1:{port}/postgres?sslmode=disable");
        c.relay.max_backoff = Duration::from_millis(200);
        c
    }

    /// Upper bound for an outcome awaited below; reaching it fails the
    /// test (it is not used to let something happen).
    const BOUND: Duration = Duration::from_secs(20);

    #[tokio::test]
    async fn a_stop_while_connecting_to_a_silent_server_ends_the_relay_cleanly() {
        // Accepts the connection and never answers: without a
        // connect_timeout the attempt would wait forever.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = watch::channel(false);
        let relay = tokio::spawn(run(config_for(port), stopped, None));
        let (_held_open, _) = tokio::time::timeout(BOUND, listener.accept())
            .await
            .expect("the relay connects")
            .unwrap();
        stop.send(true).unwrap();
        let result = tokio::time::timeout(BOUND, relay)
            .await
            .expect("the relay stops without waiting for the server")
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
    }

    #[test]
    fn after_a_stop_request_only_errors_a_restart_cannot_fix_fail_the_process() {
        let refused = RelayError::Postgres(walrelay_pg::Error::StreamStopped);
        // `pg_ctl stop -m fast`: the walsender ends the copy.
        let server_shutdown = RelayError::Postgres(walrelay_pg::Error::StreamEndedByServer {
            by: "CommandComplete \"COPY 0\"".into(),
        });
        let delivery =
            RelayError::Kafka(SinkError::Flush(RDKafkaErrorCode::BrokerTransportFailure));
        let in_use = RelayError::SlotInUse {
            slot: "s".into(),
            pid: Some(7),
        };
        let dropped = RelayError::SlotDropped {
            slot: "s".into(),
            confirmed: Lsn(16),
        };
        let bad = RelayError::Protocol {
            what: "Commit",
            lsn: Lsn(16),
            detail: "outside a transaction".into(),
        };
        assert_eq!(after_failure(&refused, true), AfterFailure::CleanStop);
        assert_eq!(after_failure(&delivery, true), AfterFailure::CleanStop);
        assert_eq!(after_failure(&in_use, true), AfterFailure::CleanStop);
        assert_eq!(after_failure(&dropped, true), AfterFailure::Fail);
        assert_eq!(after_failure(&bad, true), AfterFailure::Fail);
        assert_eq!(after_failure(&refused, false), AfterFailure::Retry);
        assert_eq!(after_failure(&server_shutdown, false), AfterFailure::Retry);
        assert_eq!(
            after_failure(&server_shutdown, true),
            AfterFailure::CleanStop
        );
        // The check saw the server going down: the session let go of it.
        let going_away = RelayError::ServerGoingAway {
            why: "FATAL 57P03: the database system is shutting down".into(),
            confirmed: Lsn(16),
        };
        assert_eq!(after_failure(&going_away, false), AfterFailure::Retry);
        assert_eq!(after_failure(&going_away, true), AfterFailure::CleanStop);
        assert_eq!(after_failure(&delivery, false), AfterFailure::Retry);
        assert_eq!(after_failure(&in_use, false), AfterFailure::StandBy);
        assert_eq!(after_failure(&dropped, false), AfterFailure::Fail);
        assert_eq!(after_failure(&bad, false), AfterFailure::Fail);
    }

    #[tokio::test]
    async fn a_stop_before_the_first_session_is_a_clean_stop() {
        // Nothing listens there: the connection is refused at once.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (_stop, stopped) = watch::channel(true);
        let result = tokio::time::timeout(BOUND, run(config_for(port), stopped, None))
            .await
            .expect("the relay stops");
        assert!(result.is_ok(), "{result:?}");
    }

    #[tokio::test]
    async fn errors_a_restart_cannot_fix_still_fail_a_stopping_relay() {
        let mut config = config_for(1);
        config.postgres.url = "postgres://walrelay@127.0.0.1:1/postgres?sslmode=bogus".into();
        let (_stop, stopped) = watch::channel(true);
        let result = tokio::time::timeout(BOUND, run(config, stopped, None))
            .await
            .expect("the relay stops");
        assert!(result.is_err(), "a configuration error is not a clean stop");
    }
}
