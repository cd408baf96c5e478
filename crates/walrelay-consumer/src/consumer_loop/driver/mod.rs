//! The loop itself: poll Kafka into per-partition queues, start a batch
//! wherever a partition is ready and a connection is free, and act on each
//! batch's outcome. The decisions are [`Partition::next_step`]'s; this
//! module does the I/O.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::TopicPartitionList;
use tokio::sync::watch;

mod finish;

use finish::store_offset;

use super::context::{LoopContext, RebalanceEvent};
use super::job::{run_job, Apply, Done, Job, JobKind, TopicPartition};
use super::partition::{Partition, Queued, Step};
use super::phase_clock::PhaseClock;
use super::rejoin::{Fatal, Refusals};
use super::StoppedPartition;
use crate::metrics::LoopMetrics;
use crate::pool::{Database, Pool};
use crate::position::Position;
use crate::settings::Settings;
use crate::store::PgHwmStore;

/// Records taken from librdkafka per queue and wake-up before the loop
/// looks at its batches again. Batches in flight are futures of the
/// loop's task: a database reply waits while the loop copies and parses a
/// burst (~4 µs a record), so a burst stays short.
const POLL_BURST: usize = 16;

/// How long a shutdown waits for the batches in flight.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

pub(super) struct Driver<'a> {
    consumer: &'a Arc<StreamConsumer<LoopContext>>,
    group: &'a str,
    store: &'a PgHwmStore,
    pool: Pool,
    settings: Settings,
    metrics: LoopMetrics,
    partitions: HashMap<TopicPartition, Partition>,
    generation: u64,
    /// Where the next search for a ready partition starts: rotated, so that
    /// with fewer connections than partitions none of them starves.
    cursor: usize,
    stopped: Vec<StoppedPartition>,
    /// Offsets were stored since the last commit.
    stored: bool,
    clock: PhaseClock,
    /// See [`super::ConsumerLoop::with_handler_timeout`].
    handler_timeout: Option<Duration>,
    /// The consumer is dead: the loop ends.
    fatal: Option<Fatal>,
    /// The refusals of the instance id before this consumer, if any.
    refusals: Option<&'a mut Refusals>,
}

/// How a [`Driver`]'s run ended: at the shutdown, or with its consumer
/// dead (its batches in flight finished either way).
pub(super) struct Ended {
    /// The partitions stopped by poison records.
    pub(super) stopped: Vec<StoppedPartition>,
    /// The fatal error, if the consumer died.
    pub(super) fatal: Option<Fatal>,
}

/// A partition's own queue of records.
type PartitionQueue = StreamPartitionQueue<LoopContext>;

/// What woke the loop.
enum Woke<E> {
    Shutdown,
    /// A rebalance, a timer: nothing to act on but the loop's own checks.
    Nothing,
    Tick,
    /// Boxed: one allocation per batch keeps the others small.
    Job(Box<Done<E>>),
    /// From the consumer's main queue: events are served by the poll; a
    /// record comes only for a partition without a queue of its own.
    Main(Result<OwnedMessage, KafkaError>),
    Partition(Result<OwnedMessage, KafkaError>),
}

