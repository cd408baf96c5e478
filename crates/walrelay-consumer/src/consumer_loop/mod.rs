//! A ready-made Kafka consumer loop: batches per partition, partitions in
//! parallel, poison records and database outages handled without stopping
//! the world.
//!
//! [`ConsumerLoop`] subscribes to topics in a consumer group and:
//!
//! 1. reads each assigned partition from a librdkafka queue of its own
//!    ([`StreamConsumer::split_partition_queue`], split on assignment) into
//!    the partition's queue, parsing the walrelay headers once, but only
//!    while fewer than two batches wait there. A partition that is not
//!    read stops fetching by itself at librdkafka's per-partition limits
//!    (`queued.min.messages`, `queued.max.messages.kbytes`, which the loop
//!    sets low by default), so memory is bounded without pausing, and no
//!    prefetched record is thrown away and fetched again. The consumer's
//!    main queue, which then carries only events (rebalances, errors), is
//!    polled all the time, so the member stays in the group however long a
//!    partition is stuck;
//! 2. whenever a partition has no batch in flight, takes the front of its
//!    queue (up to [`Settings::max_batch_records`] /
//!    [`Settings::max_batch_bytes`]: a lone record at once, larger batches
//!    by themselves while the previous one is applied) and applies it in
//!    **one transaction** on a connection of its own
//!    ([`PgHwmStore::process_batch`]): lock the partition's mark rows, drop
//!    what they already cover, run the handler on the rest, raise the
//!    marks, commit;
//! 3. then stores the offset of the batch's last record; offsets are
//!    committed every [`Settings::commit_interval`], on revocation and at
//!    shutdown. A crash between the database commit and the offset commit
//!    redelivers records that the marks then drop.
//!
//! Partitions are independent: each has at most one batch in flight, on
//! its own connection from a pool of [`Settings::pool_size`], so a slow,
//! failing or blocked partition holds nobody else. Batches of different
//! partitions run concurrently as futures of the loop's task (not spawned
//! tasks), so handlers need not be `Send` or `'static`; the parallelism is
//! the database's.
//!
//! **Failures.**
//! * A handler error rolls the batch back and retries it after a backoff
//!   ([`Settings::retry`]). After the last attempt, [`Settings::on_poison`]
//!   decides for the failing record: stop the partition, or park it in the
//!   dead-letter table in the same transaction that moves the mark past it
//!   ([`crate::parked`]). The per-record handler says which record failed;
//!   for a batch handler the loop finds it by applying the batch one record
//!   per transaction.
//! * A database outage ([`crate::outage`]: a lost connection, a server
//!   shutting down, cannot connect) or a handler error on a connection that
//!   is gone is not a poison record: the connection is replaced and the
//!   batch retried with backoff, for as long as it takes, while the loop
//!   keeps polling. Any other database error of the batch (a constraint
//!   checked at `COMMIT`, a serialization failure, a statement the handler
//!   let fail) counts as an attempt, like a handler error.
//! * Attempts are counted per record, not per batch.
//! * Rebalance events are acted on as they come (the context wakes the
//!   loop), not with the next record.
//! * A record without walrelay headers goes to the same policy, alone.
//! * A consumer librdkafka declares dead (a fatal error) ends the loop
//!   ([`LoopError::Fatal`]), except when the broker refused a static
//!   member's instance id under `group.protocol=consumer`: then the loop
//!   closes it and tries a new one until the broker takes it (`rejoin.rs`).
//!   With that protocol the client-side group settings it does not take are
//!   refused when the loop is built ([`GroupProtocol`]).
//!
//! **Shutdown** stops fetching, waits for the batches in flight, commits
//! the stored offsets synchronously and leaves the group.

mod context;
mod driver;
mod failure;
mod group_protocol;
mod handler_call;
mod job;
mod login;
mod parked_gauge;
mod partition;
mod phase_clock;
mod rejoin;

pub use group_protocol::GroupProtocol;
pub use parked_gauge::PARKED_REFRESH;

use std::sync::Arc;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientConfig;
use tokio::sync::watch;
use tokio_postgres::Transaction;
use walrelay_oauth::plan::OAuthOptions;

