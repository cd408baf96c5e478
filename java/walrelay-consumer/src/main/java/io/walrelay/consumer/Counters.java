package io.walrelay.consumer;

import java.util.concurrent.atomic.AtomicLong;

/** What a loop (or a batch) did, in total; safe to read from any thread. */
public final class Counters {
    /** Records whose side effects were committed. */
    public final AtomicLong processed = new AtomicLong();
    /** Records dropped because the marks covered them. */
    public final AtomicLong duplicates = new AtomicLong();
    /** Gaps found from the previous-key header. */
    public final AtomicLong gaps = new AtomicLong();
    /** Records parked. */
    public final AtomicLong parked = new AtomicLong();
    /** Batches that failed (rolled back). */
    public final AtomicLong errors = new AtomicLong();

    void add(Counters other) {
        processed.addAndGet(other.processed.get());
        duplicates.addAndGet(other.duplicates.get());
        gaps.addAndGet(other.gaps.get());
        parked.addAndGet(other.parked.get());
        errors.addAndGet(other.errors.get());
    }

    @Override
    public String toString() {
        return "Counters[processed=" + processed + ", duplicates=" + duplicates + ", gaps=" + gaps
                + ", parked=" + parked + ", errors=" + errors + "]";
    }
}
