package io.walrelay.consumer;

/**
 * Whose marks a batch moves: a consumer group's view of one partition.
 *
 * @param group the consumer group
 * @param topic the topic
 * @param partition the partition
 */
public record Position(String group, String topic, int partition) {}
