//! A ready-made Kafka consumer loop around [`PgHwmStore::process`].
//!
//! [`ConsumerLoop`] subscribes to topics in a consumer group and, for each
//! record, in order:
//!
//! 1. parses the walrelay headers ([`RecordMeta`]);
//! 2. skips it without a database round trip when its key is at or below a
//!    cached high-water mark (the cache is loaded when partitions are
//!    assigned and updated as records are processed; marks only grow, so a
//!    cached mark is a safe lower bound);
//! 3. otherwise runs [`PgHwmStore::process`]: the handler and the new mark
//!    commit in one transaction, under the mark row's lock;
//! 4. stores the record's offset for the next commit.
//!
//! Offsets are committed **after** processing: every `commit_interval`
//! (asynchronously), synchronously when partitions are revoked, and
//! synchronously at shutdown. If the process dies between the database
//! commit and the offset commit, the record is delivered again and skipped
//! as a duplicate by its mark: that window is what the marks are for.
//!
//! Records are processed strictly one after another per loop (all assigned
//! partitions share one loop). For more throughput run more loops (more
//! group members, more partitions). A handler that takes longer than
//! `max.poll.interval.ms` gets the member removed from the group; its
//! partitions move on and the transaction in progress still commits or
//! not as a whole, so exactly-once holds, but the work may be wasted.
//!
//! Rebalance callbacks run inside the consumer's poll (the `recv` of this
//! loop), never while a record is in progress: the revoke callback commits
//! the stored offsets synchronously (briefly blocking that runtime
//! thread), the assign callback queues the new partitions, whose marks are
//! loaded before the next record is processed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
use tokio::sync::watch;
use tokio_postgres::{Client, Transaction};
use walrelay::key::EventKey;

use crate::meta::{MetaError, RecordMeta};
use crate::metrics::Counters;
use crate::store::{Outcome, PgHwmStore, Position, ProcessError};

/// Settings the loop depends on, and the value it requires.
const REQUIRED: &[(&str, &str)] = &[
    // Offsets are committed by the loop, after processing.
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    // Never see records of aborted Kafka transactions.
    ("isolation.level", "read_committed"),
];

/// Defaults the caller may override.
const DEFAULTS: &[(&str, &str)] = &[
    // A new group starts at the beginning: every retained event is
    // processed once.
    ("auto.offset.reset", "earliest"),
];

/// The default interval between asynchronous offset commits.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// A record handed to the loop's handler.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    /// The Kafka record.
    pub message: &'a BorrowedMessage<'a>,
    /// Its walrelay metadata.
    pub meta: &'a RecordMeta,
    /// Group, topic and partition.
    pub position: &'a Position,
}

impl Delivery<'_> {
    /// The record's value (`None` for a tombstone).
    pub fn payload(&self) -> Option<&[u8]> {
        self.message.payload()
    }

    /// The record's Kafka key (`None` for a keyless record).
    pub fn key(&self) -> Option<&[u8]> {
        self.message.key()
    }

    /// The record's offset.
    pub fn offset(&self) -> i64 {
        self.message.offset()
    }
}

/// Why a [`ConsumerLoop`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `group.id` is not set: the marks are kept per consumer group.
    #[error(
        "the Kafka configuration has no group.id (high-water marks are kept per consumer group)"
    )]
    MissingGroupId,
    /// No topics to subscribe to.
    #[error("no topics to consume")]
    NoTopics,
    /// A setting conflicts with what the loop relies on.
    #[error(
        "the Kafka setting {key}={value} conflicts with the consumer loop, which needs \
         {key}={required} (offsets are stored and committed only after processing)"
    )]
    Conflict {
        /// The setting.
        key: &'static str,
        /// The value given.
        value: String,
        /// The value the loop needs.
        required: &'static str,
    },
    /// rdkafka refused the configuration.
    #[error("creating the Kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
}

