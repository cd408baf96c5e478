package io.walrelay.consumer;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The dead-letter table {@code walrelay_consumer_parked}: where the
 * {@link OnPoison#PARK} policy puts records that keep failing, and their
 * re-drive (the Rust crate's {@code parked.rs}, the same statements).
 *
 * <p>A record with walrelay headers is parked in the transaction that raises
 * its mark past it, unique on its event (group, topic, partition, source,
 * key). A record without usable headers is parked alone, unique on its
 * offset: an identical row there is the same record delivered again, a
 * different one means the offset was reused, and the consumer refuses
 * ({@link OffsetReusedException}) rather than guess.
 */
public final class Parked {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");

    private Parked() {}

    /** What a {@link #redrive} did. */
    public record RedriveReport(int applied, int failed, int unusable) {}

    /** A record without walrelay headers was not parked: a different record is parked at its offset. */
    public static final class OffsetReusedException extends Exception {
        private static final long serialVersionUID = 1L;

        OffsetReusedException(Position p, long offset) {
            super("record " + p.topic() + "/" + p.partition() + " at offset " + offset + " has no walrelay "
                    + "headers and the dead-letter table already holds a different record without headers at "
                    + "that offset for group \"" + p.group() + "\": the offsets were reused (topic recreated, "
                    + "or a mirror failover), so nothing tells whether this record is parked. Nothing was "
                    + "parked and the partition stops: save and delete the old row (walrelay_consumer_parked, "
                    + "idempotency_key IS NULL, kafka_offset = " + offset + "), then restart");
        }
    }

    static Object[] rowParams(Position p, ConsumerRecord<byte[], byte[]> r, String key, String source, String error,
            int attempts) {
        List<String> names = new ArrayList<>();
        List<byte[]> values = new ArrayList<>();
        for (Header h : r.headers()) {
            names.add(h.key());
            values.add(h.value());
        }
        return new Object[] {p.group(), p.topic(), p.partition(), r.offset(), key, source, r.key(), r.value(),
            names.toArray(new String[0]), values.toArray(new byte[0][]), error, attempts};
    }

    /** Parks a record with walrelay headers inside the batch's transaction; returns the rows written. */
    static int insert(Connection conn, Delivery d, String error, int attempts) throws SQLException {
        return BatchApplier.execute(conn, Statements.PARKED_INSERT,
                rowParams(d.position(), d.record(), d.key(), d.meta().source(), error, attempts));
    }

    /**
     * Parks a record without usable walrelay headers in its own transaction
     * on {@code conn} (not in autocommit). Returns whether a row was written
     * (false: the same record was parked before).
     */
    static boolean insertUnkeyed(Connection conn, Position p, ConsumerRecord<byte[], byte[]> r, String error)
            throws SQLException, OffsetReusedException {
        Object[] params = rowParams(p, r, null, null, error, 1);
        try {
            if (BatchApplier.execute(conn, Statements.PARKED_INSERT_UNKEYED, params) == 1) {
                conn.commit();
                return true;
            }
            boolean same = false;
            try (PreparedStatement ps = conn.prepareStatement(Statements.PARKED_SAME_UNKEYED.jdbc())) {
                Statements.PARKED_SAME_UNKEYED.bind(ps, params);
                try (ResultSet rs = ps.executeQuery()) {
                    same = rs.next() && rs.getBoolean(1);
                }
            }
            conn.commit();
            if (!same) {
                throw new OffsetReusedException(p, r.offset());
            }
            return false;
        } catch (SQLException | RuntimeException e) {
            BatchApplier.rollbackQuietly(conn);
            throw e;
        }
    }

    /**
     * Applies the parked records of {@code group} through {@code handler},
     * oldest first, each in its own transaction that also deletes its row. A
     * record whose handler fails again stays parked (attempts and error
     * updated). {@code conn} must not be in a transaction; it is left in
     * autocommit as found.
     */
    public static RedriveReport redrive(Connection conn, String group, RecordHandler handler) throws SQLException {
        boolean auto = conn.getAutoCommit();
        conn.setAutoCommit(false);
        int applied = 0, failed = 0, unusable = 0;
        long after = 0;
        try {
            while (true) {
                Optional<Object[]> row = take(conn, group, after);
                if (row.isEmpty()) {
                    conn.commit();
                    return new RedriveReport(applied, failed, unusable);
                }
                after = (Long) row.get()[0];
                Delivery d = delivery(group, row.get());
                if (d == null) {
                    unusable++;
                    conn.commit();
                    continue;
                }
                Exception failure = null;
                var savepoint = conn.setSavepoint();
                try {
                    handler.apply(conn, d);
                    conn.releaseSavepoint(savepoint);
                } catch (Exception e) {
                    conn.rollback(savepoint);
                    failure = e;
                }
                if (failure == null) {
                    applied++;
                    BatchApplier.execute(conn, Statements.PARKED_DELETE, after);
                } else {
                    failed++;
                    LOG.warn("re-driving a parked record failed again (parked id {}, key {}): {}", after, d.key(),
                            failure.toString());
                    BatchApplier.execute(conn, Statements.PARKED_FAILED_AGAIN, after, failure.toString());
                }
                conn.commit();
            }
        } catch (SQLException | RuntimeException e) {
            BatchApplier.rollbackQuietly(conn);
            throw e;
        } finally {
            conn.setAutoCommit(auto);
        }
    }

    private static Optional<Object[]> take(Connection conn, String group, long after) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(Statements.PARKED_TAKE.jdbc())) {
            Statements.PARKED_TAKE.bind(ps, group, after);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) {
                    return Optional.empty();
                }
                String[] names = (String[]) rs.getArray(7).getArray();
                Object[] values = (Object[]) rs.getArray(8).getArray();
                return Optional.of(new Object[] {rs.getLong(1), rs.getString(2), rs.getInt(3), rs.getLong(4),
                    rs.getBytes(5), rs.getBytes(6), names, values});
            }
        }
    }

    /** A parked row as the delivery to re-drive, or null when its headers are unusable. */
    private static Delivery delivery(String group, Object[] row) {
        String topic = (String) row[1];
        int partition = (Integer) row[2];
        String[] names = (String[]) row[6];
        Object[] values = (Object[]) row[7];
        RecordHeaders headers = new RecordHeaders();
        for (int i = 0; i < names.length; i++) {
            headers.add(new RecordHeader(names[i], (byte[]) values[i]));
        }
        byte[] key = (byte[]) row[4];
        byte[] value = (byte[]) row[5];
        ConsumerRecord<byte[], byte[]> record = new ConsumerRecord<>(topic, partition, (Long) row[3],
                ConsumerRecord.NO_TIMESTAMP, TimestampType.NO_TIMESTAMP_TYPE, key == null ? -1 : key.length,
                value == null ? -1 : value.length, key, value, headers, Optional.empty());
        try {
            return new Delivery(record, RecordMeta.fromHeaders(headers), new Position(group, topic, partition));
        } catch (MetaException e) {
            return null;
        }
    }
}
