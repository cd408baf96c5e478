package io.walrelay.consumer.loop;

import io.walrelay.consumer.MetaException;
import io.walrelay.consumer.RecordMeta;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * A record waiting in its partition's queue, its headers parsed once (a
 * meta, or why there is none) by {@link BatchLayer#read}. Public only for
 * that: the loop's alone otherwise.
 */
public final class Queued {
    final ConsumerRecord<byte[], byte[]> record;
    final RecordMeta meta;
    final MetaException metaError;
    /** What it weighs in its queue: its headers, key and value. */
    final long bytes;

    private Queued(ConsumerRecord<byte[], byte[]> record, RecordMeta meta, MetaException metaError, long bytes) {
        this.record = record;
        this.meta = meta;
        this.metaError = metaError;
        this.bytes = bytes;
    }

    /**
     * {@code record} with its meta, or the error that kept it from having
     * one; {@code headerBytes}: its headers' names and values (the scan
     * counted them), to which its key and value are added.
     */
    public static Queued of(ConsumerRecord<byte[], byte[]> record, RecordMeta meta, MetaException metaError,
            long headerBytes) {
        long bytes = headerBytes + (record.key() == null ? 0 : record.key().length)
                + (record.value() == null ? 0 : record.value().length);
        return new Queued(record, meta, metaError, bytes);
    }

    long offset() {
        return record.offset();
    }
}