use crate::delivery::Delivery;
use crate::metrics::{Counters, LoopMetrics};
use crate::pool::Database;
use crate::settings::Settings;
use crate::store::PgHwmStore;
use context::{commit_sync, LoopContext};
use job::{Apply, PerBatch, PerRecord};
use rejoin::{Fatal, Refusals};

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
    // Statistics feed the consumer-lag gauge.
    ("statistics.interval.ms", "5000"),
    // What librdkafka prefetches, per partition (each has its own queue):
    // about ten batches of the default size, at most 4 MiB (plus one
    // fetch, `fetch.message.max.bytes`, 1 MiB by default), instead of
    // librdkafka's 100,000 records or 64 MiB per partition. The loop's
    // own queue adds at most two batches per partition.
    ("queued.min.messages", "10000"),
    ("queued.max.messages.kbytes", "4096"),
    // A partition whose prefetch is full (the loop does not read it while
    // two batches wait) is checked again this often: librdkafka's default
    // (1 s) would leave a drained partition without records for up to a
    // second.
    ("fetch.queue.backoff.ms", "10"),
];

/// The default interval between asynchronous offset commits.
pub const DEFAULT_COMMIT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// A client-side group setting that Kafka 4's consumer group protocol
    /// (`group.protocol=consumer`) does not take.
    #[error("the Kafka setting {key} is not allowed with group.protocol=consumer: {fix}")]
    NotWithConsumerProtocol {
        /// The setting.
        key: &'static str,
        /// What to do instead.
        fix: &'static str,
    },
    /// rdkafka refused the configuration.
    #[error("creating the Kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// An `OAUTHBEARER` login's settings are refused (the message names
    /// the setting).
    #[error(transparent)]
    Login(#[from] walrelay_oauth::OAuthError),
}

/// A partition stopped by a poison record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoppedPartition {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// What failed, naming the record (offset, attempts, error).
    pub error: String,
}

/// Why [`ConsumerLoop::run`] failed.
///
/// In every case nothing uncommitted was lost: records not applied were
/// neither committed nor had their offsets stored, so they come again.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// Subscribing failed.
    #[error("subscribing to {topics:?}: {source}")]
    Subscribe {
        /// The topics.
        topics: Vec<String>,
        /// The Kafka error.
        source: KafkaError,
    },
    /// Partitions were stopped by poison records (the policy
    /// [`crate::OnPoison::Stop`]); the loop served the others until the
    /// shutdown.
    #[error(
        "{} partition(s) stopped by a record that kept failing: {}; fix the handler or the \
         record and restart (it is retried), or run with the park policy",
        .0.len(),
        .0.iter().map(|p| format!("{}/{}: {}", p.topic, p.partition, p.error)).collect::<Vec<_>>().join("; ")
    )]
    Stopped(Vec<StoppedPartition>),
    /// librdkafka declared the consumer dead (a fatal error) for another
    /// reason than an instance id still in use, which the loop outlasts
    /// (see docs/consumer.md, static membership). Under the classic
    /// protocol: `FencedInstanceId`, another running consumer took this
    /// one's `group.instance.id`. Batches in flight were finished first.
    #[error(
        "the Kafka consumer failed for good ({code:?}): {reason}; {}",
        fatal_advice(.code)
    )]
    Fatal {
        /// librdkafka's error code.
        code: RDKafkaErrorCode,
        /// librdkafka's text.
        reason: String,
    },
    /// A new consumer (after the broker refused the instance id) could not
    /// be created.
    #[error("creating a new Kafka consumer to rejoin the group: {0}")]
    Recreate(KafkaError),
}

fn fatal_advice(code: &RDKafkaErrorCode) -> &'static str {
    match code {
        RDKafkaErrorCode::FencedInstanceId => {
            "another consumer joined the group with this one's group.instance.id: give each \
             running instance its own id"
        }
        _ => "the loop stopped; fix the cause and restart it (nothing uncommitted was lost)",
    }
}

/// A consumer-group loop that applies every walrelay record exactly once
/// into PostgreSQL. See the [module docs](self).
pub struct ConsumerLoop {
    consumer: Arc<StreamConsumer<LoopContext>>,
    /// The consumer's configuration, for a new one after a refusal.
    kafka: ClientConfig,
    /// An `OAUTHBEARER` login's tokens, shared by every consumer made.
    tokens: login::Tokens,
    protocol: GroupProtocol,
    topics: Vec<String>,
    group: String,
    store: PgHwmStore,
    database: Database,
    settings: Settings,
    metrics: LoopMetrics,
    handler_timeout: Option<std::time::Duration>,
}

impl std::fmt::Debug for ConsumerLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerLoop")
            .field("topics", &self.topics)
            .field("group", &self.group)
            .field("protocol", &self.protocol)
            .field("settings", &self.settings)
            .field("handler_timeout", &self.handler_timeout)
            .finish_non_exhaustive()
    }
}

