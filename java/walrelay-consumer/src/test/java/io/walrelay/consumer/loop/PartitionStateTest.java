package io.walrelay.consumer.loop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;

import io.walrelay.consumer.Keys;
import io.walrelay.consumer.MetaException;
import io.walrelay.consumer.OnPoison;
import io.walrelay.consumer.Position;
import io.walrelay.consumer.RecordMeta;
import io.walrelay.consumer.RetryPolicy;
import io.walrelay.consumer.Settings;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.junit.jupiter.api.Test;

class PartitionStateTest {
    static final Settings S = Settings.DEFAULT.withMaxBatchRecords(3)
            .withRetry(new RetryPolicy(2, Duration.ofMillis(10), Duration.ofMillis(50)))
            .withOnPoison(OnPoison.PARK);

    /** The key of sequence number {@code seq} (BatchPlanTest's). */
    static String k(long seq) {
        return Keys.of(0x100 + seq, 0);
    }

    /** A queued record at {@code offset} with key {@code seq} from source "s", or without headers ({@code seq < 0}). */
    static Queued q(long offset, long seq) {
        ConsumerRecord<byte[], byte[]> r = new ConsumerRecord<>("t", 0, offset, null, new byte[] {1});
        if (seq >= 0) {
            r.headers().add(new RecordHeader("idempotency-key", k(seq).getBytes(StandardCharsets.US_ASCII)));
            r.headers().add(new RecordHeader("walrelay-source", "s".getBytes(StandardCharsets.US_ASCII)));
        }
        try {
            return Queued.of(r, RecordMeta.fromHeaders(r.headers()), null, 0);
        } catch (MetaException e) {
            return Queued.of(r, null, e, 0);
        }
    }

    static PartitionState filled(long... seqs) {
        PartitionState p = new PartitionState(new Position("g", "t", 0));
        for (int i = 0; i < seqs.length; i++) {
            p.push(q(i, seqs[i]), 0);
        }
        return p;
    }

    @Test
    void batchesAreBoundedAndCoveredOnesSkipped() {
        PartitionState p = filled(1, 2, 3, 4);
        assertEquals(new Step.Apply(3, null), p.nextStep(S, 0));
        p.learn(Map.of("s", k(3)));
        assertEquals(new Step.Skip(3), p.nextStep(S, 0));
    }

    /** A record at {@code offset} with key {@code seq} from {@code source} (the string itself kept). */
    static Queued from(String source, long offset, long seq) {
        ConsumerRecord<byte[], byte[]> r = new ConsumerRecord<>("t", 0, offset, null, new byte[] {1});
        return Queued.of(r, new RecordMeta(k(seq), source, null, null, null), null, 0);
    }

    @Test
    void theSourcesOfABatchAreKnownOnlyWhenEachIs() {
        String a = new String("a");
        String b = new String("b");
        PartitionState p = new PartitionState(new Position("g", "t", 0));
        p.push(from(a, 0, 1), 0);
        p.push(from(a, 1, 2), 0);
        p.push(from(b, 2, 3), 0);
        p.push(from(new String("a"), 3, 4), 0);
        assertFalse(p.knowsSources(1), "no mark row known yet");
        p.learn(Map.of("a", k(0)));
        assertTrue(p.knowsSources(2), "one source, looked up once");
        assertFalse(p.knowsSources(3), "b is not known");
        p.learn(Map.of("b", k(0)));
        assertTrue(p.knowsSources(4), "an equal string of another record");
        p.push(q(4, -1), 0);
        assertFalse(p.knowsSources(5), "a record without a meta");
    }

    @Test
    void onlyAWholeQueueBelowTheBatchLimitWaitsToBeFilledAndNotForLong() {
        long window = PartitionState.FILL_WINDOW_NANOS;
        PartitionState p = filled(1, 2);
        assertTrue(p.mayFill(S, 2, 0), "the whole queue, below 3 records, just arrived");
        assertTrue(p.mayFill(S, 2, window - 1));
        assertFalse(p.mayFill(S, 2, window), "nothing arrived for the window: start");
        assertFalse(p.mayFill(S, 1, 0), "a batch not taking the whole queue");
        assertFalse(filled(1, 2, 3).mayFill(S, 3, 0), "a full batch");
        PartitionState failed = filled(1, 2);
        failed.putBack(failed.take(2));
        failed.handlerFailed("boom", null, 2, S, 0);
        assertFalse(failed.mayFill(S, 2, 0), "a partition retrying after a failure");
        assertEquals(Phase.POOL, p.phase(0));
        p.filling = true;
        assertEquals(Phase.POLLING, p.phase(0), "a partition filling its batch is polling");
    }

    @Test
    void anUnkeyedRecordIsParkedAlone() {
        PartitionState p = filled(-1, 2);
        assertInstanceOf(Step.ParkUnkeyed.class, p.nextStep(S, 0));
        PartitionState q = filled(1, -1);
        assertEquals(new Step.Apply(1, null), q.nextStep(S, 0));
    }

    @Test
    void aBatchFailingWithoutIndexIsIsolatedThenTheRecordParked() {
        PartitionState p = filled(1, 2, 3);
        p.putBack(p.take(3));
        p.handlerFailed("boom", null, 3, S, 0);
        assertInstanceOf(Step.WaitUntil.class, p.nextStep(S, 0));
        assertEquals(new Step.Apply(3, null), p.nextStep(S, Long.MAX_VALUE / 2));
        p.handlerFailed("boom", null, 3, S, 0);
        assertEquals(new Step.Apply(1, null), p.nextStep(S, 0));
        p.handlerFailed("boom", 0, 1, S, 0);
        p.handlerFailed("boom", 0, 1, S, 0);
        Step s = p.nextStep(S, Long.MAX_VALUE / 2);
        assertEquals(new Step.Apply(1, new Park("boom", 2)), s);
    }

    @Test
    void contentionHalvesWithoutCounting() {
        PartitionState p = filled(1, 2, 3);
        assertEquals(null, p.contended("40001", 3, S, 0));
        assertEquals(new Step.Apply(1, null), p.nextStep(S, Long.MAX_VALUE / 2));
        assertEquals(Integer.valueOf(1), p.contended("40001", 1, S, 0));
    }

    @Test
    void backoffDoublesToTheCap() {
        RetryPolicy r = new RetryPolicy(5, Duration.ofMillis(100), Duration.ofSeconds(10));
        assertEquals(100_000_000L, r.backoffNanos(1));
        assertEquals(200_000_000L, r.backoffNanos(2));
        assertEquals(10_000_000_000L, r.backoffNanos(20));
        assertEquals(10_000_000_000L, r.backoffNanos(1000));
    }

    @Test
    void eachPartitionIsInOnePhase() {
        assertEquals(Phase.POLLING, filled().phase(0));
        PartitionState paused = filled();
        paused.paused = true;
        assertEquals(Phase.PAUSED, paused.phase(0));
        // Records ready and no batch started: only a connection is missing.
        assertEquals(Phase.POOL, filled(1).phase(0));
        PartitionState busy = filled(1);
        busy.inFlight = true;
        assertEquals(Phase.IN_FLIGHT, busy.phase(0));
        PartitionState retrying = filled(1);
        retrying.retryAt = 100L;
        assertEquals(Phase.BACKOFF, retrying.phase(50));
        assertEquals(Phase.POOL, retrying.phase(100));
        PartitionState stopped = filled(1);
        stopped.inFlight = true;
        stopped.stopped = "poison";
        assertEquals(Phase.STOPPED, stopped.phase(0));
    }
}
