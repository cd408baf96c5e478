//! One relay session: a replication connection and a producer, from
//! set-up to the last status update.
//!
//! ```text
//!   stream.recv ──▶ EventStep::step ──▶ Placement::place ──▶ tracker.register ──▶ sink.send
//!                                                                                     │
//!   status.confirm ◀── gate.advance ◀── tracker.confirmable ◀── tracker.ack ◀── sink.next_delivery
//! ```
//!
//! The session is the I/O around pure parts: [`EventStep`] turns
//! replication messages into records and checkpoint facts, [`Placement`]
//! puts each record in its partition, the [`CheckpointTracker`] decides
//! what Kafka's acknowledgements cover, and the [`ConfirmGate`] what of it
//! may be confirmed (capped at the last clean publication check, nothing
//! while the placement holds).

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{error, info, info_span, warn, Instrument};
use walrelay_pg::xlog::ReplicationMessage;
use walrelay_pg::{Config as PgConfig, ReplicationStream, StatusHandle};
use walrelay_pgoutput::PgTimestamp;

use super::connect::connect;
use super::dead_letters::DeadLetters;
use super::deadline::DeliveryDeadline;
use super::events::{EventStep, Step};
use super::placement::{Placed, Placement};
use super::seen::Seen;
use super::{Trace, TraceSender};
use crate::config::Config;
use crate::engine::checkpoint::{CheckpointTracker, ConfirmGate};
use crate::engine::fence::{ReplayCheck, SessionFence};
use crate::engine::key::EventKey;
use crate::engine::record::Record;
use crate::engine::sink::{DeliveryReport, KafkaSink, SinkError};
use crate::error::RelayError;
use crate::metrics::{Metrics, TopicCounters};
use crate::source::monitor::{self, Outcome, Reports};
use crate::source::source_record::kafka::Writer;
use crate::source::source_record::sampler::Sampler;

/// One replication connection and one producer (see the module docs).
pub(super) struct Session<'a> {
    config: &'a Config,
    stream: ReplicationStream,
    status: StatusHandle,
    sink: KafkaSink,
    /// Replication messages → records (pure).
    events: EventStep,
    /// Records → partitions, fence, placement headers.
    placement: Placement,
    tracker: CheckpointTracker,
    /// `message.timeout.ms`, enforced here rather than by librdkafka.
    deadline: DeliveryDeadline,
    trace: Option<&'a TraceSender>,
    /// seq → key, kept only while tracing (for [`Trace::Acked`]).
    trace_keys: HashMap<u64, EventKey>,
    /// What was confirmed and what the publication checks vouched for;
    /// decides what `confirm` reports (the rule is in `checkpoint::gate`).
    gate: ConfirmGate,
    metrics: Option<&'a Metrics>,
    /// seq → what to count when Kafka acknowledges it, kept only with
    /// metrics.
    metric_events: HashMap<u64, SentEvent>,
    /// Dead-letter records counted and logged (rate-limited).
    dead_letters: DeadLetters,
    /// Reports of the periodic publication check.
    checks: Reports,
    /// When this session's own start-up check began: earlier reports are
    /// older news.
    checked_since: tokio::time::Instant,
    /// The last check could not run (logged once per streak).
    check_unavailable: bool,
    /// Which confirmed event the source record names next.
    sampler: Sampler,
    /// Writes the source record (`None`: its topic does not exist).
    record_writer: Option<Writer>,
}

/// How long a clean stop waits for the last write of the source record.
const RECORD_WRITE_AT_STOP: Duration = Duration::from_secs(5);

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
    Delivery(DeliveryReport),
    /// Time to check the delivery deadline.
    Tick,
    Message(Option<Result<ReplicationMessage, walrelay_pg::Error>>),
}

