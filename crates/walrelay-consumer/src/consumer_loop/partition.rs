//! One assigned partition's state and the pure decisions about it: what to
//! apply next, when to wait, when to pause fetching, what a failure means.
//!
//! ```text
//!            records from Kafka
//!                   │ (queue; read from the partition's own librdkafka
//!                   │  queue only while fewer than two batches wait)
//!                   ▼
//!   ┌──────── Idle ─────────┐  next_step: Apply{take, park} ──► Busy
//!   │   (queue empty, or    │                                   │
//!   │    waiting: backoff,  │ ◄── batch committed (pop, store ──┘
//!   │    linger)            │      offset, raise cached marks)
//!   │                       │ ◄── batch failed (records stay queued,
//!   │                       │      backoff; attempts exhausted →
//!   └───────────────────────┘      park the record, or Stop)
//! ```
//!
//! A batch only ever takes records from the front of the queue, and they
//! leave the queue only when their transaction committed, so the
//! partition's order is strict and a failed batch is retried as it was
//! (or in smaller pieces, to find the record that fails).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use rdkafka::message::{Headers, Message, OwnedMessage};
use walrelay_contract::EventKey;

use crate::apply::Park;
use crate::batch;
use crate::meta::{MetaError, RecordMeta};
use crate::metrics::Phase;
use crate::position::Position;
use crate::settings::{OnPoison, Settings};

/// A record waiting in its partition's queue.
#[derive(Debug)]
pub(crate) struct Queued {
    pub message: OwnedMessage,
    pub meta: Result<RecordMeta, MetaError>,
    pub bytes: usize,
}

impl Queued {
    pub(crate) fn new(message: OwnedMessage) -> Queued {
        let meta = match message.headers() {
            Some(headers) => RecordMeta::from_kafka_headers(headers),
            None => RecordMeta::from_headers(std::iter::empty()),
        };
        let headers = message.headers().map_or(0, |h| {
            h.iter()
                .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                .sum()
        });
        let bytes = message.payload().map_or(0, <[u8]>::len)
            + message.key().map_or(0, <[u8]>::len)
            + headers;
        Queued {
            message,
            meta,
            bytes,
        }
    }
}

/// The failure of the batch at the front of the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failing {
    /// Consecutive handler failures.
    pub failures: u32,
    /// The last error, as text.
    pub error: String,
    /// The failing record's index in the batch, when known.
    pub index: Option<usize>,
    /// The batch's length.
    pub len: usize,
}

/// A cap on the batch size after a batch failed for contention or for
/// its size ([`crate::outage::ErrorClass::Shrink`]): the failed batch's
/// records are retried in batches of at most `max`, halved on each such
/// failure, until `left` of them committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shrink {
    pub max: usize,
    pub left: usize,
}

/// What the partition does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing now (empty, busy, stopped).
    Idle,
    /// Nothing before this moment (backoff, linger).
    WaitUntil(Instant),
    /// Every one of the first `take` records is at or below a cached mark:
    /// store the offset, no transaction.
    Skip { take: usize },
    /// Apply the first `take` records in one transaction; with `park`, the
    /// last of them is parked instead.
    Apply { take: usize, park: Option<Park> },
    /// The front record has no usable walrelay headers: park it alone.
    ParkUnkeyed { error: String },
    /// Stop the partition with this error.
    Stop { error: String },
}

impl PartialEq for Park {
    fn eq(&self, other: &Self) -> bool {
        self.error == other.error && self.attempts == other.attempts
    }
}

impl Eq for Park {}

