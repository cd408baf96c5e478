package io.walrelay.consumer;

import org.apache.kafka.clients.consumer.ConsumerRecord;

/** A record waiting in its partition's queue, its headers parsed once (a meta, or why there is none). */
final class Queued {
    final ConsumerRecord<byte[], byte[]> record;
    final RecordMeta meta;
    final MetaException metaError;
    final long bytes;

    private Queued(ConsumerRecord<byte[], byte[]> record, RecordMeta meta, MetaException metaError, long bytes) {
        this.record = record;
        this.meta = meta;
        this.metaError = metaError;
        this.bytes = bytes;
    }

    /**
     * Reads the record's headers once. {@code sourceHint}: the source of the
     * partition's previous record, reused when this one's is the same
     * ({@link RecordMeta#of}).
     */
    static Queued of(ConsumerRecord<byte[], byte[]> record, String sourceHint) {
        HeaderScan scan = HeaderScan.of(record.headers());
        long bytes = scan.bytes + (record.key() == null ? 0 : record.key().length)
                + (record.value() == null ? 0 : record.value().length);
        try {
            return new Queued(record, RecordMeta.of(scan, sourceHint), null, bytes);
        } catch (MetaException e) {
            return new Queued(record, null, e, bytes);
        }
    }

    long offset() {
        return record.offset();
    }
}
