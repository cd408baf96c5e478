package io.walrelay.consumer.loop;

/**
 * Where an assigned partition's time goes, for
 * {@code walrelay_consumer_partition_seconds_total{phase}} (the Rust crate's
 * {@code Phase}, docs/metrics.md): the loop's view of each partition while it
 * waits, and a finished batch's own split into connecting, handler and
 * commit time.
 */
public enum Phase {
    /** Waiting for records, with room for them. */
    POLLING("polling"),
    /** Paused in Kafka, nothing to apply. */
    PAUSED("paused"),
    /** Waiting out a retry's backoff. */
    BACKOFF("backoff"),
    /** A batch ready, no free connection. */
    POOL("pool"),
    /** Stopped by a poison record. */
    STOPPED("stopped"),
    /** A batch in flight, as the loop saw it. */
    IN_FLIGHT("in_flight"),
    /** A batch waiting for its connection. */
    CONNECTING("connecting"),
    /** A batch in its handler. */
    HANDLER("handler"),
    /** A batch writing its marks and committing. */
    COMMIT("commit");

    private final String label;

    Phase(String label) {
        this.label = label;
    }

    /** Its {@code phase} label, as the Rust crate spells it. */
    public String label() {
        return label;
    }
}
