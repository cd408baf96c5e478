package io.walrelay.consumer.loop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.kafka.common.TopicPartition;
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
