//! The readiness state behind `/readyz`: where the relay is in its life
//! ([`Phase`]) and when Kafka last answered, failed or acknowledged a
//! record. Kept apart from the Prometheus registry because readiness is a
//! decision (streaming, Kafka fresh, acknowledgements not stalled), not a
//! number; [`ack_stall`] is its pure core.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a successful contact with Kafka (a delivery report or a probe)
/// keeps the relay ready.
pub const KAFKA_FRESHNESS: Duration = Duration::from_secs(30);

/// How long events may wait in flight with no acknowledgement from Kafka
/// before the relay is not ready. The readiness probe only proves that
/// Kafka answers metadata requests; a stall in which the producer's
/// records are not acknowledged (a partition without a leader, a broker
/// that accepts connections but does not write) must show too. Well
/// under `message.timeout.ms` (30 s), which ends the session.
pub const ACK_STALL_BOUND: Duration = Duration::from_secs(10);

/// How long Kafka has acknowledged nothing while events wait, if longer
/// than `bound` (pure; times in ms as `Health` keeps them, 0 = never).
/// The wait is counted from the later of the last acknowledgement and the
/// moment events started waiting, so a first event after an idle hour is
/// not a stall.
pub fn ack_stall(
    in_flight: u64,
    waiting_since_ms: u64,
    last_ack_ms: u64,
    now_ms: u64,
    bound: Duration,
) -> Option<Duration> {
    if in_flight == 0 {
        return None;
    }
    let since = waiting_since_ms.max(last_ack_ms);
    let waited = Duration::from_millis(now_ms.saturating_sub(since));
    (waited > bound).then_some(waited)
}

/// Where the relay is in its life, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    /// Not yet streaming from the slot (first session being set up).
    Starting,
    /// A session is streaming.
    Streaming,
    /// The last session failed; a new one is being started.
    Failed(String),
    /// Stop requested: waiting for Kafka, then exiting.
    Draining,
    /// The relay returned.
    Stopped,
}

/// The phase and Kafka's last answers, as milliseconds since `origin` + 1
/// (so 0 means never).
#[derive(Debug)]
pub(super) struct Health {
    phase: Mutex<Phase>,
    /// The last successful contact with Kafka.
    kafka_ok: AtomicU64,
    /// The last failed contact with Kafka: when and why.
    kafka_err: Mutex<Option<(u64, String)>>,
    /// When Kafka last acknowledged a record.
    pub(super) last_ack: AtomicU64,
    /// When the in-flight count last rose from zero.
    pub(super) waiting_since: AtomicU64,
    origin: Instant,
}

impl Health {
    /// Starting, Kafka never reached, the clock started at `origin`.
    pub(super) fn new(origin: Instant) -> Health {
        Health {
            phase: Mutex::new(Phase::Starting),
            kafka_ok: AtomicU64::new(0),
            kafka_err: Mutex::new(None),
            last_ack: AtomicU64::new(0),
            waiting_since: AtomicU64::new(0),
            origin,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    pub(super) fn set_phase(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = phase;
    }

    /// A session ended: failed with `error`, or stopped unless it is
    /// draining (the drain's end is [`Phase::Stopped`] set explicitly).
    pub(super) fn session_ended(&self, error: Option<String>) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        match error {
            Some(e) => *phase = Phase::Failed(e),
            None if *phase != Phase::Draining => *phase = Phase::Stopped,
            None => {}
        }
    }

    /// Kafka answered.
    pub(super) fn kafka_ok(&self) {
        self.kafka_ok.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Kafka acknowledged a record (which is also an answer).
    pub(super) fn acknowledged(&self) {
        let now = self.now_ms();
        self.last_ack.store(now, Ordering::Relaxed);
        self.kafka_ok.store(now, Ordering::Relaxed);
    }

    /// A contact with Kafka failed for `reason`.
    pub(super) fn kafka_unreachable(&self, reason: String) {
        *self
            .kafka_err
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((self.now_ms(), reason));
    }

    /// Events started waiting for Kafka (the in-flight count rose from 0).
    pub(super) fn started_waiting(&self) {
        self.waiting_since.store(self.now_ms(), Ordering::Relaxed);
    }

    /// `Ok` when streaming and Kafka answered within [`KAFKA_FRESHNESS`]
    /// with no failure since and no acknowledgement stall with
    /// `in_flight` events waiting; otherwise why not.
    pub(super) fn readiness(&self, in_flight: u64) -> Result<(), String> {
        match &*self.phase.lock().unwrap_or_else(PoisonError::into_inner) {
            Phase::Streaming => {}
            Phase::Starting => return Err("not streaming yet: connecting to the slot".into()),
            Phase::Failed(e) => return Err(format!("session failed, reconnecting: {e}")),
            Phase::Draining => return Err("stopping: draining in-flight events".into()),
            Phase::Stopped => return Err("stopped".into()),
        }
        if let Some(waited) = ack_stall(
            in_flight,
            self.waiting_since.load(Ordering::Relaxed),
            self.last_ack.load(Ordering::Relaxed),
            self.now_ms(),
            ACK_STALL_BOUND,
        ) {
            return Err(format!(
                "Kafka acknowledged nothing for {} s while {in_flight} events are in flight",
                waited.as_secs()
            ));
        }
        let ok = self.kafka_ok.load(Ordering::Relaxed);
        if let Some((at, reason)) = &*self
            .kafka_err
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            if *at >= ok {
                return Err(format!("Kafka unreachable: {reason}"));
            }
        }
        if ok == 0 {
            return Err("Kafka not reached yet".into());
        }
        let age = Duration::from_millis(self.now_ms().saturating_sub(ok));
        if age > KAFKA_FRESHNESS {
            return Err(format!(
                "no successful contact with Kafka for {} s",
                age.as_secs()
            ));
        }
        Ok(())
    }
}
