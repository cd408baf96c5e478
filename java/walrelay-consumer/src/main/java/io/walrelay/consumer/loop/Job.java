package io.walrelay.consumer.loop;

import io.walrelay.consumer.BatchException;
import io.walrelay.consumer.Delivery;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.common.TopicPartition;

/**
 * One transaction of one partition, taken out of its queue: run on a worker
 * thread ({@link #run}), then collected by {@link InFlight} on the loop's
 * thread, where {@link Outcomes} acts on its result (a failure included).
 */
final class Job {
    final TopicPartition tp;
    final PartitionState p;
    final Step step;
    final List<Queued> records;
    final boolean known;
    final long started = System.nanoTime();
    /** A BatchOutcome, a Boolean (an unkeyed record written or not), or the Exception that failed it. */
    Object result;
    /** The connection was gone at the job's end (a handler failure is then an outage). */
    boolean connGone;
    /** The revocation gave up waiting for it: only its counts matter. */
    volatile boolean abandoned;
    /** Where its run's time went (nanoseconds), for {@link PhaseClock#job}. */
    long connectingNanos;
    long handlerNanos;
    long totalNanos;

    Job(TopicPartition tp, PartitionState p, Step step) {
        this.tp = tp;
        this.p = p;
        this.step = step;
        int take = step instanceof Step.Apply a ? a.take() : 1;
        this.known = step instanceof Step.Apply && p.knowsSources(take);
        this.records = p.take(take);
    }

    long firstOffset() {
        return records.get(0).offset();
    }

    long lastOffset() {
        return records.get(records.size() - 1).offset();
    }

    List<Delivery> deliveries() {
        List<Delivery> out = new ArrayList<>(records.size());
        for (Queued q : records) {
            out.add(new Delivery(q.record, q.meta, p.position));
        }
        return out;
    }

    /** Runs the job's transaction on a connection of {@code pool} (a worker thread). */
    void run(ConnectionPool pool, BatchLayer layer) {
        ConnectionPool.Lease lease = null;
        long start = System.nanoTime();
        try {
            lease = pool.take();
            connectingNanos = System.nanoTime() - start;
            if (step instanceof Step.ParkUnkeyed u) {
                result = layer.parkUnkeyed(lease.conn(), p.position, records.get(0).record, u.error());
            } else {
                Step.Apply a = (Step.Apply) step;
                result = layer.apply(lease.conn(), p.position, deliveries(), a.park(), known,
                        nanos -> handlerNanos += nanos);
            }
        } catch (Exception e) {
            result = e;
        } catch (AssertionError e) {
            result = new RuntimeException(e);
        } finally {
            totalNanos = System.nanoTime() - start;
            connGone = lease == null || gone(lease);
            if (lease != null) {
                pool.give(lease, !connGone && !timedOut(result));
            }
        }
    }

    private boolean gone(ConnectionPool.Lease lease) {
        try {
            return lease.conn().isClosed() || (result instanceof Exception && !lease.conn().isValid(2));
        } catch (SQLException e) {
            return true;
        }
    }

    static boolean timedOut(Object result) {
        return result instanceof BatchException.HandlerFailed f && f.getCause() instanceof BatchException.HandlerTimedOut;
    }
}
