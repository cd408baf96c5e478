package io.walrelay.consumer.loop;

import io.walrelay.consumer.BatchOutcome;
import io.walrelay.consumer.Counters;

/**
 * What the loop reports to a metrics system ({@code io.walrelay.consumer.MicrometerMetrics},
 * with the Rust crate's names, when Micrometer is on the classpath). Called
 * on the loop's thread, but for {@link #parkedRecords} ({@link ParkedGauge}'s
 * own). Every method does nothing unless overridden. Public only for the
 * Micrometer adapter, which stays beside {@code ConsumerLoop}.
 */
public interface LoopMetrics {
    /** A batch of {@code records} committed in {@code seconds}. */
    default void committed(String topic, int partition, int records, double seconds, BatchOutcome outcome,
            Counters totals) {}

    /** A batch failed and will be retried (or the partition stopped). */
    default void failed(Counters totals) {}

    /** A record without walrelay headers was parked. */
    default void parked(Counters totals) {}

    /** A partition was stopped (1) or is no longer (0). */
    default void stopped(String topic, int partition, boolean stopped) {}

    /** A partition was paused. */
    default void paused() {}

    /** The group's rows in walrelay_consumer_parked. */
    default void parkedRecords(long rows) {}

    /** {@code seconds} partition-seconds spent in {@code phase}. */
    default void phaseSeconds(Phase phase, double seconds) {}

    /** Records after the consumer's position in a partition (from the consumer's fetch metadata). */
    default void lag(String topic, int partition, long records) {}

    /** Nothing. */
    LoopMetrics NONE = new LoopMetrics() {};
}
