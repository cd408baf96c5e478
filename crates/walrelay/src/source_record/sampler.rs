//! Which event the source record names, and when (pure: the session
//! passes the clock in).
//!
//! Once per interval the next record the session hands to the producer
//! becomes the candidate; when the slot's confirmed position passes the
//! candidate's key, the candidate is confirmed (it and everything before
//! it are in Kafka) and goes to the writer, and the next interval's
//! candidate is taken. So the recorded event lags the newest confirmed one
//! by about an interval. The session's periodic tick arms the sampler, so
//! the per-record cost is reading one flag (no clock).

use std::time::{Duration, Instant};

use walrelay_pgoutput::Lsn;

use super::RecordedEvent;

/// The candidate of one session.
#[derive(Debug)]
pub struct Sampler {
    interval: Duration,
    /// The next record sent becomes the candidate.
    armed: bool,
    /// The last tick, and when the last candidate was taken.
    now: Option<Instant>,
    taken_at: Option<Instant>,
    candidate: Option<RecordedEvent>,
}

impl Sampler {
    /// Takes a candidate at most once per `interval`.
    #[must_use]
    pub fn new(interval: Duration) -> Sampler {
        Sampler {
            interval,
            armed: true,
            now: None,
            taken_at: None,
            candidate: None,
        }
    }

    /// The session's periodic tick: arms the sampler once the interval
    /// since the last candidate has passed.
    pub fn tick(&mut self, now: Instant) {
        self.now = Some(now);
        if self.candidate.is_none()
            && self
                .taken_at
                .is_none_or(|at| now.duration_since(at) >= self.interval)
        {
            self.armed = true;
        }
    }

    /// Whether the next record sent becomes the candidate.
    #[inline]
    #[must_use]
    pub fn wants(&self) -> bool {
        self.armed
    }

    /// A record was handed to the producer while [`Sampler::wants`] said
    /// so.
    pub fn take(&mut self, event: RecordedEvent) {
        self.candidate = Some(event);
        self.armed = false;
        self.taken_at = self.now;
    }

    /// The slot's confirmed position is `lsn` now: the candidate, once
    /// its transaction is confirmed.
    pub fn confirmed(&mut self, lsn: Lsn) -> Option<RecordedEvent> {
        if self
            .candidate
            .as_ref()
            .is_some_and(|c| lsn.0 > c.key.high())
        {
            return self.candidate.take();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::EventKey;
    use crate::source_record::EventIdentity;

    fn event(high: u64) -> RecordedEvent {
        RecordedEvent {
            key: EventKey::new(high, high + 1),
            topic: "orders".into(),
            partition: 0,
            identity: EventIdentity::CommitTime(1),
        }
    }

    #[test]
    fn one_candidate_per_interval_goes_out_once_confirmed() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let mut s = Sampler::new(second);
        assert!(s.wants(), "the first record of a session");
        s.tick(t0);
        s.take(event(0x100));
        s.tick(t0 + second * 5);
        assert!(!s.wants(), "one candidate at a time");
        assert_eq!(
            s.confirmed(Lsn(0x100)),
            None,
            "the commit record starts there: not confirmed yet"
        );
        assert_eq!(s.confirmed(Lsn(0x180)), Some(event(0x100)));
        assert_eq!(s.confirmed(Lsn(0x200)), None, "given once");
        s.tick(t0 + second / 2);
        assert!(!s.wants(), "not before the interval");
        s.tick(t0 + second);
        assert!(s.wants());
        s.take(event(0x300));
        assert!(!s.wants());
        assert_eq!(s.confirmed(Lsn(0x301)), Some(event(0x300)));
    }
}
