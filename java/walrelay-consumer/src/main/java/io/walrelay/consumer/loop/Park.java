package io.walrelay.consumer.loop;

/**
 * The last record of a batch is parked instead of applied, after
 * {@code attempts} failures with {@code error} (the poison policy's
 * {@code PARK}, decided by {@link PartitionState#nextStep}).
 */
public record Park(String error, int attempts) {}
