package io.walrelay.consumer.loop;

import io.walrelay.consumer.BatchException;
import io.walrelay.consumer.BatchOutcome;
import io.walrelay.consumer.Delivery;
import io.walrelay.consumer.Parked;
import io.walrelay.consumer.Position;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.List;
import java.util.Map;
import java.util.function.LongConsumer;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * What the loop needs of the library's batch layer ({@code io.walrelay.consumer}):
 * the header scan, a batch's transaction and the loop's own reads. The
 * façade ({@code ConsumerLoop}) implements it with that package's
 * package-private code and hands it in, so the statements, the
 * transaction's internals and the handler's calls need not be public for
 * the loop to live in a package of its own.
 */
public interface BatchLayer {
    /**
     * Reads a record's headers once, for its partition's queue;
     * {@code sourceHint}: the partition's previous record's source, which
     * the read updates.
     */
    Queued read(ConsumerRecord<byte[], byte[]> record, SourceHint sourceHint);

    /**
     * One batch of one partition in one transaction, with the loop's
     * handler; with {@code park}, the last record is parked instead of
     * applied; {@code known}: every source's mark row exists. Each handler
     * call's time goes to {@code handlerNanos}.
     */
    BatchOutcome apply(Connection conn, Position position, List<Delivery> records, Park park, boolean known,
            LongConsumer handlerNanos) throws BatchException, SQLException;

    /** Parks a record without usable walrelay headers; whether a row was written (not already parked). */
    boolean parkUnkeyed(Connection conn, Position position, ConsumerRecord<byte[], byte[]> record, String error)
            throws SQLException, Parked.OffsetReusedException;

    /**
     * The stored marks of {@code partitions} (source to key), read and
     * committed within {@code timeoutMillis}; rolled back on failure.
     */
    Map<TopicPartition, Map<String, String>> loadMarks(Connection conn, String group, List<TopicPartition> partitions,
            long timeoutMillis) throws SQLException;

    /** The group's rows in walrelay_consumer_parked. */
    long parkedRows(Connection conn, String group) throws SQLException;
}
