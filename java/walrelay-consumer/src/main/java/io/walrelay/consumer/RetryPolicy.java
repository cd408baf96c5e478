package io.walrelay.consumer;

import java.time.Duration;

/**
 * Exponential backoff between attempts of a failing batch.
 *
 * @param attempts attempts of a failing handler per record before {@link OnPoison} decides (at least 1)
 * @param base the wait after the first failure; it doubles each time
 * @param cap the longest wait
 */
public record RetryPolicy(int attempts, Duration base, Duration cap) {
    /** 5 attempts, 100 ms doubling to 10 s: the Rust crate's and the Python package's defaults. */
    public static final RetryPolicy DEFAULT = new RetryPolicy(5, Duration.ofMillis(100), Duration.ofSeconds(10));

    public RetryPolicy {
        attempts = Math.max(attempts, 1);
    }

    /** The wait in nanoseconds after {@code failures} consecutive failures (1 = the first). */
    public long backoffNanos(int failures) {
        int shift = Math.min(Math.max(failures - 1, 0), 31);
        long base = this.base.toNanos();
        long cap = this.cap.toNanos();
        if (base > 0 && shift >= Long.numberOfLeadingZeros(base) - 1) {
            return cap;
        }
        return Math.min(base << shift, cap);
    }
}
