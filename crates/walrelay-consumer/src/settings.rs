//! The consumer loop's settings: batch bounds, the connection pool, retries
//! and what to do with a record that keeps failing.

use std::time::Duration;

/// What the loop does with a record whose handler still fails after the
/// last attempt (a *poison* record), or a record without walrelay headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnPoison {
    /// Stop that partition: it is paused, nothing of it or after it is
    /// applied or committed, the other partitions go on, and
    /// [`crate::ConsumerLoop::run`] returns [`crate::LoopError::Stopped`]
    /// at shutdown (a non-zero exit for a service that propagates it). A
    /// restart (or a rebalance that gives the partition to another member)
    /// tries the record again.
    #[default]
    Stop,
    /// Park the record in `walrelay_consumer_parked` (see
    /// [`crate::parked`]) **in the same transaction that raises the mark
    /// past it**, then go on with the next record. It is never lost and
    /// never applied twice; [`crate::parked::redrive`] applies it later.
    Park,
}

impl std::str::FromStr for OnPoison {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stop" => Ok(OnPoison::Stop),
            "park" => Ok(OnPoison::Park),
            other => Err(format!("unknown poison policy {other:?} (stop or park)")),
        }
    }
}

/// Exponential backoff between attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts of a failing handler before [`OnPoison`] decides (at least
    /// 1), per record. Database outages ([`crate::outage`]: a lost
    /// connection, a server shutting down) do not count: they are retried
    /// until the database is back. Other database errors of a batch do.
    pub attempts: u32,
    /// The wait after the first failure; it doubles with each failure.
    pub base: Duration,
    /// The longest wait.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The wait after `failures` consecutive failures (1 = the first).
    pub fn backoff(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(31);
        self.base
            .checked_mul(1u32 << shift)
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

/// Settings of [`crate::ConsumerLoop`]. `Settings::default()` is right for
/// most services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// At most this many records in one batch transaction.
    pub max_batch_records: usize,
    /// At most this many bytes of payload, key and headers in one batch
    /// (a single larger record still makes a batch of its own).
    pub max_batch_bytes: usize,
    /// How long an idle partition waits for more records before applying
    /// a batch that is not full. Zero (the default) applies at once: a
    /// lone record is applied immediately, and batches grow by themselves
    /// while the previous batch of the partition is being applied.
    pub batch_linger: Duration,
    /// Database connections in the pool: at most this many partitions
    /// apply a batch at the same time.
    pub pool_size: usize,
    /// Retries of failing batches.
    pub retry: RetryPolicy,
    /// What to do with a poison record.
    pub on_poison: OnPoison,
    /// Interval between asynchronous offset commits while records flow.
    pub commit_interval: Duration,
    /// Prepare the statements on the marks once per connection (the
    /// default) rather than send them unnamed in every batch, which makes
    /// the server parse and plan each of them again: on small batches
    /// that costs about as much database CPU as the marks' work itself.
    /// Turn it off behind a pooler that does not keep prepared statements
    /// with the session, such as PgBouncer in transaction mode before
    /// 1.21 (or without `max_prepared_statements`).
    pub prepared_statements: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_batch_records: 1000,
            max_batch_bytes: 4 << 20,
            batch_linger: Duration::ZERO,
            pool_size: 4,
            retry: RetryPolicy::default(),
            on_poison: OnPoison::Stop,
            commit_interval: Duration::from_secs(1),
            prepared_statements: true,
        }
    }
}

impl Settings {
    /// The settings with every bound at least 1 (a zero would stall).
    pub(crate) fn normalized(mut self) -> Settings {
        self.max_batch_records = self.max_batch_records.max(1);
        self.max_batch_bytes = self.max_batch_bytes.max(1);
        self.pool_size = self.pool_size.max(1);
        self.retry.attempts = self.retry.attempts.max(1);
        self.commit_interval = self.commit_interval.max(Duration::from_millis(1));
        self
    }

    /// Records queued per partition before it is paused in Kafka: two
    /// batches, so the next batch is ready while one is applied.
    pub(crate) fn queue_records(&self) -> usize {
        self.max_batch_records.saturating_mul(2)
    }

    /// Bytes queued per partition before it is paused.
    pub(crate) fn queue_bytes(&self) -> usize {
        self.max_batch_bytes.saturating_mul(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(4), Duration::from_millis(800));
        assert_eq!(p.backoff(5), Duration::from_secs(1));
        assert_eq!(p.backoff(1000), Duration::from_secs(1));
        assert_eq!(p.backoff(0), Duration::from_millis(100));
    }

    #[test]
    fn zero_bounds_are_raised() {
        let s = Settings {
            max_batch_records: 0,
            max_batch_bytes: 0,
            pool_size: 0,
            retry: RetryPolicy {
                attempts: 0,
                ..RetryPolicy::default()
            },
            ..Settings::default()
        }
        .normalized();
        assert_eq!(s.max_batch_records, 1);
        assert_eq!(s.max_batch_bytes, 1);
        assert_eq!(s.pool_size, 1);
        assert_eq!(s.retry.attempts, 1);
    }

    #[test]
    fn poison_policy_parses() {
        assert_eq!("park".parse::<OnPoison>(), Ok(OnPoison::Park));
        assert_eq!("stop".parse::<OnPoison>(), Ok(OnPoison::Stop));
        assert!("drop".parse::<OnPoison>().is_err());
    }
}