/// Why [`ConsumerLoop::run`] stopped before a shutdown was requested.
///
/// In every case the failing record was not committed (neither its side
/// effects nor its offset): a restarted loop gets it again.
#[derive(Debug, thiserror::Error)]
pub enum LoopError<E> {
    /// Subscribing failed.
    #[error("subscribing to {topics:?}: {source}")]
    Subscribe {
        /// The topics.
        topics: Vec<String>,
        /// The Kafka error.
        source: KafkaError,
    },
    /// A record without usable walrelay headers.
    #[error("record {topic}/{partition} at offset {offset}: {source}")]
    Meta {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// What is wrong with its headers.
        source: MetaError,
    },
    /// Processing a record failed (handler or database).
    #[error("record {topic}/{partition} at offset {offset} (key {key}) was not processed")]
    Process {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// Its idempotency key.
        key: EventKey,
        /// The handler's or the database's error.
        source: ProcessError<E>,
    },
    /// Loading the marks of newly assigned partitions failed.
    #[error("loading high-water marks for {partitions:?}: {source}")]
    LoadHwm {
        /// The assigned partitions.
        partitions: Vec<(String, i32)>,
        /// The database error.
        source: tokio_postgres::Error,
    },
}

/// A rebalance seen by the context, applied by the loop.
#[derive(Debug)]
enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

/// The consumer context: commits on revoke, queues assignments.
struct LoopContext {
    events: Mutex<Vec<RebalanceEvent>>,
}

impl LoopContext {
    fn push(&self, event: RebalanceEvent) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }

    fn take(&self) -> Vec<RebalanceEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl ClientContext for LoopContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "{fac}: {log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "{fac}: {log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "{fac}: {log_message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "{fac}: {log_message}"),
        }
    }
}

impl ConsumerContext for LoopContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            // No record is in progress: callbacks run inside `recv`, and
            // the loop processes records between its calls to `recv`.
            commit_sync(consumer, "partitions revoked");
            let revoked = partitions(tpl);
            tracing::info!(?revoked, "partitions revoked");
            self.push(RebalanceEvent::Revoked(revoked));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let assigned = partitions(tpl);
                tracing::info!(?assigned, "partitions assigned");
                self.push(RebalanceEvent::Assigned(assigned));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!("rebalance error: {e}"),
        }
    }
}

/// Commits the stored offsets synchronously; "nothing to commit" is fine.
fn commit_sync<C: Consumer<LoopContext>>(consumer: &C, why: &str) {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => tracing::debug!("offsets committed ({why})"),
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        // The record will be redelivered and skipped by its mark.
        Err(e) => tracing::warn!("committing offsets ({why}) failed: {e}"),
    }
}

/// A consumer-group loop that processes every walrelay record exactly once
/// into PostgreSQL. See the [module docs](self).
pub struct ConsumerLoop {
    consumer: StreamConsumer<LoopContext>,
    topics: Vec<String>,
    group: String,
    store: PgHwmStore,
    client: Client,
    commit_interval: Duration,
}

impl std::fmt::Debug for ConsumerLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerLoop")
            .field("topics", &self.topics)
            .field("group", &self.group)
            .field("commit_interval", &self.commit_interval)
            .finish_non_exhaustive()
    }
}

