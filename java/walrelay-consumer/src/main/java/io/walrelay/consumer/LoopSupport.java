package io.walrelay.consumer;

import io.walrelay.consumer.loop.BatchLayer;
import io.walrelay.consumer.loop.Park;
import io.walrelay.consumer.loop.Queued;
import io.walrelay.consumer.loop.SourceHint;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.LongConsumer;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * The loop's way into this package ({@link BatchLayer}), handed to
 * {@link io.walrelay.consumer.loop.PollLoop} by {@link ConsumerLoop} for one
 * run with its handler: the header scan, the batch transaction, the
 * statements and the handler's calls stay package-private here, and the
 * loop's package needs nothing of them but this.
 */
final class LoopSupport implements BatchLayer {
    private final HandlerCalls calls;

    /** {@code calls}: the run's handler, in its scope, under its watchdog. */
    LoopSupport(HandlerCalls calls) {
        this.calls = calls;
    }

    @Override
    public Queued read(ConsumerRecord<byte[], byte[]> record, SourceHint sourceHint) {
        HeaderScan scan = HeaderScan.of(record.headers());
        try {
            RecordMeta meta = RecordMeta.of(scan, sourceHint.text(), sourceHint.bytes());
            sourceHint.remember(meta.source(), scan.source);
            return Queued.of(record, meta, null, scan.bytes);
        } catch (MetaException e) {
            return Queued.of(record, null, e, scan.bytes);
        }
    }

    @Override
    public BatchOutcome apply(Connection conn, Position position, List<Delivery> records, Park park, boolean known,
            LongConsumer handlerNanos) throws BatchException, SQLException {
        BatchApplier.Park last = park == null ? null : new BatchApplier.Park(park.error(), park.attempts());
        return BatchApplier.apply(conn, position, records, timed(handlerNanos), last, known);
    }

    /** The run's handler calls, each call's time given to {@code nanos}. */
    private HandlerCalls timed(LongConsumer nanos) {
        return new HandlerCalls() {
            @Override
            void run(Connection conn, List<Delivery> fresh) throws Failed {
                long t = System.nanoTime();
                try {
                    calls.run(conn, fresh);
                } finally {
                    nanos.accept(System.nanoTime() - t);
                }
            }
        };
    }

    @Override
    public boolean parkUnkeyed(Connection conn, Position position, ConsumerRecord<byte[], byte[]> record, String error)
            throws SQLException, Parked.OffsetReusedException {
        return Parked.insertUnkeyed(conn, position, record, error);
    }

    @Override
    public Map<TopicPartition, Map<String, String>> loadMarks(Connection conn, String group,
            List<TopicPartition> partitions, long timeoutMillis) throws SQLException {
        try {
            conn.setNetworkTimeout(Runnable::run, (int) Math.min(timeoutMillis + 1000, Integer.MAX_VALUE));
            BatchApplier.run(conn, Statements.STATEMENT_TIMEOUT, Long.toString(timeoutMillis));
            String[] topics = partitions.stream().map(TopicPartition::topic).toArray(String[]::new);
            Integer[] numbers = partitions.stream().map(TopicPartition::partition).toArray(Integer[]::new);
            Map<TopicPartition, Map<String, String>> marks = new HashMap<>();
            try (PreparedStatement ps = conn.prepareStatement(Statements.HWM_LOAD.jdbc())) {
                Statements.HWM_LOAD.bind(ps, group, topics, numbers);
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        marks.computeIfAbsent(new TopicPartition(rs.getString(1), rs.getInt(2)), tp -> new HashMap<>())
                                .put(rs.getString(3), rs.getString(4));
                    }
                }
            }
            conn.commit();
            conn.setNetworkTimeout(Runnable::run, 0);
            return marks;
        } catch (SQLException | RuntimeException e) {
            BatchApplier.rollbackQuietly(conn);
            throw e;
        }
    }

    @Override
    public long parkedRows(Connection conn, String group) throws SQLException {
        long rows = 0;
        try (PreparedStatement ps = conn.prepareStatement(Statements.PARKED_COUNT.jdbc())) {
            Statements.PARKED_COUNT.bind(ps, group);
            try (ResultSet rs = ps.executeQuery()) {
                if (rs.next()) {
                    rows = rs.getLong(1);
                }
            }
        }
        conn.commit();
        return rows;
    }
}
