package io.walrelay.consumer;

import io.walrelay.consumer.loop.LoopMetrics;
import io.walrelay.consumer.loop.PollLoop;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;

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
 * is paused in Kafka, and resumes when at most one is left. Offsets are
 * stored once a batch committed, committed every
 * {@link Settings#commitInterval()}, on revocation and at the stop.
 *
 * <p>This class is the API; the loop itself is in the internal package
 * {@code io.walrelay.consumer.loop} ({@link PollLoop}, one per run), which
 * reaches this package's batch transaction through {@link LoopSupport}.
 */
public final class ConsumerLoop implements AutoCloseable {
    private final Settings settings;
    private final Counters counters = new Counters();
    private final DataSource dataSource;
    private final Map<String, Object> kafkaConfig;
    private final List<String> topics;
    private LoopMetrics metrics = LoopMetrics.NONE;
    private HandlerScope scope = HandlerScope.DIRECT;
    private volatile boolean stopping;
    /** The run under way (or the last one), or null before the first. */
    private volatile PollLoop running;

    /**
     * @param kafka the Kafka consumer's configuration ({@code bootstrap.servers}, {@code group.id}, ...);
     *     the loop sets {@code enable.auto.commit=false} and byte-array deserializers, and
     *     {@code auto.offset.reset=earliest} unless given; with {@code group.protocol=consumer} it refuses
     *     the client settings that protocol does not take ({@link GroupProtocol#of}); any other client
     *     property (TLS, SASL, an OAuth login) goes to the KafkaConsumer as given: the loop never logs the
     *     configuration, and kafka-clients logs secret properties ({@code sasl.jaas.config}, passwords) as
     *     {@code [hidden]}. A secret given as a reference ({@code env:NAME}) must be resolved first
     *     ({@link KafkaSecrets#resolve})
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
        GroupProtocol.of(config);
        OAuthLogin.check(config);
        this.kafkaConfig = config;
        this.topics = List.copyOf(topics);
        this.settings = settings;
        this.dataSource = dataSource;
    }

    /** Runs every handler call in {@code scope} (the Spring module's transaction binding). */
    public ConsumerLoop withHandlerScope(HandlerScope scope) {
        this.scope = scope;
        return this;
    }

    /** Reports metrics into a Micrometer {@code MeterRegistry} (Micrometer must be on the classpath). */
    public ConsumerLoop withMeterRegistry(Object meterRegistry) {
        this.metrics = new MicrometerMetrics((io.micrometer.core.instrument.MeterRegistry) meterRegistry, counters);
        return this;
    }

    /** The loop's totals (processed, duplicates, gaps, parked, errors). */
    public Counters counters() {
        return counters;
    }

    /** Partitions stopped now (a poison record, a broken handler). */
    public int stoppedPartitions() {
        PollLoop loop = running;
        return loop == null ? 0 : loop.stoppedPartitions();
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
        PollLoop loop = running;
        if (loop != null) {
            loop.stop();
        }
    }

    @Override
    public void close() {
        stop();
    }

    private void runWith(Function<HandlerWatchdog, HandlerCalls> make) throws PartitionsStoppedException {
        Duration timeout = settings.handlerTimeout();
        HandlerWatchdog watchdog = timeout == null ? null : new HandlerWatchdog(Math.max(timeout.toMillis(), 1));
        Map<TopicPartition, String> stopped;
        try {
            PollLoop loop = new PollLoop(kafkaConfig, topics, dataSource, settings, counters, metrics,
                    new LoopSupport(make.apply(watchdog)));
            running = loop;
            // A stop() before the run started, or while it was being set up.
            if (stopping) {
                loop.stop();
            }
            stopped = loop.run();
        } finally {
            if (watchdog != null) {
                watchdog.close();
            }
        }
        if (!stopped.isEmpty()) {
            List<PartitionsStoppedException.Stopped> list = new ArrayList<>();
            stopped.forEach((tp, e) -> list.add(new PartitionsStoppedException.Stopped(tp.topic(), tp.partition(), e)));
            throw new PartitionsStoppedException(list);
        }
    }
}
