package io.walrelay.consumer.loop;

import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.FencedInstanceIdException;
import org.apache.kafka.common.errors.InterruptException;
import org.apache.kafka.common.errors.UnreleasedInstanceIdException;
import org.apache.kafka.common.errors.WakeupException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka offsets of the batches that committed: stored on the loop's
 * thread as each finishes, committed asynchronously every
 * {@code commitInterval}, synchronously on revocation and at the stop. They
 * are only a hint of where to start: the marks in the database are the truth.
 */
final class Offsets {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    private final long intervalNanos;
    /** The next offset to commit, per partition. */
    private final Map<TopicPartition, Long> stored = new HashMap<>();
    /** Partitions stored since their last commit. */
    private final Set<TopicPartition> dirty = new HashSet<>();
    private long lastCommit = System.nanoTime();

    Offsets(Duration commitInterval) {
        this.intervalNanos = commitInterval.toNanos();
    }

    /** The records of {@code tp} up to {@code offset} are done. */
    void store(TopicPartition tp, long offset) {
        stored.put(tp, offset + 1);
        dirty.add(tp);
    }

    /** Forgets a partition no longer assigned: its stored offset must never be committed by this member again. */
    void forget(TopicPartition tp) {
        stored.remove(tp);
        dirty.remove(tp);
    }

    /** The partitions with a stored offset (the stop commits them all). */
    Set<TopicPartition> partitions() {
        return new HashSet<>(stored.keySet());
    }

    /** How long the poll may wait before the next commit is due, or {@code Long.MAX_VALUE} with nothing to commit. */
    long nanosUntilCommit(long now) {
        return dirty.isEmpty() ? Long.MAX_VALUE : intervalNanos - (now - lastCommit);
    }

    /**
     * Commits what was stored, asynchronously, when {@code commitInterval} has passed since the last commit.
     *
     * <p>{@code commitAsync} is not always asynchronous: while the group's coordinator is unknown (a broker
     * outage, a moved coordinator) it looks the coordinator up on this thread and may throw what that lookup
     * meets, a stop's wakeup included. Offsets are a hint, so such a commit is logged and tried again at the next
     * interval; only a fenced or refused instance id, which decides the consumer's membership, goes on to the loop.
     */
    void maybeCommit(Consumer<byte[], byte[]> c) {
        long now = System.nanoTime();
        if (dirty.isEmpty() || now - lastCommit < intervalNanos) {
            return;
        }
        Map<TopicPartition, OffsetAndMetadata> offsets = offsets(dirty);
        dirty.clear();
        lastCommit = now;
        try {
            c.commitAsync(offsets, (o, e) -> {
                if (e != null) {
                    LOG.warn("committing offsets failed (they are only a hint, the marks are the truth): {}", e.toString());
                }
            });
        } catch (FencedInstanceIdException | UnreleasedInstanceIdException | InterruptException e) {
            throw e;
        } catch (WakeupException e) {
            // A stop: it commits every stored offset itself.
            dirty.addAll(offsets.keySet());
        } catch (KafkaException e) {
            dirty.addAll(offsets.keySet());
            LOG.warn("committing offsets failed (they are only a hint, the marks are the truth; tried again in {} ms): {}",
                    TimeUnit.NANOSECONDS.toMillis(intervalNanos), e.toString());
        }
    }

    /** Commits the stored offsets of {@code which} now (a revocation, the stop). */
    void commitSync(Consumer<byte[], byte[]> c, Set<TopicPartition> which) {
        Map<TopicPartition, OffsetAndMetadata> offsets = offsets(which);
        dirty.removeAll(which);
        if (offsets.isEmpty()) {
            return;
        }
        for (int attempt = 0; attempt < 3; attempt++) {
            try {
                c.commitSync(offsets, Duration.ofSeconds(10));
                return;
            } catch (WakeupException e) {
                // A worker finished meanwhile: try again.
            } catch (RuntimeException e) {
                LOG.warn("committing offsets of {} failed (the marks drop what is delivered again): {}",
                        offsets.keySet(), e.toString());
                return;
            }
        }
    }

    private Map<TopicPartition, OffsetAndMetadata> offsets(Set<TopicPartition> which) {
        Map<TopicPartition, OffsetAndMetadata> out = new HashMap<>();
        for (TopicPartition tp : which) {
            Long next = stored.get(tp);
            if (next != null) {
                out.put(tp, new OffsetAndMetadata(next));
            }
        }
        return out;
    }
}