/// An assigned partition.
#[derive(Debug)]
pub(crate) struct Partition {
    pub position: Position,
    pub queue: VecDeque<Queued>,
    pub queued_bytes: usize,
    /// A batch is in flight.
    pub busy: bool,
    /// Fetching is paused in Kafka.
    pub paused: bool,
    /// Stopped by a poison record (the error).
    pub stopped: Option<String>,
    /// Known marks per source (a lower bound of the stored ones).
    pub marks: BTreeMap<String, EventKey>,
    /// Sources whose mark rows exist.
    pub known: BTreeSet<String>,
    /// The front batch's handler failures.
    pub failing: Option<Failing>,
    /// Handler failures per record (by offset) of the records still
    /// queued: each record has its own attempts, whatever failed around it.
    pub record_failures: BTreeMap<i64, u32>,
    /// Database failures in a row (outage: not counted as attempts).
    pub db_failures: u32,
    /// No batch before this moment.
    pub retry_at: Option<Instant>,
    /// Records left to apply one per transaction, to find the one that
    /// fails in a batch whose handler cannot say which.
    pub isolate: usize,
    /// Batches capped smaller after contention (see [`Shrink`]).
    pub shrink: Option<Shrink>,
    /// Incremented on every assignment, so that a batch of an earlier
    /// assignment is recognized when it completes.
    pub generation: u64,
    /// When the oldest queued record arrived (for the linger).
    pub oldest: Option<Instant>,
    /// The offset of the last record queued (see [`Partition::is_new`]).
    pub last_offset: Option<i64>,
    /// More of the partition's records wait in librdkafka, already
    /// fetched: the loop's last read of its queue ended on the burst
    /// limit, not on an empty queue. A batch does not start short while
    /// this holds (see [`Partition::next_step`]).
    pub more_fetched: bool,
}

impl Partition {
    pub(crate) fn new(position: Position, generation: u64) -> Partition {
        Partition {
            position,
            queue: VecDeque::new(),
            queued_bytes: 0,
            busy: false,
            paused: false,
            stopped: None,
            marks: BTreeMap::new(),
            known: BTreeSet::new(),
            failing: None,
            record_failures: BTreeMap::new(),
            db_failures: 0,
            retry_at: None,
            isolate: 0,
            shrink: None,
            generation,
            oldest: None,
            last_offset: None,
            more_fetched: false,
        }
    }

    pub(crate) fn push(&mut self, record: Queued, now: Instant) {
        if self.queue.is_empty() {
            self.oldest = Some(now);
        }
        self.queued_bytes += record.bytes;
        self.last_offset = Some(record.message.offset());
        self.queue.push_back(record);
    }

    /// Takes the first `take` records out of the queue (for a batch).
    pub(crate) fn take(&mut self, take: usize) -> Vec<Queued> {
        let records: Vec<Queued> = self.queue.drain(..take.min(self.queue.len())).collect();
        self.queued_bytes -= records.iter().map(|r| r.bytes).sum::<usize>();
        records
    }

    /// Puts the records of a failed batch back at the front.
    pub(crate) fn put_back(&mut self, records: Vec<Queued>) {
        for record in records.into_iter().rev() {
            self.queued_bytes += record.bytes;
            self.queue.push_front(record);
        }
    }

    /// Whether two batches are waiting: no more records should come in.
    pub(crate) fn is_full(&self, s: &Settings) -> bool {
        self.queue.len() >= s.queue_records() || self.queued_bytes >= s.queue_bytes()
    }

    /// Whether the loop takes records from the partition's own librdkafka
    /// queue: fewer than two batches wait and it is not stopped. Not
    /// reading a full partition's queue is its flow control: librdkafka
    /// stops fetching it at its own per-partition limits
    /// (`queued.min.messages`, `queued.max.messages.kbytes`), without the
    /// discard and refetch of a pause, and a partition waiting for a retry
    /// keeps what it prefetched.
    pub(crate) fn wants_records(&self, s: &Settings) -> bool {
        self.stopped.is_none() && !self.is_full(s)
    }

    /// Whether a record at `offset` is new to the partition: above every
    /// record queued so far in this assignment (librdkafka delivers a
    /// partition's records in order; one delivered twice, by whichever
    /// queue, is dropped).
    pub(crate) fn is_new(&self, offset: i64) -> bool {
        self.last_offset.is_none_or(|last| offset > last)
    }

    /// Whether fetching should pause (a partition without a queue of its
    /// own, whose records come through the consumer's main queue): two
    /// batches are waiting.
    pub(crate) fn should_pause(&self, s: &Settings) -> bool {
        !self.paused && self.is_full(s)
    }

    /// Whether fetching should resume: at most one batch is waiting.
    pub(crate) fn should_resume(&self, s: &Settings) -> bool {
        self.paused
            && self.stopped.is_none()
            && self.queue.len() <= s.max_batch_records
            && self.queued_bytes <= s.max_batch_bytes
    }