impl ConsumerLoop {
    /// A loop over `topics` with the Kafka settings in `kafka` (at least
    /// `bootstrap.servers` and `group.id`), keeping marks through `store`
    /// in the database that `database` connects to.
    ///
    /// It sets `enable.auto.commit=false`, `enable.auto.offset.store=false`
    /// and `isolation.level=read_committed` (refusing other values for
    /// them), and unless `kafka` sets them `auto.offset.reset=earliest`
    /// and librdkafka's per-partition prefetch bounds
    /// (`queued.min.messages=10000`, `queued.max.messages.kbytes=4096`,
    /// `fetch.queue.backoff.ms=10`; see docs/consumer.md, flow control).
    /// The tables must exist ([`crate::migrate`]).
    ///
    /// `sasl.mechanism=OAUTHBEARER` logs in with walrelay's token
    /// providers, configured with librdkafka's property names (OIDC client
    /// credentials: `sasl.oauthbearer.method=oidc`, ...); AWS MSK IAM is
    /// chosen with [`ConsumerLoop::with_oauth`].
    pub fn new(
        kafka: ClientConfig,
        topics: &[&str],
        store: PgHwmStore,
        database: Database,
    ) -> Result<ConsumerLoop, ConfigError> {
        ConsumerLoop::with_oauth(kafka, topics, store, database, &OAuthOptions::default())
    }

    /// [`ConsumerLoop::new`] with the OAuth options librdkafka has no
    /// property for (`oauth_provider: Some(ProviderName::AwsMskIam)` and
    /// the region, for AWS MSK IAM).
    pub fn with_oauth(
        kafka: ClientConfig,
        topics: &[&str],
        store: PgHwmStore,
        database: Database,
        oauth: &OAuthOptions,
    ) -> Result<ConsumerLoop, ConfigError> {
        let mut kafka = kafka;
        let tokens = login::take_login(&mut kafka, oauth)?;
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
        let protocol = GroupProtocol::of(&kafka)?;
        let metrics = LoopMetrics::default();
        let consumer = create(&kafka, &tokens, &metrics)?;
        Ok(ConsumerLoop {
            consumer,
            kafka,
            tokens,
            protocol,
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            group,
            store,
            database,
            settings: Settings::default(),
            metrics,
            handler_timeout: None,
        })
    }

    /// Bounds each handler call (default: unbounded): each record's call
    /// of a per-record handler, each batch's call of a batch handler. A
    /// call that runs longer fails its batch like a handler error (an
    /// attempt of the retry policy): the call is abandoned, its running
    /// statement cancelled, the transaction rolled back and the connection
    /// discarded. A handler blocked on a lock or a slow remote call then
    /// holds neither its partition nor a connection for ever.
    #[must_use]
    pub fn with_handler_timeout(mut self, timeout: std::time::Duration) -> ConsumerLoop {
        self.handler_timeout = Some(timeout);
        self
    }

    /// Replaces the settings (batch bounds, pool size, retries, poison
    /// policy, commit interval).
    #[must_use]
    pub fn with_settings(mut self, settings: Settings) -> ConsumerLoop {
        self.settings = settings.normalized();
        self
    }

    /// Commits offsets asynchronously at most this often while records
    /// flow (default 1 s).
    #[must_use]
    pub fn with_commit_interval(mut self, interval: std::time::Duration) -> ConsumerLoop {
        self.settings.commit_interval = interval;
        self.settings = self.settings.normalized();
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The counters of the loop's store.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(self.store.counters())
    }

    /// The loop's metrics (register them with
    /// [`LoopMetrics::register`], and the counters with
    /// [`Counters::register`]).
    pub fn metrics(&self) -> LoopMetrics {
        self.metrics.clone()
    }

    /// The consumer group (`group.id`).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The consumer group protocol of the configuration (`group.protocol`).
    pub fn group_protocol(&self) -> GroupProtocol {
        self.protocol
    }

    /// Subscribes and applies records with a **per-record** handler until
    /// `shutdown` becomes `true` (or its sender is dropped).
    ///
    /// `handler` runs inside the batch transaction once per new record, in
    /// order, never for a duplicate; the side effects of the whole batch
    /// and its marks commit together. It must do all its database work
    /// through the transaction and not end it.
    pub async fn run<E, H>(
        self,
        handler: H,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), LoopError>
    where
        E: std::fmt::Display + 'static,
        H: AsyncFn(&Transaction<'_>, &Delivery<'_>) -> Result<(), E>,
    {
        self.run_with(PerRecord(handler), shutdown).await
    }