impl<'a> Driver<'a> {
    pub(super) fn new(
        consumer: &'a Arc<StreamConsumer<LoopContext>>,
        group: &'a str,
        store: &'a PgHwmStore,
        database: Database,
        settings: Settings,
        metrics: LoopMetrics,
        handler_timeout: Option<Duration>,
    ) -> Driver<'a> {
        Driver {
            consumer,
            group,
            store,
            pool: Pool::new(database, settings.pool_size, settings.prepared_statements),
            settings,
            clock: PhaseClock::new(&metrics),
            metrics,
            partitions: HashMap::new(),
            generation: 0,
            cursor: 0,
            stopped: Vec::new(),
            stored: false,
            handler_timeout,
            fatal: None,
            refusals: None,
        }
    }

    /// Reports the first assignment to `refusals` (a consumer made after
    /// the broker refused the instance id).
    pub(super) fn after(mut self, refusals: &'a mut Refusals) -> Driver<'a> {
        self.refusals = Some(refusals);
        self
    }

    /// A consumer error: librdkafka goes on retrying, so it is only
    /// reported, an authorization error as the ACL that is missing; but a
    /// fatal one ends the run ([`super::rejoin`]).
    fn report(&mut self, e: &KafkaError) {
        if let KafkaError::MessageConsumptionFatal(code) = e {
            // The event says only "fatal"; the client knows which error.
            let (code, reason) = self
                .consumer
                .client()
                .fatal_error()
                .unwrap_or_else(|| (*code, e.to_string()));
            tracing::debug!("fatal Kafka consumer error ({code:?}): {reason}");
            self.fatal = Some(Fatal::of(code, reason));
            return;
        }
        let topics: Vec<String> = self
            .consumer
            .subscription()
            .map(|tpl| {
                let mut t: Vec<String> = tpl
                    .elements()
                    .iter()
                    .map(|e| e.topic().to_owned())
                    .collect();
                t.dedup();
                t
            })
            .unwrap_or_default();
        match crate::denied::explain(e, &topics, self.group) {
            Some(message) => tracing::error!("Kafka consumer error: {message}"),
            None => tracing::warn!("Kafka consumer error: {e}"),
        }
    }

    pub(super) async fn run<E, A>(mut self, apply: &A, mut shutdown: watch::Receiver<bool>) -> Ended
    where
        E: std::fmt::Display + 'static,
        A: Apply<E>,
    {
        let consumer = self.consumer;
        // Jobs are concrete futures (not boxed trait objects), so the
        // loop's future is `Send` whenever the handler's futures are.
        let mut jobs = FuturesUnordered::new();
        let mut ready = Vec::new();
        // Each assigned partition's own librdkafka queue.
        let mut queues: HashMap<TopicPartition, PartitionQueue> = HashMap::new();
        let mut ticker = tokio::time::interval(self.settings.commit_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.clock.tick(Instant::now());
            if *shutdown.borrow_and_update() {
                break;
            }
            // Before deciding anything: a revoked partition starts no
            // batch and loses its queue, an assigned one gets its queue.
            self.apply_rebalances(&mut queues);
            // Take what the partitions with room have prefetched.
            self.read_partitions(&queues);
            let wake = self.start_jobs(&mut ready);
            // After batches finished and new records came: a drained
            // partition without a queue of its own resumes fetching.
            self.flow_control(&queues);
            for job in ready.drain(..) {
                jobs.push(run_job(apply, self.store, self.handler_timeout, job));
            }
            let now = Instant::now();
            let settings = &self.settings;
            self.clock
                .snapshot(self.partitions.values().map(|p| p.phase(settings, now)));
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            // The first record of any partition with room for more (the
            // others stay in librdkafka, which stops fetching them).
            let readable: Vec<_> = queues
                .iter()
                .filter(|(tp, _)| {
                    self.partitions
                        .get(*tp)
                        .is_some_and(|p| p.wants_records(&self.settings))
                })
                .map(|(_, q)| Box::pin(async move { q.recv().await.map(|m| m.detach()) }))
                .collect();
            let any_readable = !readable.is_empty();
            let record = async move {
                if readable.is_empty() {
                    std::future::pending().await
                } else {
                    futures_util::future::select_all(readable).await.0
                }
            };
            let woke = tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        Woke::Shutdown
                    } else {
                        Woke::Nothing
                    }
                }
                // A rebalance without a record: acted on at the loop's top.
                () = consumer.context().rebalanced() => Woke::Nothing,
                Some(done) = jobs.next(), if !jobs.is_empty() => Woke::Job(Box::new(done)),
                _ = ticker.tick() => Woke::Tick,
                () = sleep => Woke::Nothing,
                // Polled all the time: serves rebalances and keeps the
                // member in the group (`max.poll.interval.ms`).
                received = consumer.recv() => Woke::Main(received.map(|m| m.detach())),
                received = record, if any_readable => Woke::Partition(received),
            };
            match woke {
                Woke::Shutdown => break,
                Woke::Nothing => {}
                Woke::Tick => self.commit_async(),
                Woke::Job(done) => self.finish(*done),
                Woke::Main(received) => self.main_queue(received, &mut queues),
                Woke::Partition(Ok(message)) => self.enqueue(message),
                Woke::Partition(Err(e)) => self.report(&e),
            }
            if self.fatal.is_some() {
                break;
            }
        }
        self.drain(jobs).await;
        Ended {
            stopped: std::mem::take(&mut self.stopped),
            fatal: self.fatal.take(),
        }
    }

    /// A record (or an error) from the consumer's main queue, and what is
    /// already behind it, taken without waiting.
    fn main_queue(
        &mut self,
        received: Result<OwnedMessage, KafkaError>,
        queues: &mut HashMap<TopicPartition, PartitionQueue>,
    ) {
        self.apply_rebalances(queues);
        match received {
            Ok(message) => {
                self.enqueue(message);
                for _ in 0..POLL_BURST {
                    match self.consumer.recv().now_or_never() {
                        Some(Ok(message)) => {
                            self.apply_rebalances(queues);
                            self.enqueue(message.detach());
                        }
                        Some(Err(e)) => {
                            self.report(&e);
                            break;
                        }
                        None => break,
                    }
                }
                self.apply_rebalances(queues);
            }
            // librdkafka retries on its own; errors here are reports.
            Err(e) => self.report(&e),
        }
    }

    /// At shutdown: finishes the batches in flight (they commit or not as
    /// a whole), waiting at most [`SHUTDOWN_WAIT`].
    async fn drain<E, F>(&mut self, mut jobs: FuturesUnordered<F>)
    where
        E: std::fmt::Display + 'static,
        F: std::future::Future<Output = Done<E>>,
    {
        let drained = tokio::time::timeout(SHUTDOWN_WAIT, async {
            while let Some(done) = jobs.next().await {
                self.finish(done);
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "shutdown: {} batch(es) still in flight after {SHUTDOWN_WAIT:?}, abandoned \
                 (rolled back by the server; redelivered to the next owner)",
                jobs.len()
            );
        }
    }

    /// Copies a polled record into its partition's queue.
    fn enqueue(&mut self, message: OwnedMessage) {
        let tp = (message.topic().to_owned(), message.partition());
        let now = Instant::now();
        let partition = match self.partitions.get_mut(&tp) {
            Some(p) => p,
            None => {
                self.generation += 1;
                let position = Position::new(self.group, tp.0.clone(), tp.1);
                self.partitions
                    .entry(tp)
                    .or_insert_with(|| Partition::new(position, self.generation))
            }
        };
        if partition.stopped.is_some() {
            // Fetched before the pause took effect; it comes again after
            // a restart.
            return;
        }
        if !partition.is_new(message.offset()) {
            tracing::debug!(
                topic = message.topic(),
                partition = message.partition(),
                offset = message.offset(),
                "record delivered again in the same assignment, dropped"
            );
            return;
        }
        partition.push(Queued::new(message), now);
    }

    /// Takes the records already prefetched for each partition with room,
    /// up to two batches queued (a full partition's stay in librdkafka).
    /// Notes whether more is already fetched ([`Partition::more_fetched`]).
    fn read_partitions(&mut self, queues: &HashMap<TopicPartition, PartitionQueue>) {
        for (tp, queue) in queues {
            let mut more = true;
            for _ in 0..POLL_BURST {
                let Some(p) = self.partitions.get(tp) else {
                    break;
                };
                if !p.wants_records(&self.settings) {
                    break;
                }
                match queue.recv().now_or_never() {
                    Some(Ok(message)) => self.enqueue(message.detach()),
                    Some(Err(e)) => {
                        tracing::warn!("Kafka consumer error: {e}");
                        more = false;
                        break;
                    }
                    None => {
                        more = false;
                        break;
                    }
                }
            }
            if let Some(p) = self.partitions.get_mut(tp) {
                p.more_fetched = more;
            }
        }
    }

    /// For partitions without a queue of their own (their records come
    /// through the main queue, which is always polled): pauses those with
    /// two batches waiting, resumes drained ones. Partitions with their own
    /// queue are never paused for flow control: the loop just stops reading
    /// them ([`Partition::wants_records`]).
    fn flow_control(&mut self, queues: &HashMap<TopicPartition, PartitionQueue>) {
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        for (tp, p) in &mut self.partitions {
            if queues.contains_key(tp) {
                continue;
            }
            if p.should_pause(&self.settings) {
                p.paused = true;
                pause.add_partition(&tp.0, tp.1);
            } else if p.should_resume(&self.settings) {
                p.paused = false;
                resume.add_partition(&tp.0, tp.1);
            }
        }
        if pause.count() > 0 {
            self.metrics.pauses.inc_by(pause.count() as u64);
            if let Err(e) = self.consumer.pause(&pause) {
                tracing::warn!("pausing partitions failed: {e}");
            }
        }
        if resume.count() > 0 {
            if let Err(e) = self.consumer.resume(&resume) {
                tracing::warn!("resuming partitions failed: {e}");
            }
        }
    }

    fn apply_rebalances(&mut self, queues: &mut HashMap<TopicPartition, PartitionQueue>) {
        for event in self.consumer.context().take() {
            match event {
                RebalanceEvent::Revoked(revoked) => {
                    for tp in revoked {
                        // Queued records are dropped (not committed: the
                        // next owner reads them); a batch in flight is
                        // recognized as stale by its generation.
                        self.partitions.remove(&tp);
                        queues.remove(&tp);
                    }
                }
                RebalanceEvent::Assigned(assigned) => {
                    let joined = self.refusals.take().and_then(|r| r.joined(Instant::now()));
                    if let Some((waited, attempts)) = joined {
                        tracing::info!(
                            "joined the group {:.1}s after the broker first refused the \
                             instance id ({attempts} refusals)",
                            waited.as_secs_f64()
                        );
                    }
                    for tp in &assigned {
                        // The handle of an earlier assignment first: dropping
                        // it disables the queue's wake-ups, which the new
                        // handle enables again.
                        queues.remove(tp);
                        if let Some(p) = self.partitions.get_mut(tp) {
                            // Known again at the next read of its queue.
                            p.more_fetched = false;
                        }
                        match self.consumer.split_partition_queue(&tp.0, tp.1) {
                            Some(queue) => {
                                queues.insert(tp.clone(), queue);
                            }
                            None => tracing::warn!(
                                topic = %tp.0,
                                partition = tp.1,
                                "no queue of its own for the partition: its records come \
                                 through the main queue, and it is paused while two batches \
                                 wait"
                            ),
                        }
                    }
                    // librdkafka keeps a partition's pause across its
                    // revocation and a new assignment to this member,
                    // while the loop starts it over unpaused: it would
                    // never resume. Assigned partitions start fetching.
                    let mut tpl = TopicPartitionList::new();
                    for tp in &assigned {
                        tpl.add_partition(&tp.0, tp.1);
                    }
                    if let Err(e) = self.consumer.resume(&tpl) {
                        tracing::warn!("resuming the assigned partitions failed: {e}");
                    }
                    for tp in assigned {
                        self.generation += 1;
                        let generation = self.generation;
                        let position = Position::new(self.group, tp.0.clone(), tp.1);
                        self.partitions
                            .entry(tp)
                            .or_insert_with(|| Partition::new(position, generation));
                    }
                }
            }
        }
    }

    /// Starts a job on every ready partition while connections are free.
    /// Returns the earliest moment a waiting partition becomes ready.
    fn start_jobs(&mut self, jobs: &mut Vec<Job>) -> Option<Instant> {
        let now = Instant::now();
        let mut wake: Option<Instant> = None;
        let mut stops = Vec::new();
        let mut order: Vec<&TopicPartition> = self.partitions.keys().collect();
        order.sort_unstable();
        let n = order.len().max(1);
        self.cursor = (self.cursor + 1) % n;
        let order: Vec<TopicPartition> = order
            .iter()
            .cycle()
            .skip(self.cursor)
            .take(order.len())
            .map(|tp| (*tp).clone())
            .collect();
        for tp in order {
            if !self.pool.has_room() {
                break;
            }
            let Some(p) = self.partitions.get_mut(&tp) else {
                continue;
            };
            match p.next_step(&self.settings, now) {
                Step::Idle => {}
                Step::WaitUntil(at) => wake = Some(wake.map_or(at, |w| w.min(at))),
                Step::Skip { take } => {
                    let records = p.take(take);
                    p.committed(take, now);
                    if let Some(last) = records.last() {
                        store_offset(self.consumer, &tp, last.message.offset(), &mut self.stored);
                    }
                    self.store.counters().duplicates.inc_by(take as u64);
                    // More may be ready at once.
                    wake = Some(now);
                }
                Step::Apply { take, park } => {
                    let Some(lease) = self.pool.lease() else {
                        break;
                    };
                    let known = p.knows_sources(take);
                    let records = p.take(take);
                    p.busy = true;
                    jobs.push(Job {
                        lease,
                        position: p.position.clone(),
                        generation: p.generation,
                        records,
                        kind: JobKind::Batch { park, known },
                    });
                }
                Step::ParkUnkeyed { error } => {
                    let Some(lease) = self.pool.lease() else {
                        break;
                    };
                    let records = p.take(1);
                    p.busy = true;
                    jobs.push(Job {
                        lease,
                        position: p.position.clone(),
                        generation: p.generation,
                        records,
                        kind: JobKind::ParkUnkeyed { error },
                    });
                }
                Step::Stop { error } => stops.push((tp, error)),
            }
        }
        for (tp, error) in stops {
            self.stop(&tp, error);
        }
        wake
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
}
