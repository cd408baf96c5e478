package io.walrelay.consumer.loop;

import static io.walrelay.consumer.loop.PartitionStateTest.filled;
import static io.walrelay.consumer.loop.PartitionStateTest.k;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.walrelay.consumer.BatchOutcome;
import io.walrelay.consumer.Counters;
import java.sql.SQLException;
import java.util.HashMap;
import java.util.Map;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.Test;

/** A finished batch's outcome, followed against a fake of the loop: what it stores, stops, replaces and counts. */
class OutcomesTest {
    static final TopicPartition TP = new TopicPartition("t", 0);

    /** What the outcomes asked of the loop. */
    static final class Seen implements Effects {
        final Map<TopicPartition, Long> stored = new HashMap<>();
        final Map<TopicPartition, String> stopped = new HashMap<>();
        int replaced;

        @Override
        public void storeOffset(TopicPartition tp, long offset) {
            stored.put(tp, offset);
        }

        @Override
        public void stopPartition(TopicPartition tp, PartitionState p, String error) {
            p.stopped = error;
            stopped.put(tp, error);
        }

        @Override
        public void replaceConnections() {
            replaced++;
        }
    }

    final Counters counters = new Counters();
    final Seen seen = new Seen();
    final Outcomes outcomes = new Outcomes(PartitionStateTest.S, new Tally(counters, LoopMetrics.NONE), seen);

    /** A job of {@code p} as a worker hands it back, with {@code result}. */
    static Job finished(PartitionState p, Step step, Object result) {
        Job job = new Job(TP, p, step);
        job.result = result;
        return job;
    }

    @Test
    void aCommittedBatchStoresItsLastOffsetLearnsItsMarksAndIsCounted() {
        PartitionState p = filled(1, 2, 3, 4);
        outcomes.finish(finished(p, new Step.Apply(3, null), new BatchOutcome(2, 1, 0, false, Map.of("s", k(3)))));
        assertEquals(Map.of(TP, 2L), seen.stored);
        assertEquals(2, counters.processed.get());
        assertEquals(1, counters.duplicates.get());
        assertEquals(1, p.queue.size());
        assertEquals(k(3), p.marks.get("s"));
        assertTrue(seen.stopped.isEmpty());
        assertEquals(0, seen.replaced);
    }

    @Test
    void anOutageReplacesTheConnectionsAndRetriesWithoutAnAttempt() {
        PartitionState p = filled(1, 2);
        outcomes.finish(finished(p, new Step.Apply(2, null), new SQLException("terminating connection", "08006")));
        assertEquals(1, seen.replaced);
        assertTrue(seen.stored.isEmpty());
        assertEquals(2, p.queue.size(), "the records are put back");
        assertEquals(1, p.dbFailures);
        assertNull(p.failing, "an outage is not an attempt");
        assertEquals(1, counters.errors.get());
    }

    @Test
    void contentionRetriesInHalves() {
        PartitionState p = filled(1, 2);
        outcomes.finish(finished(p, new Step.Apply(2, null), new SQLException("deadlock detected", "40P01")));
        assertEquals(1, p.shrink.max());
        assertEquals(0, seen.replaced);
        assertTrue(seen.stored.isEmpty());
    }

    @Test
    void anyOtherFailureIsAnAttempt() {
        PartitionState p = filled(1, 2, 3);
        outcomes.finish(finished(p, new Step.Apply(3, null), new RuntimeException("boom")));
        assertEquals(1, p.failing.failures());
        assertNotNull(p.retryAt);
        assertEquals(3, p.queue.size());
        assertTrue(seen.stopped.isEmpty());
    }

    @Test
    void aBatchThatFailsToParkStopsThePartition() {
        PartitionState p = filled(1);
        outcomes.finish(finished(p, new Step.Apply(1, new Park("boom", 2)), new RuntimeException("disk full")));
        assertTrue(seen.stopped.get(TP).startsWith("parking record t-0 at offset 0 failed"), seen.stopped.toString());
        assertEquals(1, p.queue.size());
        assertTrue(seen.stored.isEmpty());
    }

    @Test
    void anUnkeyedRecordParkedIsCountedOnceAndPassed() {
        PartitionState p = filled(-1, 2);
        outcomes.finish(finished(p, new Step.ParkUnkeyed("no headers"), Boolean.TRUE));
        assertEquals(Map.of(TP, 0L), seen.stored);
        assertEquals(1, counters.parked.get());
        PartitionState again = filled(-1);
        outcomes.finish(finished(again, new Step.ParkUnkeyed("no headers"), Boolean.FALSE));
        assertEquals(1, counters.parked.get(), "already parked: not counted again");
        assertEquals(0, again.queue.size());
    }

    @Test
    void recordsTheMarksCoverAreSkippedAsDuplicates() {
        PartitionState p = filled(1, 2, 3);
        p.learn(Map.of("s", k(2)));
        outcomes.skipped(TP, p, p.take(2));
        assertEquals(Map.of(TP, 1L), seen.stored);
        assertEquals(2, counters.duplicates.get());
        assertEquals(1, p.queue.size());
    }
}
