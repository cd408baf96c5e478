package io.walrelay.consumer.loop;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The partitions stopped by a poison record or a broken handler, with why:
 * what {@code ConsumerLoop.run} throws at the end
 * ({@code PartitionsStoppedException}) and
 * {@code ConsumerLoop.stoppedPartitions()} counts. Changed on the loop's
 * thread; the count is read from any thread.
 */
final class StoppedPartitions {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    private final Map<TopicPartition, String> errors = new LinkedHashMap<>();
    private final AtomicInteger count = new AtomicInteger();
    private final LoopMetrics metrics;

    StoppedPartitions(LoopMetrics metrics) {
        this.metrics = metrics;
    }

    /** Stops {@code p}: nothing of it is applied or committed until a restart. */
    void stop(TopicPartition tp, PartitionState p, String error) {
        p.stopped = error;
        if (errors.put(tp, error) == null) {
            count.incrementAndGet();
        }
        metrics.stopped(tp.topic(), tp.partition(), true);
        LOG.error("partition {} stopped (nothing of it is applied or committed until a restart): {}", tp, error);
    }

    /** A batch of {@code tp} committed after all: it no longer counts as stopped. */
    void committed(TopicPartition tp) {
        if (errors.remove(tp) != null) {
            count.decrementAndGet();
            metrics.stopped(tp.topic(), tp.partition(), false);
        }
    }

    int count() {
        return count.get();
    }

    /** The partitions stopped, in the order they stopped, with why. */
    Map<TopicPartition, String> errors() {
        return new LinkedHashMap<>(errors);
    }
}
