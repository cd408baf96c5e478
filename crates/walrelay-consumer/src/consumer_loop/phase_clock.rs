//! Where the partitions' time goes ([`LoopMetrics::phase_seconds`]): the
//! loop's accounting of partition-seconds per [`Phase`], kept apart from
//! its I/O. The phases seen when the loop starts waiting hold until it
//! wakes; a finished batch adds its own connecting, handler and commit
//! times.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

use crate::metrics::{LoopMetrics, Phase};

pub(super) struct PhaseClock {
    /// One counter per phase, in [`Phase::ALL`] order.
    counters: Vec<Counter<f64, AtomicU64>>,
    /// Partitions per phase (index in [`Phase::ALL`]) since `since`.
    counts: [u32; Phase::ALL.len()],
    since: Instant,
}

/// `phase`'s index in [`Phase::ALL`].
fn index(phase: Phase) -> Option<usize> {
    Phase::ALL.iter().position(|p| *p == phase)
}

impl PhaseClock {
    pub(super) fn new(metrics: &LoopMetrics) -> PhaseClock {
        PhaseClock {
            counters: Phase::ALL.iter().map(|p| metrics.phase(*p)).collect(),
            counts: [0; Phase::ALL.len()],
            since: Instant::now(),
        }
    }

    /// Adds the time since the last snapshot to its phases.
    pub(super) fn tick(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.since).as_secs_f64();
        self.since = now;
        for (count, counter) in self.counts.iter().zip(&self.counters) {
            if *count > 0 {
                counter.inc_by(dt * f64::from(*count));
            }
        }
    }

    /// The phases from now on.
    pub(super) fn snapshot(&mut self, phases: impl Iterator<Item = Phase>) {
        self.counts = [0; Phase::ALL.len()];
        for i in phases.filter_map(index) {
            self.counts[i] += 1;
        }
    }

    /// Adds a finished job's own measurements.
    pub(super) fn job(&self, connecting: Duration, handler: Duration, total: Duration) {
        let commit = total.saturating_sub(connecting + handler);
        for (phase, d) in [
            (Phase::Connecting, connecting),
            (Phase::Handler, handler),
            (Phase::Commit, commit),
        ] {
            if let Some(i) = index(phase) {
                self.counters[i].inc_by(d.as_secs_f64());
            }
        }
    }
}