    /// What the partition is waiting for, after the loop started what it
    /// could (see [`Phase`]).
    pub(crate) fn phase(&self, s: &Settings, now: Instant) -> Phase {
        if self.stopped.is_some() {
            Phase::Stopped
        } else if self.busy {
            Phase::InFlight
        } else if self.queue.is_empty() {
            if self.paused {
                Phase::Paused
            } else {
                Phase::Polling
            }
        } else if self.retry_at.is_some_and(|at| at > now)
            || (self.failing.is_none()
                && !s.batch_linger.is_zero()
                && self.queue.len() < s.max_batch_records
                && self.oldest.is_some_and(|o| o + s.batch_linger > now))
        {
            Phase::Backoff
        } else if self.is_filling(s) {
            Phase::Polling
        } else {
            // Ready: only a connection is missing.
            Phase::Pool
        }
    }

    /// Whether the partition fills its next batch from what librdkafka
    /// already fetched before starting it (see [`Partition::next_step`]);
    /// its phase then is [`Phase::Polling`]. One rule for both, so that
    /// the time breakdown names the wait the loop makes.
    /// A full partition is not read (see [`Partition::wants_records`]),
    /// so it never waits to fill: a lone record of twice
    /// `max_batch_bytes` would wait for ever.
    fn is_filling(&self, s: &Settings) -> bool {
        self.more_fetched
            && !self.is_full(s)
            && self.queue.len() < s.max_batch_records
            && self.failing.is_none()
            && self.isolate == 0
            && self.shrink.is_none()
    }

    /// Raises the cached marks.
    pub(crate) fn learn(&mut self, marks: &BTreeMap<String, EventKey>) {
        for (source, key) in marks {
            self.known.insert(source.clone());
            let mark = self.marks.entry(source.clone()).or_insert(*key);
            *mark = (*mark).max(*key);
        }
    }

    /// Whether the mark rows of every source of the first `take` records
    /// are known to exist.
    pub(crate) fn knows_sources(&self, take: usize) -> bool {
        self.queue.iter().take(take).all(|r| {
            r.meta
                .as_ref()
                .is_ok_and(|m| self.known.contains(&m.source))
        })
    }

    /// What to do next (see [`Step`]).
    pub(crate) fn next_step(&self, s: &Settings, now: Instant) -> Step {
        if self.busy || self.stopped.is_some() {
            return Step::Idle;
        }
        let Some(front) = self.queue.front() else {
            return Step::Idle;
        };
        if let Some(at) = self.retry_at.filter(|at| *at > now) {
            return Step::WaitUntil(at);
        }
        if let Err(e) = &front.meta {
            let error = format!(
                "record {}/{} at offset {}: {e}",
                self.position.topic,
                self.position.partition,
                front.message.offset()
            );
            return match s.on_poison {
                OnPoison::Park => Step::ParkUnkeyed { error },
                OnPoison::Stop => Step::Stop { error },
            };
        }
        let mut take = 0;
        let mut bytes = 0;
        for record in &self.queue {
            if record.meta.is_err()
                || take == s.max_batch_records
                || (take > 0 && bytes + record.bytes > s.max_batch_bytes)
            {
                break;
            }
            take += 1;
            bytes += record.bytes;
        }
        if self.isolate > 0 {
            take = 1;
        }
        if let Some(shrink) = self.shrink {
            take = take.min(shrink.max);
        }
        if let Some(f) = self
            .failing
            .as_ref()
            .filter(|f| f.failures >= s.retry.attempts)
        {
            let poison = match f.index {
                Some(i) => Some(i),
                None if f.len <= 1 => Some(0),
                // Find the failing record: one per transaction.
                None => None,
            };
            match poison {
                Some(i) => {
                    let offset = self
                        .queue
                        .get(i)
                        .map_or(-1, |record| record.message.offset());
                    let error = format!(
                        "record {}/{} at offset {offset} failed {} times: {}",
                        self.position.topic, self.position.partition, f.failures, f.error
                    );
                    return match s.on_poison {
                        OnPoison::Park => Step::Apply {
                            take: i + 1,
                            park: Some(Park {
                                error: f.error.clone(),
                                attempts: f.failures,
                            }),
                        },
                        // Apply what precedes the poison record first.
                        OnPoison::Stop if i > 0 => Step::Apply {
                            take: i,
                            park: None,
                        },
                        OnPoison::Stop => Step::Stop { error },
                    };
                }
                None => take = 1,
            }
        }
        // Under a backlog, a batch takes what is already fetched up to
        // `max_batch_records` before it starts: the loop reads a few
        // records per partition and turn (so that its batches in flight are
        // served promptly), and starting on a part of them would make many
        // small transactions, each paying its round trips and its `COMMIT`.
        // Waits no longer than the loop's next turn: it reads the queue
        // again at once, and a burst that ended exactly on the read limit
        // (nothing more fetched) then starts its batch without waiting
        // for a timer.
        if take == self.queue.len() && self.is_filling(s) {
            return Step::WaitUntil(now);
        }
        if take < s.max_batch_records
            && !s.batch_linger.is_zero()
            && self.failing.is_none()
            && self.shrink.is_none()
        {
            if let Some(oldest) = self.oldest {
                let due = oldest + s.batch_linger;
                if due > now {
                    return Step::WaitUntil(due);
                }
            }
        }
        let cached = batch::plan(
            &self.marks,
            self.queue
                .iter()
                .take(take)
                .filter_map(|r| r.meta.as_ref().ok()),
        );
        if cached.is_all_duplicates() {
            return Step::Skip { take };
        }
        Step::Apply { take, park: None }
    }

