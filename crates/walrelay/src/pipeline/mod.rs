//! The relay loop: replication stream → pgoutput decoder → key → router →
//! Kafka sink → checkpoint tracker → standby status update.
//!
//! ```text
//!   ReplicationStream ──XLogData──▶ Decoder ──▶ KeyAssigner ──▶ Router ──▶ KafkaSink
//!         ▲  (keepalive wal_end)                                   seq │       │ delivery(seq)
//!         │                                                            ▼       ▼
//!   StatusHandle::confirm ◀── CheckpointTracker::poll_confirm ◀── register / ack
//! ```
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, info_span, warn, Instrument};
use walrelay_pg::log_limit::KeyedLogLimit;
use walrelay_pg::xlog::ReplicationMessage;
use walrelay_pg::{
    Config as PgConfig, PgOutputOptions, ReplicationConnection, ReplicationStream, StatusHandle,
    StreamOptions,
};
use walrelay_pgoutput::{Decoder, Lsn, PgOutputMessage, PgTimestamp, RelationCache};

use crate::checkpoint::CheckpointTracker;
use crate::config::Config;
use crate::fence::SessionFence;
use crate::key::{EventKey, KeyAssigner};
use crate::metrics::{Metrics, TopicCounters};
use crate::monitor::{self, Monitor, Outcome, Reports};
use crate::partition::{partition_for_key, partition_for_keyless};
use crate::record::{header, Record};
use crate::route::{BadEvent, MessageRoute, RouteError, Router, TxInfo};
use crate::sink::{Delivery, KafkaSink, SinkError};