impl<'a> Session<'a> {
    pub(super) async fn run(
        config: &'a Config,
        shutdown: &mut watch::Receiver<bool>,
        trace: Option<&'a TraceSender>,
        metrics: Option<&'a Metrics>,
        seen: &mut Seen,
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
                s = Session::start(config, &pg, &slot, trace, metrics, seen, checks) => s?,
                _ = stop.wait_for(|stop| *stop) => {
                    info!("stop requested before streaming started");
                    return Ok(());
                }
            };
            let result = session.relay(shutdown).await;
            session.dead_letters.log_summary();
            session.placement.log_summary();
            seen.confirmed(session.gate.confirmed());
            result
        }
        .instrument(span.clone())
        .await;
        if let Err(RelayError::Kafka(e)) = &result {
            span.in_scope(|| e.log_session_end());
            if let Some(m) = metrics {
                m.kafka_error(e);
            }
        }
        if let Some(m) = metrics {
            m.session_ended(result.as_ref().err().map(ToString::to_string));
        }
        result
    }

    /// Set up (`connect.rs`) and announce the session.
    async fn start(
        config: &'a Config,
        pg: &PgConfig,
        slot: &str,
        trace: Option<&'a TraceSender>,
        metrics: Option<&'a Metrics>,
        seen: &mut Seen,
        checks: Reports,
    ) -> Result<Session<'a>, RelayError> {
        let c = connect(config, pg, slot, seen, checks, metrics).await?;
        let confirmed = c.confirmed;
        info!(%confirmed, source = %c.source, "relaying from the slot's confirmed position");
        if let Some(t) = trace {
            let _ = t.send(Trace::SessionStarted {
                confirmed_flush_lsn: confirmed,
            });
        }
        if let Some(m) = metrics {
            m.session_started(confirmed);
        }
        let mut placement = Placement::new(
            SessionFence::new(config, c.fence_reader, c.fence_admin, &c.source, confirmed),
            ReplayCheck::new(confirmed, c.server_wal, &c.source),
            config.relay.headers,
        );
        if let Some(event) = &c.source_record.expect {
            placement.expect_recorded(event);
        }
        Ok(Session {
            config,
            status: c.stream.status_handle(),
            stream: c.stream,
            deadline: DeliveryDeadline::new(c.sink.delivery_timeout()),
            sink: c.sink,
            events: EventStep::new(config, &c.source),
            placement,
            tracker: CheckpointTracker::with_confirmed(confirmed),
            trace,
            trace_keys: HashMap::new(),
            gate: ConfirmGate::new(confirmed, c.vouched),
            metrics,
            metric_events: HashMap::new(),
            dead_letters: DeadLetters::new(slot),
            checks: c.checks,
            checked_since: c.checked_since,
            check_unavailable: false,
            sampler: Sampler::new(config.postgres.status_interval),
            record_writer: c.source_record.writer,
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
        let mut ticks = tokio::time::interval(self.deadline.period());
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let room = self.has_room();
            let action = tokio::select! {
                biased;
                _ = &mut stop => Action::Shutdown,
                c = &mut next_check => Action::Checked(c),
                d = self.sink.next_delivery() => Action::Delivery(d),
                _ = ticks.tick() => Action::Tick,
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
                Action::Tick => {
                    self.sampler.tick(std::time::Instant::now());
                    self.check_deadline()?;
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
                        confirmed = %self.gate.confirmed(),
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
                self.gate.vouch(lsn);
            }
            Ok(Err(e)) => {
                warn!(error = %e, vouched = %self.gate.vouched(), "cannot check the publication before stopping; confirming only up to the last check (the next start replays the rest)");
            }
            Err(_) => {
                warn!(vouched = %self.gate.vouched(), "the publication check before stopping did not answer within 10 s; confirming only up to the last check (the next start replays the rest)");
            }
        }
        self.confirm();
        // A failure here only means the last status update may not have
        // reached the server: the next session replays a little more.
        if let Err(e) = self.stream.stop().await {
            warn!(error = %e, confirmed = %self.gate.confirmed(), "ending the replication stream cleanly failed");
        }
        if let Some(writer) = self.record_writer.take() {
            if let Some(last) = self.sampler.at_stop(self.gate.confirmed()) {
                writer.offer(last, self.gate.confirmed());
            }
            writer.finish(RECORD_WRITE_AT_STOP).await;
        }
        info!(confirmed = %self.gate.confirmed(), "stopped");
        Ok(())
    }

    fn on_delivery(&mut self, d: DeliveryReport) -> Result<(), RelayError> {
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
            Err(e) => {
                self.sink.stop_sending();
                Err(e.into())
            }
        }
    }

    /// The oldest record in flight waited `message.timeout.ms`: nothing
    /// more is sent (so no later record lands after it), then the
    /// session fails and the next one replays from the slot.
    fn check_deadline(&mut self) -> Result<(), RelayError> {
        let now = std::time::Instant::now();
        let (next, oldest) = (self.tracker.next_seq(), self.tracker.oldest_unacked());
        let (Some(waited), Some(timeout)) = (
            self.deadline.tick(now, next, oldest),
            self.deadline.timeout(),
        ) else {
            return Ok(());
        };
        self.sink.stop_sending();
        Err(SinkError::NotAcknowledged {
            in_flight: self.tracker.in_flight_events(),
            waited,
            timeout,
        }
        .into())
    }

    fn confirm(&mut self) {
        if let Some(m) = self.metrics {
            m.set_in_flight(
                self.tracker.in_flight_events(),
                self.tracker.in_flight_bytes(),
            );
        }
        let acked = self.tracker.confirmable();
        if let Some(lsn) = self.gate.advance(acked, self.placement.holding()) {
            self.status.confirm(lsn);
            if let (Some(event), Some(writer)) = (self.sampler.confirmed(lsn), &self.record_writer)
            {
                writer.offer(event, lsn);
            }
            if let Some(m) = self.metrics {
                m.set_confirmed(lsn);
            }
            self.trace(Trace::Confirmed { lsn });
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
                self.gate.vouch(*lsn);
                Ok(())
            }
            Outcome::Drift(e) => {
                error!(error = %e, confirmed = %self.gate.confirmed(), "the publication changed so that outbox rows would be skipped; stopping without confirming anything after it");
                Err(RelayError::Publication(e.clone()))
            }
            Outcome::ServerGoingAway(why) => {
                info!(reason = %why, confirmed = %self.gate.confirmed(), vouched = %self.gate.vouched(), "PostgreSQL is shutting down or restarting; ending the session so that it does not hold the shutdown");
                Err(RelayError::ServerGoingAway {
                    why: why.clone(),
                    confirmed: self.gate.confirmed(),
                })
            }
            Outcome::Unavailable(why) => {
                if !self.check_unavailable {
                    warn!(error = %why, vouched = %self.gate.vouched(), "cannot check the publication; confirming nothing past the last check until it works again");
                    self.check_unavailable = true;
                }
                Ok(())
            }
        }
    }

    /// One replication message: a keepalive moves the checkpoint, data
    /// goes through the event step, and what it asks for is done here.
    async fn on_message(&mut self, msg: ReplicationMessage) -> Result<(), RelayError> {
        let x = match msg {
            ReplicationMessage::Keepalive(k) => {
                if let Some(m) = self.metrics {
                    m.set_server_wal_end(k.wal_end);
                }
                let in_transaction = self.events.in_transaction();
                if !in_transaction {
                    self.placement.passed(k.wal_end)?;
                }
                self.tracker.keepalive(k.wal_end, in_transaction);
                return Ok(());
            }
            ReplicationMessage::XLogData(x) => x,
        };
        if let Some(m) = self.metrics {
            m.set_server_wal_end(x.wal_end);
        }
        match self.events.step(x.wal_start, x.data)? {
            Step::Nothing => {}
            Step::Committed { end_lsn } => {
                self.placement.passed(end_lsn)?;
                self.tracker.commit(end_lsn);
            }
            Step::Send(event) => {
                if let Some(d) = &event.dead_letter {
                    self.dead_letters.sent(d, &event.record, self.metrics);
                }
                let standalone = event.standalone;
                self.send(event.record, event.commit_time).await?;
                // After the record is registered: confirmable once it is
                // acknowledged.
                if let Some(lsn) = standalone {
                    self.tracker.standalone(lsn);
                }
            }
        }
        Ok(())
    }

    /// Place the record (partition, fence, headers) and hand it to the
    /// producer. A dead-letter record takes exactly the same way: it is
    /// confirmed only after Kafka acknowledged it and everything before it.
    async fn send(
        &mut self,
        mut record: Record,
        commit_time: Option<PgTimestamp>,
    ) -> Result<(), RelayError> {
        let (partition, counters) = match self
            .placement
            .place(&mut record, &self.sink, self.metrics)
            .await?
        {
            Placed::InKafka => return Ok(()),
            Placed::Send {
                partition,
                counters,
            } => (partition, counters),
        };
        self.sampler.sent(
            record.event_key,
            &record.topic,
            partition,
            record.timestamp_ms,
            record.value.as_ref(),
        );
        let seq = self.tracker.register_event(record.size());
        if let Some(counters) = counters {
            self.metric_events.insert(
                seq,
                SentEvent {
                    counters: counters.clone(),
                    bytes: record.size() as u64,
                    commit_time,
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
                    self.check_deadline()?;
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

/// Resolves when the publication check reports again (`false`: its task
/// is gone). `checks` is a clone of the session's receiver after its last
/// `borrow_and_update`, so it waits for the next report.
fn wait_for_check(
    mut checks: Reports,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    Box::pin(async move { checks.changed().await.is_ok() })
}
