//! When records reach a topic: a thread that asks the broker for the
//! topic's end offsets every [`EVERY`] and keeps the time each new total
//! was first seen.
//!
//! Why end offsets and not the slot: Debezium confirms a position to
//! PostgreSQL only after Kafka Connect committed an offset at or after it,
//! every `offset.flush.interval.ms` (60 s, Connect's default, in both
//! variants), so the slot's confirmed flush LSN says when Connect last
//! flushed, not when the records were in Kafka. On a single Kafka node
//! with `acks=all`, a partition's end offset (the high watermark) moves
//! when a produce request is acknowledged: records above the start
//! offsets are records Debezium has written. Which events they are, and
//! whether any came twice, the read-back tells ([`super::readback`]).
//!
//! One `ListOffsets` request for all partitions per poll: the broker's
//! CPU, counted in the run, barely notices 40 requests a second.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::env::PARTITIONS;

/// How often the end offsets are asked for.
pub const EVERY: Duration = Duration::from_millis(25);

fn client(bootstrap: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("walrelay-bench-watch-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .create()?)
}

/// The end offset of each partition of `topic` (index = partition).
fn end_offsets(consumer: &BaseConsumer, topic: &str) -> Result<Vec<i64>> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::End)?;
    }
    let got = consumer
        .offsets_for_times(tpl, Duration::from_secs(5))
        .with_context(|| format!("the end offsets of {topic}"))?;
    let mut out = vec![0; PARTITIONS as usize];
    for e in got.elements() {
        out[e.partition() as usize] = match e.offset() {
            Offset::Offset(o) => o,
            // Not an offset (an empty answer): the high watermark, with a
            // request of its own.
            _ => {
                consumer
                    .fetch_watermarks(topic, e.partition(), Duration::from_secs(5))
                    .with_context(|| format!("the high watermark of {topic}/{}", e.partition()))?
                    .1
            }
        };
    }
    if got.count() != PARTITIONS as usize {
        bail!(
            "{topic}: end offsets of {} partitions, {PARTITIONS} asked for",
            got.count()
        );
    }
    Ok(out)
}

/// The end offsets of `topic` now (the start of a run's range). A topic
/// created a moment ago may have no leader yet: retried for up to 30 s.
pub fn current_end_offsets(bootstrap: &str, topic: &str) -> Result<Vec<i64>> {
    let consumer = client(bootstrap)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match end_offsets(&consumer, topic) {
            Ok(ends) => return Ok(ends),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("{e:#}, retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// What the watcher saw so far.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// (records above the start offsets, when that total was first seen),
    /// one entry per change, in time order.
    pub history: Vec<(u64, Instant)>,
    /// The end offsets at the last poll.
    pub ends: Vec<i64>,
    /// The last poll's error, if it failed.
    pub error: Option<String>,
}

impl Seen {
    /// Records above the start offsets at the last poll.
    pub fn count(&self) -> u64 {
        self.history.last().map_or(0, |(n, _)| *n)
    }

    /// When the total first reached `n` records.
    pub fn reached(&self, n: u64) -> Option<Instant> {
        first_reaching(&self.history, n)
    }
}

/// The time of the first entry of `history` with at least `n` records.
pub fn first_reaching(history: &[(u64, Instant)], n: u64) -> Option<Instant> {
    history.iter().find(|(c, _)| *c >= n).map(|(_, at)| *at)
}

/// Watches `topic`'s end offsets from `base` on, on its own thread, until
/// dropped.
pub struct TopicWatch {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TopicWatch {
    pub fn start(bootstrap: &str, topic: &str, base: Vec<i64>) -> Result<TopicWatch> {
        let consumer = client(bootstrap)?;
        let seen = Arc::new(Mutex::new(Seen {
            history: vec![(0, Instant::now())],
            ends: base.clone(),
            error: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, topic) = (seen.clone(), stop.clone(), topic.to_owned());
        let base_total: i64 = base.iter().sum();
        let thread = std::thread::Builder::new()
            .name("bench-dbz-watch".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    let polled = end_offsets(&consumer, &topic);
                    let at = Instant::now();
                    let mut seen = s.lock().expect("lock");
                    match polled {
                        Ok(ends) => {
                            let n = (ends.iter().sum::<i64>() - base_total).max(0) as u64;
                            if n != seen.count() {
                                seen.history.push((n, at));
                            }
                            seen.ends = ends;
                            seen.error = None;
                        }
                        Err(e) => seen.error = Some(format!("{e:#}")),
                    }
                    drop(seen);
                    std::thread::sleep(EVERY);
                }
            })?;
        Ok(TopicWatch {
            seen,
            stop,
            thread: Some(thread),
        })
    }

    /// A copy of what was seen so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for TopicWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_when_a_total_was_reached() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let h = [(0, at(0)), (5, at(10)), (12, at(20)), (20, at(30))];
        assert_eq!(first_reaching(&h, 1), Some(at(10)));
        assert_eq!(first_reaching(&h, 12), Some(at(20)));
        assert_eq!(first_reaching(&h, 13), Some(at(30)));
        assert_eq!(first_reaching(&h, 21), None);
        let seen = Seen {
            history: h.to_vec(),
            ..Default::default()
        };
        assert_eq!(seen.count(), 20);
    }
}