    /// After a committed batch of `take` records.
    pub(crate) fn committed(&mut self, take: usize, now: Instant) {
        // A known poison record after the committed ones keeps its
        // failures (the records before it were applied first).
        self.failing = self.failing.take().and_then(|mut f| match f.index {
            Some(i) if i >= take => {
                f.index = Some(i - take);
                f.len = f.len.saturating_sub(take);
                Some(f)
            }
            _ => None,
        });
        self.db_failures = 0;
        self.retry_at = None;
        self.isolate = self.isolate.saturating_sub(take);
        self.shrink = self.shrink.and_then(|c| {
            let left = c.left.saturating_sub(take);
            (left > 0).then_some(Shrink { left, ..c })
        });
        self.oldest = (!self.queue.is_empty()).then_some(now);
        // The committed records' failures go with them.
        match self.queue.front().map(|r| r.message.offset()) {
            Some(first) => self.record_failures.retain(|&offset, _| offset >= first),
            None => self.record_failures.clear(),
        }
    }

    /// After a handler failure of a batch of `len` records, put back at
    /// the front of the queue (`index`: the failing record, when known).
    /// Returns the failures that count: the failing record's own when it is
    /// known, else the batch's in a row.
    pub(crate) fn handler_failed(
        &mut self,
        error: String,
        index: Option<usize>,
        len: usize,
        s: &Settings,
        now: Instant,
    ) -> u32 {
        let index = index.or((len == 1).then_some(0));
        let failures = match index.and_then(|i| self.queue.get(i)) {
            Some(record) => {
                let count = self
                    .record_failures
                    .entry(record.message.offset())
                    .or_insert(0);
                *count += 1;
                *count
            }
            None => {
                self.failing
                    .as_ref()
                    .filter(|f| f.index.is_none())
                    .map_or(0, |f| f.failures)
                    + 1
            }
        };
        if failures >= s.retry.attempts && index.is_none() && len > 1 {
            // The batch cannot say which record fails: apply its records
            // one per transaction, each with its own attempts.
            self.isolate = len;
            self.failing = None;
            self.retry_at = None;
            return failures;
        }
        self.failing = Some(Failing {
            failures,
            error,
            index,
            len,
        });
        self.retry_at = Some(now + s.retry.backoff(failures));
        failures
    }

    /// After a batch of `len` records failed for contention or for its
    /// size ([`crate::outage::ErrorClass::Shrink`]). A batch of several is
    /// retried at half its size without counting an attempt (returns
    /// `None`); a batch of one counts it, like a handler failure of that
    /// record (returns the record's failures).
    pub(crate) fn contended(
        &mut self,
        error: String,
        len: usize,
        s: &Settings,
        now: Instant,
    ) -> Option<u32> {
        if len <= 1 {
            return Some(self.handler_failed(error, Some(0), 1, s, now));
        }
        let left = self.shrink.map_or(len, |c| c.left.max(len));
        self.shrink = Some(Shrink {
            max: (len / 2).max(1),
            left,
        });
        self.retry_at = Some(now + s.retry.backoff(1));
        None
    }

    /// After a database failure (outage): retried until it works, with
    /// backoff, without counting as an attempt. Returns the failures in a
    /// row.
    pub(crate) fn db_failed(&mut self, s: &Settings, now: Instant) -> u32 {
        self.db_failures += 1;
        self.retry_at = Some(now + s.retry.backoff(self.db_failures));
        self.db_failures
    }

    /// The backoff left, for logs.
    pub(crate) fn backoff_left(&self, now: Instant) -> Duration {
        self.retry_at
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests;
