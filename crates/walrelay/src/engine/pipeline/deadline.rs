//! The relay's own delivery deadline: `message.timeout.ms`, enforced by
//! the session rather than by librdkafka.
//!
//! librdkafka's timeout fails a queued record and then sends the records
//! queued after it, which leaves a hole in the partition that the next
//! session's tail fence would take as written (see
//! [`producer_properties`](crate::engine::sink::producer_properties)). So the
//! producer never times a record out, and the session asks this clock, a
//! few times per timeout, whether the oldest unacknowledged record has
//! waited too long; if so it stops the producer from sending anything
//! more and only then fails.
//!
//! No clock is read per record: each tick notes the tracker's next
//! sequence number, so a record is known to have been registered before
//! the first tick that noted a number above its own. The age found is a
//! lower bound, at most one tick short.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Ticks per timeout, so the deadline fires at most a tenth late; but
/// at least every 50 ms apart and at most a second.
const TICKS_PER_TIMEOUT: u32 = 10;

/// Notes from the session's ticks (see the module docs).
#[derive(Debug)]
pub struct DeliveryDeadline {
    timeout: Option<Duration>,
    /// `(n, t)`: every record with a sequence number below `n` was
    /// registered by `t`. Oldest first, `n` strictly increasing; at most
    /// one per tick, and none older than the oldest unacknowledged
    /// record's, so about [`TICKS_PER_TIMEOUT`] of them.
    marks: VecDeque<(u64, Instant)>,
}

impl DeliveryDeadline {
    /// `timeout`: `None` waits forever (`message.timeout.ms=0`).
    pub fn new(timeout: Option<Duration>) -> DeliveryDeadline {
        DeliveryDeadline {
            timeout,
            marks: VecDeque::new(),
        }
    }

    /// How often the session should call [`tick`](Self::tick).
    pub fn period(&self) -> Duration {
        self.timeout.map_or(Duration::from_secs(1), |t| {
            (t / TICKS_PER_TIMEOUT).clamp(Duration::from_millis(50), Duration::from_secs(1))
        })
    }

    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// A tick at `now`, with the checkpoint tracker's next sequence number
    /// and its oldest unacknowledged record. Returns how long that record
    /// has waited (at least) once that reaches the timeout.
    pub fn tick(
        &mut self,
        now: Instant,
        next_seq: u64,
        oldest_unacked: Option<u64>,
    ) -> Option<Duration> {
        let timeout = self.timeout?;
        let Some(oldest) = oldest_unacked else {
            self.marks.clear();
            return None;
        };
        if self.marks.back().is_none_or(|&(n, _)| n < next_seq) {
            self.marks.push_back((next_seq, now));
        }
        while self.marks.front().is_some_and(|&(n, _)| n <= oldest) {
            self.marks.pop_front();
        }
        let &(_, registered_by) = self.marks.front()?;
        let waited = now.saturating_duration_since(registered_by);
        (waited >= timeout).then_some(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_record_acknowledged_in_time_never_fires() {
        let start = Instant::now();
        let mut d = DeliveryDeadline::new(Some(3 * S));
        // Records 0..10 sent, acknowledged before the timeout; then 10..20.
        assert_eq!(d.tick(start, 10, Some(0)), None);
        assert_eq!(d.tick(start + 2 * S, 10, Some(4)), None);
        assert_eq!(d.tick(start + 3 * S, 20, Some(10)), None);
        assert_eq!(d.tick(start + 5 * S, 20, Some(15)), None);
        // Nothing in flight: no notes kept.
        assert_eq!(d.tick(start + 60 * S, 20, None), None);
        assert!(d.marks.is_empty());
        assert_eq!(d.tick(start + 61 * S, 30, Some(20)), None);
        assert_eq!(d.tick(start + 63 * S, 30, Some(29)), None);
    }

    #[test]
    fn the_oldest_unacknowledged_record_fires_once_it_waited_the_timeout() {
        let start = Instant::now();
        let mut d = DeliveryDeadline::new(Some(3 * S));
        assert_eq!(d.tick(start, 10, Some(0)), None);
        // Later records keep arriving and being acknowledged; record 5
        // (another partition) never is.
        assert_eq!(d.tick(start + S, 40, Some(5)), None);
        assert_eq!(d.tick(start + 2 * S, 80, Some(5)), None);
        assert_eq!(d.tick(start + 3 * S, 90, Some(5)), Some(3 * S));
    }

    #[test]
    fn the_age_counts_from_the_first_tick_after_the_record_was_sent() {
        let start = Instant::now();
        let mut d = DeliveryDeadline::new(Some(3 * S));
        assert_eq!(d.tick(start, 10, Some(0)), None);
        // Record 12 was sent between the first tick and this one.
        assert_eq!(d.tick(start + S, 20, Some(12)), None);
        assert_eq!(d.tick(start + 3 * S, 20, Some(12)), None);
        assert_eq!(d.tick(start + 4 * S, 20, Some(12)), Some(3 * S));
    }

    #[test]
    fn notes_stay_few_while_a_record_waits() {
        let start = Instant::now();
        let mut d = DeliveryDeadline::new(Some(10 * S));
        for i in 0..10u32 {
            assert_eq!(
                d.tick(start + i * S, u64::from(i + 1) * 100, Some(50)),
                None
            );
        }
        assert_eq!(d.marks.len(), 10);
        // Acknowledged up to 550: the notes below it go.
        assert_eq!(d.tick(start + 10 * S, 1100, Some(550)), None);
        assert_eq!(d.marks.len(), 6);
    }

    #[test]
    fn no_timeout_waits_forever() {
        let start = Instant::now();
        let mut d = DeliveryDeadline::new(None);
        assert_eq!(d.tick(start, 10, Some(0)), None);
        assert_eq!(d.tick(start + 3600 * S, 10, Some(0)), None);
        assert!(d.marks.is_empty());
        assert_eq!(d.period(), S);
    }

    #[test]
    fn ticks_come_ten_times_per_timeout_within_bounds() {
        assert_eq!(DeliveryDeadline::new(Some(3 * S)).period(), S * 3 / 10);
        assert_eq!(DeliveryDeadline::new(Some(30 * S)).period(), S);
        assert_eq!(
            DeliveryDeadline::new(Some(Duration::from_millis(100))).period(),
            Duration::from_millis(50)
        );
    }
}
