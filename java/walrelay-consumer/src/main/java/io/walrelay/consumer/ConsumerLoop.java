package io.walrelay.consumer;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A consumer service's loop: reads walrelay records with a
 * {@link KafkaConsumer} and applies each exactly once in the database, one
 * transaction per batch of one partition, with the high-water marks.
 *
 * <p>The KafkaConsumer is single-threaded: this loop's thread polls, queues
 * each record in its partition's queue, and hands at most one batch per
 * partition at a time to a pool of {@link Settings#poolSize()} workers, each
 * on a connection of its own; a worker that finishes wakes the loop. A slow
 * partition holds only its own worker. A partition with two batches queued
 * is paused in Kafka, and resumed when at most one is left. Offsets are
 * stored once a batch committed, committed every
 * {@link Settings#commitInterval()}, on revocation and at the stop.
 */
public final class ConsumerLoop implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");

    final Settings settings;
    final Counters counters = new Counters();
    final ConnectionPool pool;
    LoopMetrics metrics = LoopMetrics.NONE;
    final String group;
    final Map<TopicPartition, PartitionState> parts = new LinkedHashMap<>();
    final Map<TopicPartition, Job> inFlight = new HashMap<>();
    final LinkedBlockingQueue<Job> done = new LinkedBlockingQueue<>();
    private final Map<String, Object> kafkaConfig;
    private final List<String> topics;
    private final Map<TopicPartition, Long> stored = new HashMap<>();
    private final Set<TopicPartition> dirty = new HashSet<>();
    private final Map<TopicPartition, String> stoppedErrors = new LinkedHashMap<>();
    private final AtomicInteger stoppedCount = new AtomicInteger();
    private HandlerScope scope = HandlerScope.DIRECT;
    private volatile boolean stopping;
    private volatile KafkaConsumer<byte[], byte[]> consumer;
    private long lastCommit = System.nanoTime();
    /** With metrics: where the partitions' time goes. */
    private PhaseClock clock;
    private long lastLag = System.nanoTime();
    /** The earliest last arrival of a partition whose batch waits to be filled, or {@code Long.MAX_VALUE}. */
    private long fillingSince = Long.MAX_VALUE;
    /** How often the lag gauges are read from the consumer (librdkafka's statistics interval in the Rust crate). */
    private static final long LAG_INTERVAL_NANOS = TimeUnit.SECONDS.toNanos(5);

    /**
     * @param kafka the Kafka consumer's configuration ({@code bootstrap.servers}, {@code group.id}, ...);
     *     the loop sets {@code enable.auto.commit=false} and byte-array deserializers, and
     *     {@code auto.offset.reset=earliest} unless given
     * @param topics the topics to subscribe to
     * @param dataSource where the batches' connections come from
     * @param settings batch bounds, retries, poison policy, pool size
     */
    public ConsumerLoop(Map<String, Object> kafka, List<String> topics, DataSource dataSource, Settings settings) {
        Map<String, Object> config = new HashMap<>(kafka);
        config.putIfAbsent("auto.offset.reset", "earliest");
        config.put("enable.auto.commit", "false");
        Object groupId = config.get("group.id");
        if (groupId == null || groupId.toString().isEmpty()) {
            throw new IllegalArgumentException("the Kafka configuration needs a group.id: the marks are kept per group");
        }
        this.group = groupId.toString();
        this.kafkaConfig = config;
        this.topics = List.copyOf(topics);
        this.settings = settings;
        this.pool = new ConnectionPool(dataSource);
    }

    /** Runs every handler call in {@code scope} (the Spring module's transaction binding). */
    public ConsumerLoop withHandlerScope(HandlerScope scope) {
        this.scope = scope;
        return this;
    }

    /** Reports metrics into a Micrometer {@code MeterRegistry} (Micrometer must be on the classpath). */
    public ConsumerLoop withMeterRegistry(Object meterRegistry) {
        this.metrics = new MicrometerMetrics((io.micrometer.core.instrument.MeterRegistry) meterRegistry, group, this);
        return this;
    }

    /** The loop's totals (processed, duplicates, gaps, parked, errors). */
    public Counters counters() {
        return counters;
    }

    /** Partitions stopped now (a poison record, a broken handler). */
    public int stoppedPartitions() {
        return stoppedCount.get();
    }

    /** Runs until {@link #stop()} with a batch handler. */
    public void runBatches(BatchHandler handler) throws PartitionsStoppedException {
        runWith(w -> HandlerCalls.perBatch(handler, scope, w));
    }

    /** Runs until {@link #stop()} with a per-record handler. */
    public void run(RecordHandler handler) throws PartitionsStoppedException {
        runWith(w -> HandlerCalls.perRecord(handler, scope, w));
    }

    /** Asks the loop to stop cleanly (from any thread): it finishes the batches in flight and commits. */
    public void stop() {
        stopping = true;
        KafkaConsumer<byte[], byte[]> c = consumer;
        if (c != null) {
            c.wakeup();
        }
    }

    @Override
    public void close() {
        stop();
    }

    private void runWith(Function<HandlerWatchdog, HandlerCalls> make) throws PartitionsStoppedException {
        Duration timeout = settings.handlerTimeout();
        HandlerWatchdog watchdog = timeout == null ? null : new HandlerWatchdog(Math.max(timeout.toMillis(), 1));
        HandlerCalls calls = make.apply(watchdog);
        AtomicInteger n = new AtomicInteger();
        ExecutorService workers = Executors.newFixedThreadPool(settings.poolSize(), r -> {
            Thread t = new Thread(r, "walrelay-worker-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(kafkaConfig, new ByteArrayDeserializer(),
                new ByteArrayDeserializer());
        consumer = c;
        ParkedGauge gauge = metrics == LoopMetrics.NONE ? null : ParkedGauge.start(pool, group, metrics);
        try {
            c.subscribe(topics, new Rebalance(this, c));
            clock = metrics == LoopMetrics.NONE ? null : new PhaseClock(metrics, System.nanoTime());
            while (!stopping) {
                if (clock != null) {
                    clock.snapshot(parts.values(), System.nanoTime());
                }
                ConsumerRecords<byte[], byte[]> records = poll(c);
                if (clock != null) {
                    long now = System.nanoTime();
                    clock.tick(now);
                    reportLag(c, now);
                }
                queue(records);
                drain();
                dispatch(workers, calls);
                flowControl(c);
                maybeCommit(c);
            }
            finishInFlight(settings.revokeWait().toNanos());
            commitSync(c, new HashSet<>(stored.keySet()));
        } finally {
            consumer = null;
            closeQuietly(c);
            workers.shutdownNow();
            if (watchdog != null) {
                watchdog.close();
            }
            if (gauge != null) {
                gauge.close();
            }
            pool.close();
        }
        if (!stoppedErrors.isEmpty()) {
            List<PartitionsStoppedException.Stopped> list = new ArrayList<>();
            stoppedErrors.forEach((tp, e) -> list.add(new PartitionsStoppedException.Stopped(tp.topic(), tp.partition(), e)));
            throw new PartitionsStoppedException(list);
        }
    }

    private ConsumerRecords<byte[], byte[]> poll(KafkaConsumer<byte[], byte[]> c) {
        long wait = 200;
        long now = System.nanoTime();
        for (PartitionState p : parts.values()) {
            if (p.retryAt != null && !p.inFlight && p.stopped == null && !p.queue.isEmpty()) {
                wait = Math.min(wait, Math.max(TimeUnit.NANOSECONDS.toMillis(p.retryAt - now), 0));
            }
        }
        if (fillingSince != Long.MAX_VALUE) {
            long untilStart = fillingSince + PartitionState.FILL_WINDOW_NANOS - now;
            wait = Math.min(wait, Math.max(TimeUnit.NANOSECONDS.toMillis(untilStart), 1));
        }
        if (!dirty.isEmpty()) {
            long untilCommit = settings.commitInterval().toNanos() - (now - lastCommit);
            wait = Math.min(wait, Math.max(TimeUnit.NANOSECONDS.toMillis(untilCommit), 0));
        }
        try {
            return c.poll(Duration.ofMillis(wait));
        } catch (WakeupException e) {
            return ConsumerRecords.empty();
        }
    }

    /** The lag gauges, every {@link #LAG_INTERVAL_NANOS}: the consumer's own view, no request. */
    private void reportLag(KafkaConsumer<byte[], byte[]> c, long now) {
        if (now - lastLag < LAG_INTERVAL_NANOS) {
            return;
        }
        lastLag = now;
        for (TopicPartition tp : parts.keySet()) {
            OptionalLong lag = c.currentLag(tp);
            if (lag.isPresent()) {
                metrics.lag(tp.topic(), tp.partition(), lag.getAsLong());
            }
        }
    }

    private void queue(ConsumerRecords<byte[], byte[]> records) {
        long now = System.nanoTime();
        for (TopicPartition tp : records.partitions()) {
            PartitionState p = parts.get(tp);
            if (p == null) {
                continue;
            }
            for (ConsumerRecord<byte[], byte[]> r : records.records(tp)) {
                p.push(Queued.of(r, p.lastSource), now);
            }
        }
    }

    /** Acts on every finished job. */
    void drain() {
        Job job;
        while ((job = done.poll()) != null) {
            finished(job);
        }
    }

    void finished(Job job) {
        if (clock != null) {
            clock.job(job.connectingNanos, job.handlerNanos, job.totalNanos);
        }
        if (job.abandoned || inFlight.get(job.tp) != job) {
            if (job.result instanceof BatchOutcome o) {
                counters.processed.addAndGet(o.applied());
                counters.duplicates.addAndGet(o.duplicates());
                counters.gaps.addAndGet(o.gaps());
                counters.parked.addAndGet(o.parked() ? 1 : 0);
            }
            return;
        }
        inFlight.remove(job.tp);
        job.p.inFlight = false;
        if (job.result instanceof BatchOutcome && stoppedErrors.remove(job.tp) != null) {
            stoppedCount.decrementAndGet();
            metrics.stopped(job.tp.topic(), job.tp.partition(), false);
        }
        Outcomes.finish(this, job);
    }

    /** Whether the partition's next batch waits to be filled ({@link PartitionState#mayFill}). */
    private boolean filling(TopicPartition tp, PartitionState p, int take, long now) {
        if (!p.mayFill(settings, take, now)) {
            return false;
        }
        KafkaConsumer<byte[], byte[]> c = consumer;
        OptionalLong lag = c == null ? OptionalLong.empty() : c.currentLag(tp);
        return lag.isPresent() && lag.getAsLong() > 0;
    }

    private void dispatch(ExecutorService workers, HandlerCalls calls) {
        long now = System.nanoTime();
        fillingSince = Long.MAX_VALUE;
        for (Map.Entry<TopicPartition, PartitionState> e : parts.entrySet()) {
            TopicPartition tp = e.getKey();
            PartitionState p = e.getValue();
            p.filling = false;
            while (true) {
                Step step = p.nextStep(settings, now);
                if (step instanceof Step.Skip s) {
                    List<Queued> taken = p.take(s.take());
                    counters.duplicates.addAndGet(taken.size());
                    p.committed(taken.size());
                    storeOffset(tp, taken.get(taken.size() - 1).offset());
                    continue;
                }
                if (step instanceof Step.Stop s) {
                    stopPartition(tp, p, s.error());
                } else if (step instanceof Step.Apply a && a.park() == null && filling(tp, p, a.take(), now)) {
                    p.filling = true;
                    fillingSince = Math.min(fillingSince, p.lastArrival);
                } else if ((step instanceof Step.Apply || step instanceof Step.ParkUnkeyed)
                        && inFlight.size() < settings.poolSize()) {
                    Job job = new Job(tp, p, step);
                    p.inFlight = true;
                    inFlight.put(tp, job);
                    workers.execute(() -> {
                        job.run(pool, calls);
                        done.add(job);
                        KafkaConsumer<byte[], byte[]> c = consumer;
                        if (c != null) {
                            c.wakeup();
                        }
                    });
                }
                break;
            }
        }
    }

    private void flowControl(KafkaConsumer<byte[], byte[]> c) {
        List<TopicPartition> pause = new ArrayList<>();
        List<TopicPartition> resume = new ArrayList<>();
        for (Map.Entry<TopicPartition, PartitionState> e : parts.entrySet()) {
            PartitionState p = e.getValue();
            if (!p.paused && (p.stopped != null || p.isFull(settings))) {
                p.paused = true;
                pause.add(e.getKey());
            } else if (p.shouldResume(settings)) {
                p.paused = false;
                resume.add(e.getKey());
            }
        }
        if (!pause.isEmpty()) {
            c.pause(pause);
            metrics.paused();
        }
        if (!resume.isEmpty()) {
            c.resume(resume);
        }
    }

    /** Forgets a partition no longer assigned: its stored offset must never be committed by this member again. */
    void forget(TopicPartition tp) {
        parts.remove(tp);
        stored.remove(tp);
        dirty.remove(tp);
    }

    void storeOffset(TopicPartition tp, long offset) {
        stored.put(tp, offset + 1);
        dirty.add(tp);
    }

    void stopPartition(TopicPartition tp, PartitionState p, String error) {
        p.stopped = error;
        if (stoppedErrors.put(tp, error) == null) {
            stoppedCount.incrementAndGet();
        }
        metrics.stopped(tp.topic(), tp.partition(), true);
        LOG.error("partition {} stopped (nothing of it is applied or committed until a restart): {}", tp, error);
    }

    private void maybeCommit(KafkaConsumer<byte[], byte[]> c) {
        long now = System.nanoTime();
        if (dirty.isEmpty() || now - lastCommit < settings.commitInterval().toNanos()) {
            return;
        }
        Map<TopicPartition, OffsetAndMetadata> offsets = offsets(dirty);
        dirty.clear();
        lastCommit = now;
        c.commitAsync(offsets, (o, e) -> {
            if (e != null) {
                LOG.warn("committing offsets failed (they are only a hint, the marks are the truth): {}", e.toString());
            }
        });
    }

    private Map<TopicPartition, OffsetAndMetadata> offsets(Set<TopicPartition> which) {
        Map<TopicPartition, OffsetAndMetadata> out = new HashMap<>();
        for (TopicPartition tp : which) {
            Long next = stored.get(tp);
            if (next != null) {
                out.put(tp, new OffsetAndMetadata(next));
            }
        }
        return out;
    }

    /** Commits the stored offsets of {@code which} now (a revocation, the stop). */
    void commitSync(KafkaConsumer<byte[], byte[]> c, Set<TopicPartition> which) {
        Map<TopicPartition, OffsetAndMetadata> offsets = offsets(which);
        dirty.removeAll(which);
        if (offsets.isEmpty()) {
            return;
        }
        for (int attempt = 0; attempt < 3; attempt++) {
            try {
                c.commitSync(offsets, Duration.ofSeconds(10));
                return;
            } catch (WakeupException e) {
                // A worker finished meanwhile: try again.
            } catch (RuntimeException e) {
                LOG.warn("committing offsets of {} failed (the marks drop what is delivered again): {}",
                        offsets.keySet(), e.toString());
                return;
            }
        }
    }

    /** Waits up to {@code nanos} for every job in flight, acting on each; the rest are abandoned. */
    void finishInFlight(long nanos) {
        finishInFlight(inFlight.keySet(), nanos);
    }

    /** Waits up to {@code nanos} for the jobs in flight of {@code which}, acting on each; the rest are abandoned. */
    void finishInFlight(Set<TopicPartition> which, long nanos) {
        long deadline = System.nanoTime() + nanos;
        drain();
        while (which.stream().anyMatch(inFlight::containsKey)) {
            long left = deadline - System.nanoTime();
            Job job = null;
            try {
                job = left > 0 ? done.poll(left, TimeUnit.NANOSECONDS) : null;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            if (job == null) {
                abandon(new HashSet<>(which));
                return;
            }
            finished(job);
        }
    }

    /** Gives up on the jobs of {@code which}: they commit or roll back on their own, their offsets are not stored. */
    void abandon(Set<TopicPartition> which) {
        for (TopicPartition tp : which) {
            Job job = inFlight.remove(tp);
            if (job != null) {
                job.abandoned = true;
                LOG.warn("abandoned the batch in flight of {} offsets {}..{}: it commits or rolls back on its own, "
                        + "its records are delivered again and the marks drop what it committed", tp,
                        job.firstOffset(), job.lastOffset());
            }
        }
    }

    private static void closeQuietly(KafkaConsumer<byte[], byte[]> c) {
        try {
            c.close(Duration.ofSeconds(10));
        } catch (RuntimeException e) {
            LOG.warn("closing the Kafka consumer: {}", e.toString());
        }
    }
}