pub use crate::error::{RelayError, DEAD_LETTER_HINT};

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
    // The highest confirmed position seen for the slot in this process:
    // once set, the slot existed, and a missing slot means it was dropped.
    let mut known: Option<Lsn> = None;
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
            &mut known,
            monitor.reports(),
        )
        .await
        .map_err(|e| {
            e.about_slot(&config.postgres.slot, known)
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
                let confirmed = known.map_or_else(|| "(none yet)".to_owned(), |l| l.to_string());
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
                warn!(error = %e, retry_in = ?backoff, "relay session failed; restarting from the slot's confirmed position");
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

struct Session<'a> {
    config: &'a Config,
    stream: ReplicationStream,
    status: StatusHandle,
    sink: KafkaSink,
    decoder: Decoder,
    relations: RelationCache,
    keys: KeyAssigner,
    tracker: CheckpointTracker,
    router: Router,
    tx: Option<TxInfo>,
    trace: Option<&'a TraceSender>,
    /// seq → key, kept only while tracing (for [`Trace::Acked`]).
    trace_keys: HashMap<u64, EventKey>,
    /// The last key sent to each (topic, partition) in this session, for
    /// the `walrelay-prev-key` header.
    last_sent: HashMap<(Arc<str>, u32), EventKey>,
    prev_key_header: Arc<str>,
    layout_header: Arc<str>,
    /// Each topic's layout and tail fence.
    fence: SessionFence,
    confirmed: Lsn,
    metrics: Option<&'a Metrics>,
    /// seq → what to count when Kafka acknowledges it, kept only with
    /// metrics.
    metric_events: HashMap<u64, SentEvent>,
    /// Per-topic counters, looked up once per topic and session.
    topic_counters: HashMap<Arc<str>, TopicCounters>,
    /// Relations whose check failed (not an outbox, a configured column
    /// missing), by relation id: the error is raised at the first change
    /// to the table, with that change's LSN (a Relation message carries
    /// none). Usually empty; checked only when not.
    rejected: HashMap<u32, RouteError>,
    /// One WARN per dead-letter kind and [`DEAD_LETTER_LOG_INTERVAL`]: a
    /// stream of bad events must not flood the log (the metric counts
    /// each one).
    dead_letter_logs: KeyedLogLimit,
    /// Reports of the periodic publication check.
    checks: Reports,
    /// When this session's own start-up check began: earlier reports are
    /// older news.
    checked_since: tokio::time::Instant,
    /// The server's WAL position sampled by the last clean publication
    /// check. Nothing above it is confirmed, keepalives included: WAL
    /// written after a publication change that the checks have not seen
    /// yet may lack rows pgoutput skipped.
    vouched: Lsn,
    /// The last check could not run (logged once per streak).
    check_unavailable: bool,
}

/// At most one "event diverted to the dead-letter topic" line per kind in
/// this interval; the next says how many were not logged.
pub const DEAD_LETTER_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// How long a send that found the producer's queue full waits for a
/// delivery report before it tries again (see `Session::send`).
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(10);

/// An event in flight, as the metrics see it.
struct SentEvent {
    counters: TopicCounters,
    bytes: u64,
    commit_time: Option<PgTimestamp>,
}

enum Action {
    Shutdown,
    /// A publication check reported (`false`: the check task is gone).
    Checked(bool),
    Delivery(Delivery),
    Message(Option<Result<ReplicationMessage, walrelay_pg::Error>>),
}

impl<'a> Session<'a> {
    async fn run(
        config: &'a Config,
        shutdown: &mut watch::Receiver<bool>,
        trace: Option<&'a TraceSender>,
        metrics: Option<&'a Metrics>,
        known: &mut Option<Lsn>,
        checks: Reports,
    ) -> Result<(), RelayError> {
        let pg =
            PgConfig::from_env_and_str(&config.postgres.url).map_err(walrelay_pg::Error::from)?;
        let slot = config.postgres.slot.clone();
        let span = info_span!("session", slot = %slot);
        let result = async move {
            // Until streaming starts nothing is in flight, so a stop simply
            // abandons the set-up (a connection attempt can take up to
            // connect_timeout, or hang without one).
            let mut stop = shutdown.clone();
            let mut session = tokio::select! {
                biased;
                s = Session::start(config, &pg, &slot, trace, metrics, known, checks) => s?,
                _ = stop.wait_for(|stop| *stop) => {
                    info!("stop requested before streaming started");
                    return Ok(());
                }
            };
            let result = session.relay(shutdown).await;
            session.log_dead_letter_summary();
            session.fence.log_summary();
            *known = Some(known.map_or(session.confirmed, |k| k.max(session.confirmed)));
            result
        }
        .instrument(span.clone())
        .await;
        if let Err(RelayError::Kafka(e)) = &result {
            span.in_scope(|| log_kafka_error(e));
            if let Some(m) = metrics {
                m.kafka_error(e);
            }
        }
        if let Some(m) = metrics {
            m.session_ended(result.as_ref().err().map(ToString::to_string));
        }
        result
    }

    /// Connect, check the server and the slot, create the producer and
    /// start streaming from the slot's confirmed position.
    async fn start(
        config: &'a Config,
        pg: &PgConfig,
        slot: &str,
        trace: Option<&'a TraceSender>,
        metrics: Option<&'a Metrics>,
        known: &mut Option<Lsn>,
        mut checks: Reports,
    ) -> Result<Session<'a>, RelayError> {
        let mut conn = ReplicationConnection::connect(pg).await?;
        let system = conn.identify_system().await?;
        conn.check_wal_level().await?;
        // Refuse to start on a publication that would skip outbox rows
        // (pgoutput itself never says so). Reports of the periodic check
        // from before this point are superseded by this one.
        //
        // On a connection of its own, never on the walsender's: catalog
        // reads there load the outbox tables' *current* shape into the
        // walsender's relation cache, and PostgreSQL 18's pgoutput then
        // described rows written before an ALTER TABLE with the shape
        // after it (a row turned into a missing-column dead letter, and a
        // replay of the same WAL gave different records).
        let checked_since = tokio::time::Instant::now();
        checks.borrow_and_update();
        let vouched = monitor::check_once(pg, config).await?.verdict()?;
        let Some(info) = conn.slot_info(slot).await? else {
            // Never create the slot here: a new slot starts at the
            // current WAL position and would skip what was committed
            // since the old one's confirmed position.
            return Err(match *known {
                Some(confirmed) => RelayError::SlotDropped { slot: slot.to_owned(), confirmed },
                None => RelayError::Setup {
                    problem: format!("replication slot \"{slot}\" does not exist"),
                    fix: "run `walrelay setup` first (it creates the publication, the slot and the SQL helpers); if walrelay used this slot before, it was dropped and events may be missing: see \"The slot was invalidated or dropped\" in docs/operations.md".into(),
                },
            });
        };
        let confirmed = info.confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
        *known = Some(known.map_or(confirmed, |k| k.max(confirmed)));
        if info.wal_status.as_deref() == Some("lost") {
            return Err(RelayError::SlotInvalidated {
                slot: slot.to_owned(),
                confirmed: info.confirmed_flush_lsn,
            });
        }
        if info.plugin.as_deref() != Some("pgoutput") {
            return Err(RelayError::Setup {
                problem: format!(
                    "slot \"{slot}\" uses plugin {:?}, not pgoutput",
                    info.plugin
                ),
                fix: "use a pgoutput slot: `walrelay setup` with another slot name creates one"
                    .into(),
            });
        }
        // A standby polls often: when another walsender holds the slot,
        // stop here, before a Kafka producer is created for nothing.
        // (If the slot frees up in between, START_REPLICATION decides.)
        if info.active {
            return Err(RelayError::SlotInUse {
                slot: slot.to_owned(),
                pid: info.active_pid,
            });
        }
        let source = config.relay.source_id.clone().unwrap_or_else(|| {
            default_source_id(
                &system.system_id,
                system.dbname.as_deref().unwrap_or(pg.get_dbname()),
                slot,
            )
        });
        let sink = KafkaSink::new(&crate::kafka_client::producer_config(&config.kafka))?;
        let fence_reader = if config.relay.fence {
            Some(crate::kafka_client::client_config(
                &config.kafka,
                crate::kafka_client::KafkaClient::Fence,
            )?)
        } else {
            None
        };
        let options = StreamOptions {
            status_interval: config.postgres.status_interval,
            initial_flush: confirmed,
            ..StreamOptions::default()
        };
        let pgoutput = PgOutputOptions::new([config.postgres.publication.clone()]);
        let stream = conn
            .start_replication(slot, Lsn::ZERO, &pgoutput, options)
            .await?;
        info!(%confirmed, %source, "relaying from the slot's confirmed position");
        if let Some(t) = trace {
            let _ = t.send(Trace::SessionStarted {
                confirmed_flush_lsn: confirmed,
            });
        }
        if let Some(m) = metrics {
            m.session_started(confirmed);
        }
        Ok(Session {
            config,
            status: stream.status_handle(),
            stream,
            sink,
            decoder: Decoder::new(),
            relations: RelationCache::new(),
            keys: KeyAssigner::default(),
            tracker: CheckpointTracker::with_confirmed(confirmed),
            router: Router::new(config, &source),
            tx: None,
            trace,
            trace_keys: HashMap::new(),
            last_sent: HashMap::new(),
            prev_key_header: Arc::from(header::PREV_KEY),
            layout_header: Arc::from(header::LAYOUT),
            fence: SessionFence::new(config, fence_reader, &source),
            confirmed,
            metrics,
            metric_events: HashMap::new(),
            topic_counters: HashMap::new(),
            rejected: HashMap::new(),
            dead_letter_logs: KeyedLogLimit::new(DEAD_LETTER_LOG_INTERVAL, 64),
            checks,
            checked_since,
            vouched,
            check_unavailable: false,
        })
    }

    fn trace(&self, t: Trace) {
        if let Some(s) = self.trace {
            let _ = s.send(t);
        }
    }

    fn has_room(&self) -> bool {
        self.tracker.in_flight_events() < self.config.relay.max_in_flight_events
            && self.tracker.in_flight_bytes() < self.config.relay.max_in_flight_bytes
    }

    async fn relay(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), RelayError> {
        if *shutdown.borrow_and_update() {
            return self.drain().await;
        }
        // One future for the whole session rather than a new one per loop
        // turn (registering it cost ~5 % of the relay's CPU). `changed`
        // completes for any change after the check above, so none is
        // missed; the value only ever goes from false to true.
        let stop = shutdown.changed();
        tokio::pin!(stop);
        // Likewise one future per publication check, not per turn.
        let mut next_check = wait_for_check(self.checks.clone());
        loop {
            let room = self.has_room();
            let action = tokio::select! {
                biased;
                _ = &mut stop => Action::Shutdown,
                c = &mut next_check => Action::Checked(c),
                d = self.sink.next_delivery() => Action::Delivery(d),
                m = self.stream.recv(), if room => Action::Message(m),
            };
            match action {
                Action::Shutdown => return self.drain().await,
                Action::Checked(true) => {
                    self.on_check()?;
                    next_check = wait_for_check(self.checks.clone());
                }
                Action::Checked(false) => {
                    return Err(RelayError::Setup {
                        problem: "the periodic publication check stopped".into(),
                        fix: "this is a bug in walrelay: restart it and report the log".into(),
                    });
                }
                Action::Delivery(d) => {
                    self.on_delivery(d)?;
                    // Reports come in bursts (one per produce request):
                    // take the rest of the burst before confirming once.
                    while let Some(d) = self.sink.try_next_delivery() {
                        self.on_delivery(d)?;
                    }
                }
                Action::Message(None) => return Err(walrelay_pg::Error::StreamStopped.into()),
                Action::Message(Some(m)) => self.on_message(m?).await?,
            }
            self.confirm();
        }
    }

    /// Stop reading, wait (bounded) for what is in flight, confirm it, and
    /// send a last status update.
    async fn drain(&mut self) -> Result<(), RelayError> {
        if let Some(m) = self.metrics {
            m.draining();
        }
        info!(
            in_flight = self.tracker.in_flight_events(),
            "draining before shutdown"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.tracker.in_flight_events() > 0 {
            match tokio::time::timeout_at(deadline, self.sink.next_delivery()).await {
                Ok(d) => self.on_delivery(d)?,
                Err(_) => {
                    warn!(
                        in_flight = self.tracker.in_flight_events(),
                        confirmed = %self.confirmed,
                        "Kafka did not acknowledge everything within 30 s; unacknowledged events will be replayed next time"
                    );
                    break;
                }
            }
            self.confirm();
        }
        // What Kafka acknowledged since the last periodic check is vouched
        // for by one more check, so that a clean stop confirms it all.
        let pg = PgConfig::from_env_and_str(&self.config.postgres.url)
            .map_err(walrelay_pg::Error::from)?;
        match tokio::time::timeout(
            Duration::from_secs(10),
            monitor::check_once(&pg, self.config),
        )
        .await
        {
            Ok(Ok(checked)) => {
                let lsn = checked.verdict()?;
                self.vouched = self.vouched.max(lsn);
            }
            Ok(Err(e)) => {
                warn!(error = %e, vouched = %self.vouched, "cannot check the publication before stopping; confirming only up to the last check (the next start replays the rest)");
            }
            Err(_) => {
                warn!(vouched = %self.vouched, "the publication check before stopping did not answer within 10 s; confirming only up to the last check (the next start replays the rest)");
            }
        }
        self.confirm();
        // A failure here only means the last status update may not have
        // reached the server: the next session replays a little more.
        if let Err(e) = self.stream.stop().await {
            warn!(error = %e, confirmed = %self.confirmed, "ending the replication stream cleanly failed");
        }
        info!(confirmed = %self.confirmed, "stopped");
        Ok(())
    }

    fn on_delivery(&mut self, d: Delivery) -> Result<(), RelayError> {
        match d.result {
            Ok((partition, offset)) => {
                self.tracker.ack(d.seq)?;
                if let Some(m) = self.metrics {
                    if let Some(sent) = self.metric_events.remove(&d.seq) {
                        sent.counters.acked(sent.bytes);
                        if let Some(t) = sent.commit_time {
                            m.observe_commit_to_ack(t);
                        }
                    }
                    m.acknowledged();
                }
                if self.trace.is_some() {
                    let key = self.trace_keys.remove(&d.seq).unwrap_or(EventKey(0));
                    self.trace(Trace::Acked {
                        seq: d.seq,
                        key,
                        partition,
                        offset,
                    });
                }
                Ok(())
            }
            // Any delivery failure ends the session: what follows in the
            // partition must not be published after a gap.
            Err(e) => Err(e.into()),
        }
    }

    fn confirm(&mut self) {
        if let Some(m) = self.metrics {
            m.set_in_flight(
                self.tracker.in_flight_events(),
                self.tracker.in_flight_bytes(),
            );
        }
        // Never past the last clean publication check (see `vouched`).
        if let Some(lsn) = self.tracker.confirmable().map(|l| l.min(self.vouched)) {
            if lsn > self.confirmed {
                self.confirmed = lsn;
                self.status.confirm(lsn);
                if let Some(m) = self.metrics {
                    m.set_confirmed(lsn);
                }
                self.trace(Trace::Confirmed { lsn });
            }
        }
    }

    /// A periodic publication check reported: a clean one lets
    /// confirmation advance, a drift ends the session before anything
    /// after it is confirmed.
    fn on_check(&mut self) -> Result<(), RelayError> {
        let Some(report) = self.checks.borrow_and_update().clone() else {
            return Ok(());
        };
        if report.started < self.checked_since {
            return Ok(());
        }
        match &report.outcome {
            Outcome::Vouched(lsn) => {
                if self.check_unavailable {
                    info!(vouched = %lsn, "the publication check works again");
                    self.check_unavailable = false;
                }
                self.vouched = self.vouched.max(*lsn);
                Ok(())
            }
            Outcome::Drift(e) => {
                error!(error = %e, confirmed = %self.confirmed, "the publication changed so that outbox rows would be skipped; stopping without confirming anything after it");
                Err(RelayError::Publication(e.clone()))
            }
            Outcome::Unavailable(why) => {
                if !self.check_unavailable {
                    warn!(error = %why, vouched = %self.vouched, "cannot check the publication; confirming nothing past the last check until it works again");
                    self.check_unavailable = true;
                }
                Ok(())
            }
        }
    }

    async fn on_message(&mut self, msg: ReplicationMessage) -> Result<(), RelayError> {
        let x = match msg {
            ReplicationMessage::Keepalive(k) => {
                if let Some(m) = self.metrics {
                    m.set_server_wal_end(k.wal_end);
                }
                self.tracker.keepalive(k.wal_end, self.tx.is_some());
                return Ok(());
            }
            ReplicationMessage::XLogData(x) => x,
        };
        let lsn = x.wal_start;
        if let Some(m) = self.metrics {
            m.set_server_wal_end(x.wal_end);
        }
        let decoded = self
            .decoder
            .decode(x.data)
            .map_err(|error| RelayError::Decode { lsn, error })?;
        match decoded {
            PgOutputMessage::Begin(b) => {
                self.keys.begin(b.final_lsn)?;
                self.tx = Some(TxInfo::new(b.final_lsn, b.xid, b.timestamp));
            }
            PgOutputMessage::Commit(c) => {
                self.keys.commit(c.commit_lsn, c.end_lsn)?;
                self.tracker.commit(c.end_lsn);
                self.tx = None;
            }
            PgOutputMessage::Relation(r) => {
                match self.router.check_relation(&r, lsn) {
                    Ok(()) => {
                        self.rejected.remove(&r.id);
                    }
                    Err(e) => {
                        self.rejected.insert(r.id, e);
                    }
                }
                self.relations.insert(r);
            }
            PgOutputMessage::Insert(i) => {
                self.check_relation(i.relation_id, lsn)?;
                let tx = self.tx.clone().ok_or_else(|| outside_tx("INSERT", lsn))?;
                let row = self
                    .relations
                    .row(i.relation_id, &i.new)
                    .map_err(|error| RelayError::Row { lsn, error })?;
                let key = self.keys.event(lsn)?;
                let record = match self.router.outbox_record(&tx, key, lsn, &row) {
                    Ok(record) => record,
                    Err(e) => {
                        let record =
                            self.router
                                .dead_letter(e, key, lsn, Some(&tx), BadEvent::Row(&row))?;
                        self.dead_lettered(&record);
                        record
                    }
                };
                self.send(record).await?;
            }
            // Outbox rows are immutable events: an UPDATE would change an
            // event that may already be published, and publishes nothing
            // itself. It is bad input like any other, not something to skip
            // with a warning that nobody reads. It gets a key like an
            // INSERT, so that as a dead letter it sits in stream order.
            PgOutputMessage::Update(u) => {
                self.check_relation(u.relation_id, lsn)?;
                let tx = self.tx.clone().ok_or_else(|| outside_tx("UPDATE", lsn))?;
                let row = self
                    .relations
                    .row(u.relation_id, &u.new)
                    .map_err(|error| RelayError::Row { lsn, error })?;
                // A table that is not an outbox never gets here:
                // `check_relation` above raises what its Relation recorded.
                let relation = row.relation();
                let key = self.keys.event(lsn)?;
                let error = RouteError::OutboxUpdate {
                    table: format!("{}.{}", relation.namespace, relation.name),
                    lsn,
                };
                let record =
                    self.router
                        .dead_letter(error, key, lsn, Some(&tx), BadEvent::Row(&row))?;
                self.dead_lettered(&record);
                self.send(record).await?;
            }
            // Deleting published outbox rows is how applications keep the
            // table small (often in the same transaction as the INSERT).
            PgOutputMessage::Delete(d) => {
                self.check_relation(d.relation_id, lsn)?;
                debug!(%lsn, "DELETE from an outbox table ignored");
            }
            PgOutputMessage::Truncate(t) => {
                for id in &t.relation_ids {
                    self.check_relation(*id, lsn)?;
                }
                info!(%lsn, "TRUNCATE of an outbox table ignored");
            }
            PgOutputMessage::Message(m) => {
                // An ignored prefix gets no key; anything else gets its key
                // before routing, so that a dead letter has the key the
                // event would have had.
                let route = self.router.classify_message(&m);
                if route == Ok(MessageRoute::Ignore) {
                    return Ok(());
                }
                let tx = if m.transactional() {
                    Some(
                        self.tx
                            .clone()
                            .ok_or_else(|| outside_tx("transactional message", lsn))?,
                    )
                } else if self.tx.is_some() {
                    return Err(RelayError::Protocol {
                        what: "non-transactional message",
                        lsn,
                        detail: "inside a transaction".into(),
                    });
                } else {
                    None
                };
                let key = match &tx {
                    Some(_) => self.keys.event(m.lsn)?,
                    None => self.keys.non_transactional(m.lsn)?,
                };
                let record = match route
                    .and_then(|route| self.router.message_record(&route, tx.as_ref(), key, &m))
                {
                    Ok(record) => record,
                    Err(e) => {
                        let record = self.router.dead_letter(
                            e,
                            key,
                            m.lsn,
                            tx.as_ref(),
                            BadEvent::Message(&m),
                        )?;
                        self.dead_lettered(&record);
                        record
                    }
                };
                self.send(record).await?;
                if tx.is_none() {
                    self.tracker.standalone(m.lsn);
                }
            }
            PgOutputMessage::Origin(_) | PgOutputMessage::Type(_) => {}
            other => {
                return Err(RelayError::Protocol {
                    what: "pgoutput message",
                    lsn,
                    detail: format!(
                        "{} is not expected with proto_version 1 and streaming off",
                        other.kind()
                    ),
                })
            }
        }
        Ok(())
    }

    /// Partition deterministically and hand the record to the producer.
    /// A dead-letter record takes exactly the same way: it is confirmed
    /// only after Kafka acknowledged it and everything before it.
    async fn send(&mut self, mut record: Record) -> Result<(), RelayError> {
        let partitions = self.sink.partitions(&record.topic).await?;
        let partition = match &record.key {
            Some(k) => partition_for_key(k, partitions),
            None => partition_for_keyless(record.event_key, partitions),
        };
        let topic = self
            .fence
            .topic(&record.topic, partitions, self.metrics)
            .await?;
        // Already in Kafka (a replay after a crash): not written again, and
        // not registered with the tracker, so nothing waits for it.
        if topic.skip(partition, record.event_key) {
            if let Some(m) = self.metrics {
                self.topic_counters
                    .entry(record.topic.clone())
                    .or_insert_with(|| m.topic(&record.topic))
                    .fence_skipped();
            }
            return Ok(());
        }
        let layout = topic.layout.clone();
        let fence_key = topic.fence.key(partition);
        // The first record of this session to the partition follows the
        // partition's fence key, if any: that is its predecessor in Kafka.
        let prev = self
            .last_sent
            .insert((record.topic.clone(), partition), record.event_key)
            .or(fence_key);
        let prev = match prev {
            Some(k) => {
                let mut hex = [0u8; 32];
                k.write_hex(&mut hex);
                Bytes::copy_from_slice(&hex)
            }
            None => Bytes::new(),
        };
        record.insert_walrelay_header(self.layout_header.clone(), layout);
        // With walrelay's own headers, before the application's.
        record.insert_walrelay_header(self.prev_key_header.clone(), prev);
        let seq = self.tracker.register_event(record.size());
        if let Some(m) = self.metrics {
            let counters = match self.topic_counters.get(&record.topic) {
                Some(c) => c.clone(),
                None => {
                    let c = m.topic(&record.topic);
                    self.topic_counters.insert(record.topic.clone(), c.clone());
                    c
                }
            };
            self.metric_events.insert(
                seq,
                SentEvent {
                    counters,
                    bytes: record.size() as u64,
                    commit_time: self.tx.as_ref().map(|t| t.commit_time),
                },
            );
        }
        if self.trace.is_some() {
            self.trace_keys.insert(seq, record.event_key);
            self.trace(Trace::Produced {
                seq,
                key: record.event_key,
                topic: record.topic.to_string(),
                partition,
            });
        }
        loop {
            match self.sink.send(seq, &record, partition) {
                Ok(()) => return Ok(()),
                // The producer's own queue is full: make room by taking
                // deliveries, then retry the same record. librdkafka frees
                // a record's place only after it handed over its delivery
                // report, so the room can come a moment after the last
                // report: wait for a report only briefly, or a relay whose
                // last record in flight was just reported would wait for
                // one that never comes. (`next_delivery` is cancel-safe.)
                Err(SinkError::QueueFull) => {
                    if let Ok(d) =
                        tokio::time::timeout(QUEUE_FULL_RETRY, self.sink.next_delivery()).await
                    {
                        self.on_delivery(d)?;
                        self.confirm();
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Session<'_> {
    /// The error of a table whose Relation failed its check, at the LSN of
    /// this change to it.
    fn check_relation(&self, relation_id: u32, lsn: Lsn) -> Result<(), RelayError> {
        if self.rejected.is_empty() {
            return Ok(());
        }
        match self.rejected.get(&relation_id) {
            Some(e) => Err(e.clone().at(lsn).into()),
            None => Ok(()),
        }
    }

    /// Log and count a dead-letter record as it is sent: the operator must
    /// learn about it without reading the dead-letter topic.
    fn dead_lettered(&self, record: &Record) {
        let find = |name: &str| {
            record
                .headers
                .iter()
                .find(|(k, _)| &**k == name)
                .map(|(_, v)| String::from_utf8_lossy(v))
                .unwrap_or_default()
        };
        let kind = find(header::DEAD_LETTER_KIND);
        if let Some(m) = self.metrics {
            m.dead_letter_record(&kind);
        }
        let Some(suppressed) = self.dead_letter_logs.check(&kind) else {
            return;
        };
        let lsn = find(header::LSN);
        warn!(
            slot = %self.config.postgres.slot,
            %lsn,
            key = %record.event_key,
            %kind,
            topic = %record.topic,
            reason = %find(header::DEAD_LETTER_REASON),
            suppressed,
            "event diverted to the dead-letter topic"
        );
    }

    /// The dead letters of this session not logged one by one, per kind.
    fn log_dead_letter_summary(&self) {
        for (kind, suppressed) in self.dead_letter_logs.take_suppressed() {
            warn!(
                slot = %self.config.postgres.slot,
                %kind,
                suppressed,
                "more events diverted to the dead-letter topic than were logged one by one"
            );
        }
    }
}

/// Resolves when the publication check reports again (`false`: its task
/// is gone). `checks` is a clone of the session's receiver after its last
/// `borrow_and_update`, so it waits for the next report.
fn wait_for_check(
    mut checks: Reports,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    Box::pin(async move { checks.changed().await.is_ok() })
}

/// The structured fields of a Kafka error that ends a session (the
/// message names them too, this makes them searchable).
fn log_kafka_error(e: &SinkError) {
    let (topic, partition) = match e {
        SinkError::Produce {
            topic, partition, ..
        }
        | SinkError::Delivery {
            topic, partition, ..
        }
        | SinkError::RecordTooLarge {
            topic, partition, ..
        } => (Some(topic.as_str()), Some(*partition)),
        SinkError::Metadata { topic, .. } | SinkError::TopicMissing { topic, .. } => {
            (Some(topic.as_str()), None)
        }
        _ => (None, None),
    };
    warn!(
        topic,
        partition,
        code = e.code().map(|c| format!("{c:?}")),
        error = %e,
        "Kafka error ends the session"
    );
}

fn outside_tx(what: &'static str, lsn: Lsn) -> RelayError {
    RelayError::Protocol {
        what,
        lsn,
        detail: "outside a transaction".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