impl ConsumerLoop {
    /// A loop over `topics` with the Kafka settings in `kafka` (at least
    /// `bootstrap.servers` and `group.id`), keeping marks through `store`
    /// on `client`.
    ///
    /// It sets `enable.auto.commit=false`, `enable.auto.offset.store=false`
    /// and `isolation.level=read_committed` (refusing other values for
    /// them), and `auto.offset.reset=earliest` unless `kafka` sets it. The
    /// marks table must exist ([`crate::migrate`]).
    pub fn new(
        kafka: ClientConfig,
        topics: &[&str],
        store: PgHwmStore,
        client: Client,
    ) -> Result<ConsumerLoop, ConfigError> {
        let mut kafka = kafka;
        let group = kafka
            .get("group.id")
            .filter(|g| !g.is_empty())
            .ok_or(ConfigError::MissingGroupId)?
            .to_owned();
        if topics.is_empty() {
            return Err(ConfigError::NoTopics);
        }
        for &(key, required) in REQUIRED {
            match kafka.get(key) {
                Some(value) if !value.eq_ignore_ascii_case(required) => {
                    return Err(ConfigError::Conflict {
                        key,
                        value: value.to_owned(),
                        required,
                    })
                }
                _ => {
                    kafka.set(key, required);
                }
            }
        }
        for &(key, default) in DEFAULTS {
            if kafka.get(key).is_none() {
                kafka.set(key, default);
            }
        }
        let context = LoopContext {
            events: Mutex::new(Vec::new()),
        };
        let consumer: StreamConsumer<LoopContext> = kafka.create_with_context(context)?;
        Ok(ConsumerLoop {
            consumer,
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            group,
            store,
            client,
            commit_interval: DEFAULT_COMMIT_INTERVAL,
        })
    }

    /// Commits offsets asynchronously at most this often while records
    /// flow (default 1 s). Shorter means fewer redeliveries after a crash
    /// or rebalance (each costs one mark lookup), longer means fewer commit
    /// requests.
    #[must_use]
    pub fn with_commit_interval(mut self, interval: Duration) -> ConsumerLoop {
        self.commit_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The counters of the loop's store.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(self.store.counters())
    }

    /// The consumer group (`group.id`).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Subscribes and processes records with `handler` until `shutdown`
    /// becomes `true` (or its sender is dropped), or an error occurs.
    ///
    /// `handler` runs inside the processing transaction
    /// ([`PgHwmStore::process`]) once per new record, never for a
    /// duplicate. An error from it (or from the database, or a record
    /// without walrelay headers) stops the loop and is returned: the record
    /// is neither committed nor its offset stored, so it comes again after
    /// a restart. Handle poison records inside the handler (e.g. write
    /// them to a dead-letter table and return `Ok`) if they must not stop
    /// the service.
    ///
    /// Shutdown: stops fetching, finishes the record in progress, commits
    /// the stored offsets synchronously, and closes the consumer (leaving
    /// the group), on error as well as on request.
    pub async fn run<E, H>(
        self,
        mut handler: H,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), LoopError<E>>
    where
        H: AsyncFnMut(&Transaction<'_>, &Delivery<'_>) -> Result<(), E>,
    {
        let ConsumerLoop {
            consumer,
            topics,
            group,
            store,
            mut client,
            commit_interval,
        } = self;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let result = match consumer.subscribe(&names) {
            Err(source) => Err(LoopError::Subscribe {
                topics: topics.clone(),
                source,
            }),
            Ok(()) => {
                let mut state = LoopState {
                    consumer: &consumer,
                    group: &group,
                    store: &store,
                    client: &mut client,
                    cache: HashMap::new(),
                    stored: false,
                };
                state
                    .run(&mut handler, &mut shutdown, commit_interval)
                    .await
            }
        };
        // Commit and leave the group off the runtime: both block.
        let closed = tokio::task::spawn_blocking(move || {
            commit_sync(&consumer, "shutdown");
            drop(consumer);
        })
        .await;
        if let Err(e) = closed {
            tracing::warn!("closing the Kafka consumer failed: {e}");
        }
        result
    }
}

/// The loop's working state, borrowed from the [`ConsumerLoop`].
struct LoopState<'a> {
    consumer: &'a StreamConsumer<LoopContext>,
    group: &'a str,
    store: &'a PgHwmStore,
    client: &'a mut Client,
    /// Known marks per (topic, partition, source): a lower bound of the
    /// stored ones.
    cache: HashMap<(String, i32, String), EventKey>,
    /// Whether offsets were stored since the last commit.
    stored: bool,
}

