package io.walrelay.consumer;

/**
 * What the loop does with a record whose handler still fails after the last
 * attempt (a poison record), or a record without usable walrelay headers.
 */
public enum OnPoison {
    /**
     * Stop that partition: it is paused, nothing of it or after it is applied
     * or committed, the other partitions go on, and the loop ends with
     * {@link PartitionsStoppedException} at shutdown. A restart tries again.
     */
    STOP,
    /**
     * Park the record in {@code walrelay_consumer_parked} in the transaction
     * that raises the mark past it, then go on ({@link Parked#redrive}).
     */
    PARK
}
