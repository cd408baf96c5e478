//! Counters of what the consumer did.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, shared (`Arc`) between a store and whoever reports them.
///
/// Each is incremented once per record (per delivery, for `duplicates`).
/// Reading them is cheap and lock-free; a [`CountersSnapshot`] is not an
/// atomic cut across the four, which does not matter for monitoring.
#[derive(Debug, Default)]
pub struct Counters {
    /// Records whose side effects were committed.
    pub processed: AtomicU64,
    /// Deliveries skipped because their key was not above the high-water
    /// mark (replays, redeliveries after a rebalance or a crash).
    pub duplicates: AtomicU64,
    /// Records whose `walrelay-prev-key` was above the high-water mark:
    /// something before them was never processed (see the crate docs for
    /// what this can and cannot detect).
    pub gaps: AtomicU64,
    /// Attempts that failed (handler error or database error) and were
    /// rolled back.
    pub errors: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// See [`Counters::processed`].
    pub processed: u64,
    /// See [`Counters::duplicates`].
    pub duplicates: u64,
    /// See [`Counters::gaps`].
    pub gaps: u64,
    /// See [`Counters::errors`].
    pub errors: u64,
}

impl Counters {
    /// Reads all four counters.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            processed: self.processed.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            gaps: self.gaps.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_all() {
        let c = Counters::default();
        Counters::incr(&c.processed);
        Counters::incr(&c.processed);
        Counters::incr(&c.duplicates);
        Counters::incr(&c.gaps);
        Counters::incr(&c.errors);
        Counters::incr(&c.errors);
        Counters::incr(&c.errors);
        assert_eq!(
            c.snapshot(),
            CountersSnapshot {
                processed: 2,
                duplicates: 1,
                gaps: 1,
                errors: 3
            }
        );
    }
}