impl LoopState<'_> {
    async fn run<E, H>(
        &mut self,
        handler: &mut H,
        shutdown: &mut watch::Receiver<bool>,
        commit_interval: Duration,
    ) -> Result<(), LoopError<E>>
    where
        H: AsyncFnMut(&Transaction<'_>, &Delivery<'_>) -> Result<(), E>,
    {
        let mut ticker = tokio::time::interval(commit_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if *shutdown.borrow_and_update() {
                return Ok(());
            }
            let received = tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        // The sender is gone: nobody can ask any more.
                        return Ok(());
                    }
                    continue;
                }
                _ = ticker.tick() => {
                    self.commit_async();
                    continue;
                }
                received = self.consumer.recv() => received,
            };
            self.apply_rebalances().await?;
            match received {
                Ok(message) => self.handle(&message, handler).await?,
                // librdkafka retries on its own; errors here are reports.
                Err(e) => tracing::warn!("Kafka consumer error: {e}"),
            }
        }
    }

    fn commit_async(&mut self) {
        if !self.stored {
            return;
        }
        self.stored = false;
        match self.consumer.commit_consumer_state(CommitMode::Async) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => tracing::warn!("committing offsets failed: {e}"),
        }
    }

    /// Applies the rebalances the context saw: forgets revoked partitions,
    /// loads the marks of assigned ones.
    async fn apply_rebalances<E>(&mut self) -> Result<(), LoopError<E>> {
        for event in self.consumer.context().take() {
            match event {
                RebalanceEvent::Revoked(revoked) => self
                    .cache
                    .retain(|(t, p, _), _| !revoked.iter().any(|(rt, rp)| rt == t && rp == p)),
                RebalanceEvent::Assigned(assigned) => {
                    let rows = match self.store.load(self.client, self.group, &assigned).await {
                        Ok(rows) => rows,
                        Err(source) => {
                            return Err(LoopError::LoadHwm {
                                partitions: assigned,
                                source,
                            })
                        }
                    };
                    tracing::debug!(marks = rows.len(), "high-water marks loaded");
                    for row in rows {
                        let slot = self
                            .cache
                            .entry((row.topic, row.partition, row.source))
                            .or_insert(row.hwm);
                        *slot = (*slot).max(row.hwm);
                    }
                }
            }
        }
        Ok(())
    }

    async fn handle<E, H>(
        &mut self,
        message: &BorrowedMessage<'_>,
        handler: &mut H,
    ) -> Result<(), LoopError<E>>
    where
        H: AsyncFnMut(&Transaction<'_>, &Delivery<'_>) -> Result<(), E>,
    {
        let meta = RecordMeta::from_message(message).map_err(|source| LoopError::Meta {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            source,
        })?;
        let position = Position::new(self.group, message.topic(), message.partition());
        let cache_key = (
            position.topic.clone(),
            position.partition,
            meta.source.clone(),
        );
        let cached = self.cache.get(&cache_key).copied();
        if cached.is_some_and(|hwm| meta.key <= hwm) {
            Counters::incr(&self.store.counters().duplicates);
            tracing::debug!(
                topic = %position.topic,
                partition = position.partition,
                key = %meta.key,
                "duplicate skipped (cached high-water mark)"
            );
        } else {
            let delivery = Delivery {
                message,
                meta: &meta,
                position: &position,
            };
            let outcome = self
                .store
                .process(self.client, &position, &meta, async |tx| {
                    handler(tx, &delivery).await
                })
                .await
                .map_err(|source| LoopError::Process {
                    topic: position.topic.clone(),
                    partition: position.partition,
                    offset: message.offset(),
                    key: meta.key,
                    source,
                })?;
            let hwm = match outcome {
                Outcome::Processed(()) => meta.key,
                Outcome::Duplicate { hwm } => hwm,
            };
            self.cache.insert(cache_key, hwm);
        }
        // Stores offset + 1: the next record to read.
        match self
            .consumer
            .store_offset(message.topic(), message.partition(), message.offset())
        {
            Ok(()) => self.stored = true,
            // Revoked meanwhile: the new owner skips it by its mark.
            Err(e) => tracing::debug!("storing the offset failed: {e}"),
        }
        Ok(())
    }
}
