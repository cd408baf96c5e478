package io.walrelay.consumer;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The loop's rebalance callbacks, run by the KafkaConsumer inside its poll,
 * on the loop's thread. On revocation the revoked partitions' batches in
 * flight are waited for (at most {@link Settings#revokeWait()}, then
 * abandoned: they commit or roll back on their own and the next owner's
 * marks drop what they committed), their offsets committed, their queues
 * dropped. On assignment the partitions' marks are loaded (only a cache:
 * the batches lock the real ones), bounded by {@link Settings#rebalanceDbTimeout()}.
 */
final class Rebalance implements ConsumerRebalanceListener {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    private final ConsumerLoop loop;
    private final org.apache.kafka.clients.consumer.KafkaConsumer<byte[], byte[]> consumer;

    Rebalance(ConsumerLoop loop, org.apache.kafka.clients.consumer.KafkaConsumer<byte[], byte[]> consumer) {
        this.loop = loop;
        this.consumer = consumer;
    }

    @Override
    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
        Set<TopicPartition> revoked = new HashSet<>(partitions);
        loop.finishInFlight(revoked, loop.settings.revokeWait().toNanos());
        loop.commitSync(consumer, revoked);
        drop(revoked);
    }

    @Override
    public void onPartitionsLost(Collection<TopicPartition> partitions) {
        Set<TopicPartition> lost = new HashSet<>(partitions);
        loop.abandon(lost);
        drop(lost);
    }

    private void drop(Set<TopicPartition> which) {
        for (TopicPartition tp : which) {
            loop.forget(tp);
        }
        if (!which.isEmpty()) {
            LOG.info("partitions revoked: {}", which);
        }
    }

    @Override
    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
        List<TopicPartition> fresh = new ArrayList<>();
        for (TopicPartition tp : partitions) {
            if (!loop.parts.containsKey(tp)) {
                loop.parts.put(tp, new PartitionState(new Position(loop.group, tp.topic(), tp.partition())));
                fresh.add(tp);
            }
        }
        // A partition paused before a revocation starts over unpaused.
        consumer.resume(partitions);
        if (!fresh.isEmpty()) {
            LOG.info("partitions assigned: {}", fresh);
            loadMarks(fresh);
        }
    }

    /** Loads the marks of {@code fresh} into their states; on any failure only logs (they are a cache). */
    private void loadMarks(List<TopicPartition> fresh) {
        ConnectionPool.Lease lease = null;
        boolean keep = false;
        try {
            lease = loop.pool.take();
            Connection conn = lease.conn();
            long millis = Math.max(loop.settings.rebalanceDbTimeout().toMillis(), 1);
            conn.setNetworkTimeout(Runnable::run, (int) Math.min(millis + 1000, Integer.MAX_VALUE));
            BatchApplier.run(conn, Statements.STATEMENT_TIMEOUT, Long.toString(millis));
            String[] topics = fresh.stream().map(TopicPartition::topic).toArray(String[]::new);
            Integer[] partitions = fresh.stream().map(TopicPartition::partition).toArray(Integer[]::new);
            try (PreparedStatement ps = conn.prepareStatement(Statements.HWM_LOAD.jdbc())) {
                Statements.HWM_LOAD.bind(ps, loop.group, topics, partitions);
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        PartitionState p = loop.parts.get(new TopicPartition(rs.getString(1), rs.getInt(2)));
                        if (p != null) {
                            p.learn(java.util.Map.of(rs.getString(3), rs.getString(4)));
                        }
                    }
                }
            }
            conn.commit();
            conn.setNetworkTimeout(Runnable::run, 0);
            keep = true;
        } catch (SQLException | RuntimeException e) {
            LOG.warn("loading the marks of {} failed (they are only a cache; the batches read the real ones): {}",
                    fresh, e.toString());
            if (lease != null) {
                BatchApplier.rollbackQuietly(lease.conn());
            }
        } finally {
            if (lease != null) {
                loop.pool.give(lease, keep);
            }
        }
    }
}
