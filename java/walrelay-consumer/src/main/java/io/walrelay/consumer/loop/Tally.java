package io.walrelay.consumer.loop;

import io.walrelay.consumer.BatchOutcome;
import io.walrelay.consumer.Counters;
import org.apache.kafka.common.TopicPartition;

/**
 * Counts what finished batches did, in the loop's {@link Counters} (what
 * {@code ConsumerLoop.counters()} shows) and its {@link LoopMetrics}, so
 * that every outcome is counted the same way wherever it is acted on
 * ({@link Outcomes}, or {@link InFlight} for a batch given up on).
 */
final class Tally {
    private final Counters counters;
    private final LoopMetrics metrics;

    Tally(Counters counters, LoopMetrics metrics) {
        this.counters = counters;
        this.metrics = metrics;
    }

    /** A batch of {@code records} committed, started at {@code started} ({@link System#nanoTime()}). */
    void committed(TopicPartition tp, int records, long started, BatchOutcome outcome) {
        add(outcome);
        metrics.committed(tp.topic(), tp.partition(), records, (System.nanoTime() - started) / 1e9, outcome, counters);
    }

    /** A batch the loop gave up waiting for, which committed on its own: counted, nothing else. */
    void abandoned(BatchOutcome outcome) {
        add(outcome);
    }

    private void add(BatchOutcome outcome) {
        counters.processed.addAndGet(outcome.applied());
        counters.duplicates.addAndGet(outcome.duplicates());
        counters.gaps.addAndGet(outcome.gaps());
        if (outcome.parked()) {
            counters.parked.incrementAndGet();
        }
    }

    /** {@code n} records the cached marks cover, skipped without a transaction. */
    void skipped(int n) {
        counters.duplicates.addAndGet(n);
    }

    /** A record without walrelay headers parked ({@code written}), or found parked already. */
    void parkedUnkeyed(boolean written) {
        if (written) {
            counters.parked.incrementAndGet();
            metrics.parked(counters);
        }
    }

    /** A batch rolled back, to be retried (or its partition stopped by the retry policy). */
    void failed() {
        counters.errors.incrementAndGet();
        metrics.failed(counters);
    }

    /** A batch rolled back for a reason no retry can fix: its partition stops. */
    void fatal() {
        counters.errors.incrementAndGet();
    }
}
