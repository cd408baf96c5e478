package io.walrelay.consumer;

import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * A record handed to a handler: the Kafka record, its walrelay metadata
 * and the partition it was applied for.
 *
 * @param record the record as consumed
 * @param meta its parsed walrelay headers
 * @param position the group, topic and partition
 */
public record Delivery(ConsumerRecord<byte[], byte[]> record, RecordMeta meta, Position position) {
    /** The record's value (the event's payload), or null. */
    public byte[] payload() {
        return record.value();
    }

    /** The idempotency key, 32 lowercase hex digits. */
    public String key() {
        return meta.key();
    }
}
