package io.walrelay.consumer.loop;

import java.sql.SQLException;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Loads newly assigned partitions' marks into their states, on a connection
 * of the loop's pool, bounded by {@code rebalanceDbTimeout}: only a cache
 * (the batches lock the real ones), so a failure is logged and nothing
 * more. It runs inside the poll ({@link Rebalance}), where waiting long
 * would cost the group its member.
 */
final class MarkLoader {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    private final ConnectionPool pool;
    private final BatchLayer layer;
    private final String group;
    private final long timeoutMillis;

    MarkLoader(ConnectionPool pool, BatchLayer layer, String group, long timeoutMillis) {
        this.pool = pool;
        this.layer = layer;
        this.group = group;
        this.timeoutMillis = Math.max(timeoutMillis, 1);
    }

    /** Loads the marks of {@code fresh} into their states in {@code parts}. */
    void load(List<TopicPartition> fresh, Map<TopicPartition, PartitionState> parts) {
        ConnectionPool.Lease lease = null;
        boolean keep = false;
        try {
            lease = pool.take();
            Map<TopicPartition, Map<String, String>> marks = layer.loadMarks(lease.conn(), group, fresh, timeoutMillis);
            marks.forEach((tp, m) -> {
                PartitionState p = parts.get(tp);
                if (p != null) {
                    p.learn(m);
                }
            });
            keep = true;
        } catch (SQLException | RuntimeException e) {
            LOG.warn("loading the marks of {} failed (they are only a cache; the batches read the real ones): {}",
                    fresh, e.toString());
        } finally {
            if (lease != null) {
                pool.give(lease, keep);
            }
        }
    }
}
