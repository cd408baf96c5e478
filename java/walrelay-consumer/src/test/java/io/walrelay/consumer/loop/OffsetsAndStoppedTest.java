package io.walrelay.consumer.loop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.clients.consumer.MockConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetCommitCallback;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.FencedInstanceIdException;
import org.apache.kafka.common.errors.WakeupException;
import org.junit.jupiter.api.Test;

/** The two objects an outcome changes besides the connections: {@link Offsets} and {@link StoppedPartitions}. */
class OffsetsAndStoppedTest {
    static final TopicPartition A = new TopicPartition("t", 0);
    static final TopicPartition B = new TopicPartition("t", 1);

    @Test
    void aStoredOffsetIsDueAtTheIntervalAndAForgottenOneNever() {
        Offsets offsets = new Offsets(Duration.ofSeconds(2));
        long now = System.nanoTime();
        assertEquals(Long.MAX_VALUE, offsets.nanosUntilCommit(now), "nothing to commit: no deadline");
        offsets.store(A, 41);
        offsets.store(B, 7);
        assertTrue(offsets.nanosUntilCommit(now) <= Duration.ofSeconds(2).toNanos());
        assertEquals(Set.of(A, B), offsets.partitions());
        offsets.forget(B);
        assertEquals(Set.of(A), offsets.partitions(), "a revoked partition's offset is never committed");
        offsets.forget(A);
        assertEquals(Long.MAX_VALUE, offsets.nanosUntilCommit(now));
    }

    /** A consumer whose next {@code commitAsync} calls throw, as a coordinator lookup on the caller's thread can. */
    static final class Throwing extends MockConsumer<byte[], byte[]> {
        final List<RuntimeException> next = new ArrayList<>();

        Throwing() {
            super("earliest");
        }

        @Override
        public synchronized void commitAsync(Map<TopicPartition, OffsetAndMetadata> offsets,
                OffsetCommitCallback callback) {
            if (!next.isEmpty()) {
                throw next.remove(0);
            }
            super.commitAsync(offsets, callback);
        }
    }

    @Test
    void aCommitThatThrowsIsTriedAgainAndOnlyMembershipErrorsGoOn() {
        Throwing consumer = new Throwing();
        consumer.assign(List.of(A));
        Offsets offsets = new Offsets(Duration.ZERO);
        offsets.store(A, 41);
        consumer.next.add(new KafkaException("Unexpected error in the coordinator lookup"));
        consumer.next.add(new WakeupException());
        offsets.maybeCommit(consumer);
        offsets.maybeCommit(consumer);
        assertTrue(consumer.committed(Set.of(A)).isEmpty(), "nothing committed yet");
        assertTrue(offsets.nanosUntilCommit(System.nanoTime()) <= 0, "the failed commits are due again");
        offsets.maybeCommit(consumer);
        assertEquals(42, consumer.committed(Set.of(A)).get(A).offset());

        offsets.store(A, 50);
        consumer.next.add(new FencedInstanceIdException("fenced"));
        assertThrows(FencedInstanceIdException.class, () -> offsets.maybeCommit(consumer));
    }

    @Test
    void aStoppedPartitionCountsUntilABatchOfItCommits() {
        List<String> reported = new ArrayList<>();
        StoppedPartitions stopped = new StoppedPartitions(new LoopMetrics() {
            @Override
            public void stopped(String topic, int partition, boolean now) {
                reported.add(partition + "=" + now);
            }
        });
        PartitionState p = PartitionStateTest.filled(1);
        stopped.stop(A, p, "poison");
        stopped.stop(A, p, "poison again");
        assertEquals("poison again", p.stopped);
        assertEquals(1, stopped.count(), "one partition, stopped twice");
        assertEquals(Map.of(A, "poison again"), stopped.errors());
        stopped.committed(A);
        stopped.committed(B);
        assertEquals(0, stopped.count());
        assertEquals(List.of("0=true", "0=true", "0=false"), reported);
    }
}
