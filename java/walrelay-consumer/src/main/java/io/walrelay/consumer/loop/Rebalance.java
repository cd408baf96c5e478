package io.walrelay.consumer.loop;

import io.walrelay.consumer.Position;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The loop's rebalance callbacks, run by the KafkaConsumer inside its poll,
 * on the loop's thread. On revocation the revoked partitions' batches in
 * flight are waited for (at most {@code revokeWait}, then abandoned: they
 * commit or roll back on their own and the next owner's marks drop what
 * they committed), their offsets committed, their queues dropped. On
 * assignment the partitions' marks are loaded ({@link MarkLoader}).
 *
 * <p>It is handed the objects it changes (the partitions' states, the jobs
 * in flight, the offsets), never the loop itself.
 */
final class Rebalance implements ConsumerRebalanceListener {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    private final String group;
    private final Map<TopicPartition, PartitionState> parts;
    private final InFlight inFlight;
    private final Offsets offsets;
    private final MarkLoader marks;
    private final long revokeWaitNanos;
    private final KafkaConsumer<byte[], byte[]> consumer;

    Rebalance(String group, Map<TopicPartition, PartitionState> parts, InFlight inFlight, Offsets offsets,
            MarkLoader marks, long revokeWaitNanos, KafkaConsumer<byte[], byte[]> consumer) {
        this.group = group;
        this.parts = parts;
        this.inFlight = inFlight;
        this.offsets = offsets;
        this.marks = marks;
        this.revokeWaitNanos = revokeWaitNanos;
        this.consumer = consumer;
    }

    @Override
    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
        Set<TopicPartition> revoked = new HashSet<>(partitions);
        inFlight.finish(revoked, revokeWaitNanos);
        offsets.commitSync(consumer, revoked);
        drop(revoked);
    }

    @Override
    public void onPartitionsLost(Collection<TopicPartition> partitions) {
        Set<TopicPartition> lost = new HashSet<>(partitions);
        inFlight.abandon(lost);
        drop(lost);
    }

    /** Forgets partitions no longer assigned: their stored offsets must never be committed by this member again. */
    private void drop(Set<TopicPartition> which) {
        for (TopicPartition tp : which) {
            parts.remove(tp);
            offsets.forget(tp);
        }
        if (!which.isEmpty()) {
            LOG.info("partitions revoked: {}", which);
        }
    }

    @Override
    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
        List<TopicPartition> fresh = new ArrayList<>();
        for (TopicPartition tp : partitions) {
            if (!parts.containsKey(tp)) {
                parts.put(tp, new PartitionState(new Position(group, tp.topic(), tp.partition())));
                fresh.add(tp);
            }
        }
        // A partition paused before a revocation starts over unpaused.
        consumer.resume(partitions);
        if (!fresh.isEmpty()) {
            LOG.info("partitions assigned: {}", fresh);
            marks.load(fresh, parts);
        }
    }
}
