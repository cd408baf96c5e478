//! Rate limits for log lines that can repeat many times a second: a
//! reconnecting standby, a broker that stays down, a stream of dead
//! letters. The first occurrence is logged at once; later ones within the
//! interval are only counted, and the next line logged after the interval
//! says how many were left out, so no occurrence goes unaccounted for.
//! (Metrics counters are kept separately and stay exact.)
//!
//! Pure: the caller passes the time ([`LogLimit::check_at`]) or takes the
//! clock ([`LogLimit::check`]), so the rule is tested without sleeping.
//! Lives here, the lowest crate that logs such lines; `walrelay` uses it
//! too.
//!
//! ```
//! # use std::time::Duration;
//! # use walrelay_pg::log_limit::LogLimit;
//! static CONNECTED: LogLimit = LogLimit::new(Duration::from_secs(60));
//! if let Some(suppressed) = CONNECTED.check() {
//!     tracing::info!(suppressed, "connected");
//! }
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One window: when its first (logged) line was, and how many lines were
/// left out since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Window {
    started: Option<Instant>,
    suppressed: u64,
}

impl Window {
    fn check(&mut self, interval: Duration, now: Instant) -> Option<u64> {
        match self.started {
            Some(start) if now.saturating_duration_since(start) < interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.started = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// A rate limit for one kind of log line. Usable as a `static`.
#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    window: Mutex<Window>,
}

impl LogLimit {
    /// At most one line per `interval`.
    pub const fn new(interval: Duration) -> LogLimit {
        LogLimit {
            interval,
            window: Mutex::new(Window {
                started: None,
                suppressed: 0,
            }),
        }
    }

    /// Whether to log a line now: `Some(n)` to log it, where `n` lines
    /// were left out since the last one logged; `None` to leave it out
    /// (it is counted).
    pub fn check_at(&self, now: Instant) -> Option<u64> {
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check(self.interval, now)
    }

    /// [`Self::check_at`] with the current time.
    pub fn check(&self) -> Option<u64> {
        self.check_at(Instant::now())
    }

    /// Lines left out since the last one logged, now reported elsewhere
    /// (e.g. in a final summary): the count starts over.
    pub fn take_suppressed(&self) -> u64 {
        std::mem::take(
            &mut self
                .window
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .suppressed,
        )
    }
}

/// Rate limits per key (a librdkafka log facility, a dead-letter kind):
/// each key has its own window. At most `max_keys` keys are tracked;
/// lines of further keys share one window, so memory stays bounded.
#[derive(Debug)]
pub struct KeyedLogLimit {
    interval: Duration,
    max_keys: usize,
    windows: Mutex<HashMap<String, Window>>,
    overflow: Mutex<Window>,
}

impl KeyedLogLimit {
    pub fn new(interval: Duration, max_keys: usize) -> KeyedLogLimit {
        KeyedLogLimit {
            interval,
            max_keys,
            windows: Mutex::new(HashMap::new()),
            overflow: Mutex::new(Window::default()),
        }
    }

    /// [`LogLimit::check_at`] for lines of `key`.
    pub fn check_at(&self, key: &str, now: Instant) -> Option<u64> {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = windows.get_mut(key) {
            return w.check(self.interval, now);
        }
        if windows.len() < self.max_keys {
            let mut w = Window::default();
            let verdict = w.check(self.interval, now);
            windows.insert(key.to_owned(), w);
            return verdict;
        }
        drop(windows);
        self.overflow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check(self.interval, now)
    }

    /// [`Self::check_at`] with the current time.
    pub fn check(&self, key: &str) -> Option<u64> {
        self.check_at(key, Instant::now())
    }

    /// Every key with lines left out since its last logged one, and how
    /// many; the counts start over.
    pub fn take_suppressed(&self) -> Vec<(String, u64)> {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<(String, u64)> = windows
            .iter_mut()
            .filter(|(_, w)| w.suppressed > 0)
            .map(|(k, w)| (k.clone(), std::mem::take(&mut w.suppressed)))
            .collect();
        let mut overflow = self.overflow.lock().unwrap_or_else(PoisonError::into_inner);
        if overflow.suppressed > 0 {
            out.push((String::new(), std::mem::take(&mut overflow.suppressed)));
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn first_at_once_then_one_per_interval_with_the_count_left_out() {
        let limit = LogLimit::new(10 * SEC);
        let t0 = Instant::now();
        assert_eq!(limit.check_at(t0), Some(0));
        // 30 a second for 10 s: all left out, all counted.
        for i in 1..300u32 {
            assert_eq!(limit.check_at(t0 + i * SEC / 30), None, "{i}");
        }
        assert_eq!(limit.check_at(t0 + 10 * SEC), Some(299));
        assert_eq!(limit.check_at(t0 + 11 * SEC), None);
        assert_eq!(limit.take_suppressed(), 1);
        assert_eq!(limit.take_suppressed(), 0);
        // Quiet for longer than the interval: the next one is logged.
        assert_eq!(limit.check_at(t0 + 60 * SEC), Some(0));
    }

    #[test]
    fn a_clock_going_backwards_does_not_open_a_window() {
        let limit = LogLimit::new(10 * SEC);
        let t0 = Instant::now() + 100 * SEC;
        assert_eq!(limit.check_at(t0), Some(0));
        assert_eq!(limit.check_at(t0 - 5 * SEC), None);
    }

    #[test]
    fn keys_have_windows_of_their_own_and_memory_is_bounded() {
        let limit = KeyedLogLimit::new(10 * SEC, 2);
        let t0 = Instant::now();
        assert_eq!(limit.check_at("FAIL", t0), Some(0));
        assert_eq!(limit.check_at("ERROR", t0), Some(0));
        assert_eq!(limit.check_at("FAIL", t0 + SEC), None);
        assert_eq!(limit.check_at("FAIL", t0 + 2 * SEC), None);
        // A third key shares the overflow window with any further one.
        assert_eq!(limit.check_at("OTHER", t0 + SEC), Some(0));
        assert_eq!(limit.check_at("MORE", t0 + 2 * SEC), None);
        assert_eq!(
            limit.take_suppressed(),
            vec![(String::new(), 1), ("FAIL".to_owned(), 2)]
        );
        assert_eq!(limit.check_at("FAIL", t0 + 10 * SEC), Some(0));
    }
}
