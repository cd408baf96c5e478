package io.walrelay.consumer.loop;

import java.util.Collection;

/**
 * The loop's accounting of partition-seconds per {@link Phase}, apart from
 * its I/O (the Rust crate's {@code phase_clock.rs}): the phases seen when
 * the loop starts waiting hold until it wakes; a finished batch adds its
 * own connecting, handler and commit times. Only the loop's thread uses it.
 */
final class PhaseClock {
    private final LoopMetrics metrics;
    private final int[] counts = new int[Phase.values().length];
    private long since;

    PhaseClock(LoopMetrics metrics, long now) {
        this.metrics = metrics;
        this.since = now;
    }

    /** Adds the time since the last tick to the phases of the last snapshot. */
    void tick(long now) {
        double seconds = (now - since) / 1e9;
        since = now;
        if (seconds <= 0) {
            return;
        }
        Phase[] phases = Phase.values();
        for (int i = 0; i < counts.length; i++) {
            if (counts[i] > 0) {
                metrics.phaseSeconds(phases[i], seconds * counts[i]);
            }
        }
    }

    /** The partitions' phases from now on. */
    void snapshot(Collection<PartitionState> partitions, long now) {
        java.util.Arrays.fill(counts, 0);
        for (PartitionState p : partitions) {
            counts[p.phase(now).ordinal()]++;
        }
    }

    /** A finished batch's own measurements (nanoseconds). */
    void job(long connecting, long handler, long total) {
        long commit = Math.max(total - connecting - handler, 0);
        metrics.phaseSeconds(Phase.CONNECTING, connecting / 1e9);
        metrics.phaseSeconds(Phase.HANDLER, handler / 1e9);
        metrics.phaseSeconds(Phase.COMMIT, commit / 1e9);
    }
}