    /// Like [`ConsumerLoop::run`] with a **batch** handler: called once per
    /// batch with its new records (in order, duplicates already dropped),
    /// so the service can apply them in one statement (a multi-row
    /// `INSERT`, `unnest`, `COPY`).
    pub async fn run_batches<E, H>(
        self,
        handler: H,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), LoopError>
    where
        E: std::fmt::Display + 'static,
        H: AsyncFn(&Transaction<'_>, &[Delivery<'_>]) -> Result<(), E>,
    {
        self.run_with(PerBatch(handler), shutdown).await
    }

    async fn run_with<E, A>(
        self,
        apply: A,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), LoopError>
    where
        E: std::fmt::Display + 'static,
        A: Apply<E>,
    {
        let parked = parked_gauge::refresh(
            self.database.clone(),
            self.group.clone(),
            self.metrics.clone(),
        );
        // The gauge's reads never end: the loop's end drops them.
        tokio::select! {
            biased;
            result = self.consumers(&apply, shutdown) => result,
            never = parked => match never {},
        }
    }

    /// Runs the loop on the consumer, then on a new one each time the broker
    /// refuses the instance id ([`rejoin`]), until the shutdown or another
    /// fatal error.
    async fn consumers<E, A>(
        self,
        apply: &A,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), LoopError>
    where
        E: std::fmt::Display + 'static,
        A: Apply<E>,
    {
        let ConsumerLoop {
            consumer,
            kafka,
            tokens,
            topics,
            group,
            store,
            database,
            settings,
            metrics,
            handler_timeout,
            ..
        } = self;
        let instance_id = kafka.get("group.instance.id").unwrap_or("").to_owned();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let mut consumer = consumer;
        let mut stopped = Vec::new();
        let mut refusals = Refusals::default();
        loop {
            if let Err(source) = consumer.subscribe(&names) {
                close(consumer, false).await;
                return Err(LoopError::Subscribe { topics, source });
            }
            let ended = driver::Driver::new(
                &consumer,
                &group,
                &store,
                database.clone(),
                settings.clone(),
                metrics.clone(),
                handler_timeout,
            )
            .after(&mut refusals)
            .run(apply, shutdown.clone())
            .await;
            // Commit and leave the group, unless the consumer is dead.
            close(consumer, ended.fatal.is_none()).await;
            stopped.extend(ended.stopped);
            let reason = match ended.fatal {
                None => break,
                Some(Fatal::Other { code, reason }) => {
                    return Err(LoopError::Fatal { code, reason });
                }
                Some(Fatal::InstanceIdInUse { reason }) => reason,
            };
            let retry = refusals.refused(std::time::Instant::now(), &instance_id, &reason);
            if let Some(text) = retry.log {
                tracing::warn!("{text}");
            }
            let gone = tokio::select! {
                () = tokio::time::sleep(retry.wait) => false,
                changed = shutdown.changed() => changed.is_err(),
            };
            if gone || *shutdown.borrow() {
                break;
            }
            consumer = create(&kafka, &tokens, &metrics).map_err(LoopError::Recreate)?;
        }
        if stopped.is_empty() {
            Ok(())
        } else {
            Err(LoopError::Stopped(stopped))
        }
    }
}

/// A consumer with the loop's context, which knows its consumer, handed
/// its login's tokens ([`login::Tokens`]).
fn create(
    kafka: &ClientConfig,
    tokens: &login::Tokens,
    metrics: &LoopMetrics,
) -> Result<Arc<StreamConsumer<LoopContext>>, KafkaError> {
    let consumer: Arc<StreamConsumer<LoopContext>> =
        Arc::new(kafka.create_with_context(LoopContext::new(metrics.clone()))?);
    consumer.context().attach(Arc::downgrade(&consumer));
    if let Some(tokens) = tokens {
        tokens.keep_fresh(&consumer)?;
    }
    Ok(consumer)
}

/// Closes a consumer off the runtime (both block): commits the stored
/// offsets first when `commit`, then leaves the group.
async fn close(consumer: Arc<StreamConsumer<LoopContext>>, commit: bool) {
    let closed = tokio::task::spawn_blocking(move || {
        if commit {
            commit_sync(&*consumer, "shutdown");
        }
        drop(consumer);
    })
    .await;
    if let Err(e) = closed {
        tracing::warn!("closing the Kafka consumer failed: {e}");
    }
}
