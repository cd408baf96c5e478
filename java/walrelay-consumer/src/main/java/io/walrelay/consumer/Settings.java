package io.walrelay.consumer;

import java.time.Duration;

/**
 * Settings of the {@link ConsumerLoop}, with the Rust crate's defaults.
 *
 * @param maxBatchRecords at most this many records in one batch transaction (1000)
 * @param maxBatchBytes at most this many bytes of payload, key and headers in one batch (4 MiB;
 *     a larger record makes a batch of its own)
 * @param retry retries of failing batches
 * @param onPoison what to do with a poison record ({@link OnPoison#STOP})
 * @param commitInterval between asynchronous offset commits (1 s)
 * @param poolSize database connections, so partitions applying at the same time (4)
 * @param rebalanceDbTimeout how long loading the marks of assigned partitions may take (5 s)
 * @param revokeWait how long a revocation waits for the revoked partitions' batches in flight (10 s)
 * @param handlerTimeout how long one handler call may run, or null for no bound
 */
public record Settings(int maxBatchRecords, long maxBatchBytes, RetryPolicy retry, OnPoison onPoison,
        Duration commitInterval, int poolSize, Duration rebalanceDbTimeout, Duration revokeWait,
        Duration handlerTimeout) {

    /** The defaults. */
    public static final Settings DEFAULT = new Settings(1000, 4L << 20, RetryPolicy.DEFAULT, OnPoison.STOP,
            Duration.ofSeconds(1), 4, Duration.ofSeconds(5), Duration.ofSeconds(10), null);

    public Settings {
        maxBatchRecords = Math.max(maxBatchRecords, 1);
        maxBatchBytes = Math.max(maxBatchBytes, 1);
        poolSize = Math.max(poolSize, 1);
        if (commitInterval.isNegative() || commitInterval.isZero()) {
            commitInterval = Duration.ofMillis(1);
        }
    }

    public Settings withMaxBatchRecords(int v) {
        return new Settings(v, maxBatchBytes, retry, onPoison, commitInterval, poolSize, rebalanceDbTimeout, revokeWait, handlerTimeout);
    }

    public Settings withMaxBatchBytes(long v) {
        return new Settings(maxBatchRecords, v, retry, onPoison, commitInterval, poolSize, rebalanceDbTimeout, revokeWait, handlerTimeout);
    }

    public Settings withRetry(RetryPolicy v) {
        return new Settings(maxBatchRecords, maxBatchBytes, v, onPoison, commitInterval, poolSize, rebalanceDbTimeout, revokeWait, handlerTimeout);
    }

    public Settings withOnPoison(OnPoison v) {
        return new Settings(maxBatchRecords, maxBatchBytes, retry, v, commitInterval, poolSize, rebalanceDbTimeout, revokeWait, handlerTimeout);
    }

    public Settings withCommitInterval(Duration v) {
        return new Settings(maxBatchRecords, maxBatchBytes, retry, onPoison, v, poolSize, rebalanceDbTimeout, revokeWait, handlerTimeout);
    }

    public Settings withPoolSize(int v) {
        return new Settings(maxBatchRecords, maxBatchBytes, retry, onPoison, commitInterval, v, rebalanceDbTimeout, revokeWait, handlerTimeout);
    }

    public Settings withHandlerTimeout(Duration v) {
        return new Settings(maxBatchRecords, maxBatchBytes, retry, onPoison, commitInterval, poolSize, rebalanceDbTimeout, revokeWait, v);
    }
}
