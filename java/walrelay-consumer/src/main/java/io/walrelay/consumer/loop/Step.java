package io.walrelay.consumer.loop;

/** What a partition does next ({@link PartitionState#nextStep}). */
sealed interface Step {
    /** Nothing now (empty, stopped, a batch in flight). */
    record Idle() implements Step {}

    /** Nothing before this moment ({@link System#nanoTime()}; a backoff). */
    record WaitUntil(long at) implements Step {}

    /** Every one of the first {@code take} records is at or below a cached mark: store the offset, no transaction. */
    record Skip(int take) implements Step {}

    /** Apply the first {@code take} records in one transaction; with {@code park}, the last of them is parked instead. */
    record Apply(int take, Park park) implements Step {}

    /** The front record has no usable walrelay headers: park it alone. */
    record ParkUnkeyed(String error) implements Step {}

    /** Stop the partition with this error. */
    record Stop(String error) implements Step {}
}
