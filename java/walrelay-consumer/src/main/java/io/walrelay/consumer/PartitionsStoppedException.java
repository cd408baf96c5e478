package io.walrelay.consumer;

import java.util.List;

/**
 * The loop ended with partitions stopped by a poison record, a record it
 * could not park, or a handler that broke its transaction's atomicity.
 * A restart tries them again.
 */
public final class PartitionsStoppedException extends Exception {
    private static final long serialVersionUID = 1L;

    /** One stopped partition and why. */
    public record Stopped(String topic, int partition, String error) {}

    private final transient List<Stopped> stopped;

    PartitionsStoppedException(List<Stopped> stopped) {
        super("the consumer loop ended with " + stopped.size() + " stopped partition(s): " + stopped);
        this.stopped = List.copyOf(stopped);
    }

    /** The stopped partitions. */
    public List<Stopped> stopped() {
        return stopped;
    }
}
