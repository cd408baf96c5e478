package io.walrelay.consumer.loop;

import io.walrelay.consumer.Counters;
import io.walrelay.consumer.Settings;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.UnreleasedInstanceIdException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One run of {@code io.walrelay.consumer.ConsumerLoop}, on the thread that
 * calls {@link #run}: the {@link KafkaConsumer} is single-threaded, so this
 * thread polls, queues each record in its partition's queue, hands at most
 * one batch per partition at a time to a pool of {@code poolSize} workers
 * ({@link InFlight}), acts on the finished ones ({@link Outcomes}), pauses a
 * partition with two batches queued and resumes it when at most one is
 * left, and commits the offsets ({@link Offsets}). A worker that finishes
 * wakes the poll, so the partition's next batch starts at once.
 *
 * <p>It owns the objects of the run and wires them to each other; none of
 * them calls back into it. Internal: public only for the façade.
 *
 * <p>A KafkaConsumer refused its {@code group.instance.id}
 * ({@link UnreleasedInstanceIdException}, Kafka 4's consumer group protocol)
 * is dead: the run closes it and tries a new one ({@link Refusals}).
 */
public final class PollLoop {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    /** How often the lag gauges are read from the consumer (librdkafka's statistics interval in the Rust crate). */
    private static final long LAG_INTERVAL_NANOS = TimeUnit.SECONDS.toNanos(5);
    /** How long closing the consumer may take (its commit and leaving the group). */
    private static final Duration CLOSE_WAIT = Duration.ofSeconds(10);

    private final Settings settings;
    private final String group;
    private final Map<String, Object> kafkaConfig;
    private final List<String> topics;
    private final BatchLayer layer;
    private final LoopMetrics metrics;
    private final ConnectionPool pool;
    private final Map<TopicPartition, PartitionState> parts = new LinkedHashMap<>();
    private final Offsets offsets;
    private final StoppedPartitions stopped;
    private final Outcomes outcomes;
    private final InFlight inFlight;
    /** With metrics: where the partitions' time goes; else null. */
    private final PhaseClock clock;
    private volatile boolean stopping;
    /** Counted down by {@link #stop()}: ends a wait for a new consumer. */
    private final CountDownLatch stopSignal = new CountDownLatch(1);
    private final Refusals refusals = new Refusals();
    private final String instanceId;
    private volatile KafkaConsumer<byte[], byte[]> consumer;
    private long lastLag = System.nanoTime();
    /** The earliest last arrival of a partition whose batch waits to be filled, or {@code Long.MAX_VALUE}. */
    private long fillingSince = Long.MAX_VALUE;

    /**
     * @param kafkaConfig the consumer's configuration, complete (the façade
     *     checked its {@code group.id} and set what the loop needs)
     * @param counters the loop's totals, which outlive the run
     * @param metrics where to report, or {@link LoopMetrics#NONE}
     * @param layer the library's batch layer
     */
    public PollLoop(Map<String, Object> kafkaConfig, List<String> topics, DataSource dataSource, Settings settings,
            Counters counters, LoopMetrics metrics, BatchLayer layer) {
        this.kafkaConfig = kafkaConfig;
        this.group = kafkaConfig.get("group.id").toString();
        this.instanceId = String.valueOf(kafkaConfig.getOrDefault("group.instance.id", ""));
        this.topics = List.copyOf(topics);
        this.settings = settings;
        this.metrics = metrics;
        this.layer = layer;
        this.pool = new ConnectionPool(dataSource);
        this.offsets = new Offsets(settings.commitInterval());
        this.stopped = new StoppedPartitions(metrics);
        Tally tally = new Tally(counters, metrics);
        this.outcomes = new Outcomes(settings, tally, new LoopEffects(offsets, stopped, pool));
        this.clock = metrics == LoopMetrics.NONE ? null : new PhaseClock(metrics, System.nanoTime());
        this.inFlight = new InFlight(outcomes, tally, stopped, clock);
    }

    /** Partitions stopped now (a poison record, a broken handler); from any thread. */
    public int stoppedPartitions() {
        return stopped.count();
    }

    /** Asks the run to stop (from any thread): it finishes the batches in flight and commits. */
    public void stop() {
        stopping = true;
        stopSignal.countDown();
        wake();
    }

    private void wake() {
        KafkaConsumer<byte[], byte[]> c = consumer;
        if (c != null) {
            c.wakeup();
        }
    }

    /**
     * Runs until {@link #stop()}, then finishes the batches in flight (at
     * most {@code revokeWait}), commits and closes everything. Returns the
     * partitions stopped, with why (empty when none).
     */
    public Map<TopicPartition, String> run() {
        AtomicInteger n = new AtomicInteger();
        ExecutorService workers = Executors.newFixedThreadPool(settings.poolSize(), r -> {
            Thread t = new Thread(r, "walrelay-worker-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        ParkedGauge gauge = metrics == LoopMetrics.NONE ? null : ParkedGauge.start(pool, layer, group, metrics);
        try {
            // A new consumer each time the broker refuses the instance id.
            while (!stopping) {
                String refused = consume(workers);
                if (refused == null) {
                    break;
                }
                Refusals.Retry retry = refusals.refused(System.nanoTime(), instanceId, refused);
                retry.log().ifPresent(LOG::warn);
                awaitStop(retry.waitMillis());
            }
        } finally {
            workers.shutdownNow();
            if (gauge != null) {
                gauge.close();
            }
            pool.close();
        }
        return stopped.errors();
    }

    /**
     * Runs the loop on one KafkaConsumer, from its creation to its close:
     * until the stop (then it finishes the batches in flight and commits),
     * or until the broker refuses its instance id. Returns the refusal's
     * text, or null.
     */
    private String consume(ExecutorService workers) {
        KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(kafkaConfig, new ByteArrayDeserializer(),
                new ByteArrayDeserializer());
        consumer = c;
        String refused = null;
        try {
            MarkLoader marks = new MarkLoader(pool, layer, group, settings.rebalanceDbTimeout().toMillis());
            c.subscribe(topics, new Rebalance(group, parts, inFlight, offsets, marks, settings.revokeWait().toNanos(), c));
            try {
                while (!stopping) {
                    step(c, workers);
                }
            } catch (UnreleasedInstanceIdException e) {
                refused = String.valueOf(e.getMessage());
            }
            inFlight.finishAll(settings.revokeWait().toNanos());
            if (refused == null) {
                offsets.commitSync(c, offsets.partitions());
            } else {
                // The consumer is dead: what it held is no longer this member's.
                for (TopicPartition tp : parts.keySet()) {
                    offsets.forget(tp);
                }
                parts.clear();
            }
            return refused;
        } finally {
            consumer = null;
            // A dead consumer has no group to leave: no need to wait for it.
            closeQuietly(c, refused == null ? CLOSE_WAIT : Duration.ZERO);
        }
    }

    /** One turn of the loop: poll, queue, act on finished batches, start new ones, flow control, commit. */
    private void step(KafkaConsumer<byte[], byte[]> c, ExecutorService workers) {
        if (clock != null) {
            clock.snapshot(parts.values(), System.nanoTime());
        }
        ConsumerRecords<byte[], byte[]> records = poll(c);
        long now = System.nanoTime();
        if (clock != null) {
            clock.tick(now);
            reportLag(c, now);
        }
        if (refusals.count() > 0 && !parts.isEmpty()) {
            refusals.joined(now).ifPresent(ms -> LOG.info(
                    "joined the group {} ms after the broker first refused the instance id", ms));
        }
        queue(records);
        inFlight.drain();
        dispatch(workers);
        flowControl(c);
        offsets.maybeCommit(c);
    }

    /** Waits {@code millis} unless {@link #stop()} comes first. */
    private void awaitStop(long millis) {
        try {
            stopSignal.await(millis, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            stopping = true;
        }
    }

    /** Polls for at most 200 ms, less when a backoff ends, a batch stops waiting to be filled or a commit is due. */
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
        wait = Math.min(wait, Math.max(TimeUnit.NANOSECONDS.toMillis(offsets.nanosUntilCommit(now)), 0));
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
                p.push(layer.read(r, p.lastSource), now);
            }
        }
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

    /** Takes each partition's next step: skip what the marks cover, stop, wait to be filled, or start a batch. */
    private void dispatch(ExecutorService workers) {
        long now = System.nanoTime();
        fillingSince = Long.MAX_VALUE;
        for (Map.Entry<TopicPartition, PartitionState> e : parts.entrySet()) {
            TopicPartition tp = e.getKey();
            PartitionState p = e.getValue();
            p.filling = false;
            while (true) {
                Step step = p.nextStep(settings, now);
                if (step instanceof Step.Skip s) {
                    outcomes.skipped(tp, p, p.take(s.take()));
                    continue;
                }
                if (step instanceof Step.Stop s) {
                    stopped.stop(tp, p, s.error());
                } else if (step instanceof Step.Apply a && a.park() == null && filling(tp, p, a.take(), now)) {
                    p.filling = true;
                    fillingSince = Math.min(fillingSince, p.lastArrival);
                } else if ((step instanceof Step.Apply || step instanceof Step.ParkUnkeyed)
                        && inFlight.size() < settings.poolSize()) {
                    inFlight.start(new Job(tp, p, step), workers, pool, layer, this::wake);
                }
                break;
            }
        }
    }

    /** Pauses the partitions stopped or with two batches queued; resumes those back to at most one. */
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

    private static void closeQuietly(KafkaConsumer<byte[], byte[]> c, Duration wait) {
        try {
            c.close(wait);
        } catch (RuntimeException e) {
            LOG.warn("closing the Kafka consumer: {}", e.toString());
        }
    }
}
