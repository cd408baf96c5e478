//! Which event the source record names, and when (pure: the session
//! passes the clock in).
//!
//! Once per interval the next record the session hands to the producer
//! becomes the candidate; when the slot's confirmed position passes the
//! candidate's key, the candidate is confirmed (it and everything before
//! it are in Kafka) and goes to the writer, and the next interval's
//! candidate is taken. So the recorded event lags the newest confirmed one
//! by about an interval. The session's periodic tick arms the sampler, so
//! the per-record cost is reading one flag (no clock) and keeping the last
//! record's key, partition and commit time in place: a clean stop records
//! the very last event it confirmed ([`Sampler::at_stop`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use walrelay_pgoutput::Lsn;

use super::{EventIdentity, RecordedEvent};
use crate::engine::key::EventKey;

/// The last record sent, as little as names it (its identity is
/// computed only if a clean stop records it).
#[derive(Debug)]
struct Last {
    key: EventKey,
    topic: Arc<str>,
    partition: u32,
    timestamp_ms: Option<i64>,
    value: Option<Bytes>,
}

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
    last: Option<Last>,
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
            last: None,
        }
    }

    /// A record was handed to the producer.
    #[inline]
    pub fn sent(
        &mut self,
        key: EventKey,
        topic: &Arc<str>,
        partition: u32,
        timestamp_ms: Option<i64>,
        value: Option<&Bytes>,
    ) {
        if self.armed {
            self.candidate = Some(RecordedEvent {
                key,
                topic: topic.to_string(),
                partition,
                identity: EventIdentity::of(timestamp_ms, value.map(|v| &v[..])),
            });
            self.armed = false;
            self.taken_at = self.now;
        }
        // In place, and without touching a reference count while the
        // topic stays the same: this runs for every record. A value is
        // kept only where it is the identity (no commit time).
        let value = if timestamp_ms.is_none() {
            value.cloned()
        } else {
            None
        };
        match &mut self.last {
            Some(last) => {
                last.key = key;
                last.partition = partition;
                last.timestamp_ms = timestamp_ms;
                last.value = value;
                if !Arc::ptr_eq(&last.topic, topic) {
                    last.topic = Arc::clone(topic);
                }
            }
            None => {
                self.last = Some(Last {
                    key,
                    topic: Arc::clone(topic),
                    partition,
                    timestamp_ms,
                    value,
                });
            }
        }
    }

    /// A clean stop confirmed up to `lsn`: the last record sent, if that
    /// is confirmed, else the last confirmed candidate's successor, if
    /// any.
    pub fn at_stop(&mut self, lsn: Lsn) -> Option<RecordedEvent> {
        match self.last.take() {
            Some(last) if lsn.0 > last.key.high() => Some(RecordedEvent {
                key: last.key,
                topic: last.topic.to_string(),
                partition: last.partition,
                identity: EventIdentity::of(last.timestamp_ms, last.value.as_deref()),
            }),
            _ => self.confirmed(lsn),
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
    use crate::engine::key::EventKey;
    use crate::source::source_record::EventIdentity;

    fn event(high: u64) -> RecordedEvent {
        RecordedEvent {
            key: EventKey::new(high, high + 1),
            topic: "orders".into(),
            partition: 0,
            identity: EventIdentity::CommitTime(1),
        }
    }

    fn send(s: &mut Sampler, high: u64) {
        let topic: Arc<str> = Arc::from("orders");
        s.sent(EventKey::new(high, high + 1), &topic, 0, Some(1), None);
    }

    #[test]
    fn one_candidate_per_interval_goes_out_once_confirmed() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let mut s = Sampler::new(second);
        s.tick(t0);
        send(&mut s, 0x100);
        send(&mut s, 0x110);
        s.tick(t0 + second * 5);
        send(&mut s, 0x120);
        assert_eq!(
            s.confirmed(Lsn(0x100)),
            None,
            "the commit record starts there: not confirmed yet"
        );
        assert_eq!(
            s.confirmed(Lsn(0x180)),
            Some(event(0x100)),
            "the first record of the session, one candidate at a time"
        );
        assert_eq!(s.confirmed(Lsn(0x200)), None, "given once");
        s.tick(t0 + second / 2);
        send(&mut s, 0x200);
        assert_eq!(s.confirmed(Lsn(0x201)), None, "not before the interval");
        s.tick(t0 + second);
        send(&mut s, 0x300);
        send(&mut s, 0x310);
        assert_eq!(s.confirmed(Lsn(0x301)), Some(event(0x300)));
    }

    #[test]
    fn a_clean_stop_records_the_last_record_once_confirmed() {
        let mut s = Sampler::new(Duration::from_secs(1));
        s.tick(Instant::now());
        send(&mut s, 0x100);
        send(&mut s, 0x200);
        assert_eq!(s.at_stop(Lsn(0x300)), Some(event(0x200)));
        let mut s = Sampler::new(Duration::from_secs(1));
        send(&mut s, 0x100);
        send(&mut s, 0x200);
        assert_eq!(
            s.at_stop(Lsn(0x150)),
            Some(event(0x100)),
            "the last is not confirmed: the candidate is"
        );
        assert_eq!(Sampler::new(Duration::from_secs(1)).at_stop(Lsn(1)), None);
        // A non-transactional message is known by its value.
        let mut s = Sampler::new(Duration::from_secs(1));
        let topic: Arc<str> = Arc::from("audit");
        let value = Bytes::from_static(b"{\"id\": 7}");
        s.sent(EventKey::new(0x100, 0x100), &topic, 1, Some(5), None);
        s.sent(EventKey::new(0x200, 0x200), &topic, 2, None, Some(&value));
        let last = s.at_stop(Lsn(0x201)).unwrap();
        assert_eq!(
            (last.topic.as_str(), last.partition, last.identity),
            ("audit", 2, EventIdentity::of(None, Some(&value[..])))
        );
    }
}
