package io.walrelay.consumer;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What follows from a job's outcome, on the loop's thread: store the offset
 * of a committed batch, or retry, or stop the partition (Python's
 * {@code loop_core/outcome.py}, the Rust crate's {@code consumer_loop/failure.rs}).
 *
 * <ul>
 *   <li>a handler error is an attempt (of the failing record when known);
 *       after the last, {@link OnPoison} decides;
 *   <li>an outage replaces the connections and retries with backoff for as long as it takes;
 *   <li>contention retries in halves, counted at one record;
 *   <li>a handler that ended the transaction itself, or a corrupt mark, stops the partition;
 *   <li>any other failure of the batch's transaction is an attempt, like a handler error.
 * </ul>
 */
final class Outcomes {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");

    private Outcomes() {}

    static void finish(ConsumerLoop loop, Job job) {
        if (job.step instanceof Step.ParkUnkeyed) {
            unkeyedDone(loop, job);
        } else {
            batchDone(loop, job);
        }
    }

    private static void unkeyedDone(ConsumerLoop loop, Job job) {
        PartitionState p = job.p;
        if (job.result instanceof Parked.OffsetReusedException e) {
            p.putBack(job.records);
            loop.stopPartition(job.tp, p, e.getMessage());
            return;
        }
        if (job.result instanceof Exception e) {
            p.putBack(job.records);
            if (ErrorClass.of(e, job.connGone) != ErrorClass.BATCH) {
                outage(loop, job, e);
            } else {
                loop.stopPartition(job.tp, p, "parking record " + job.tp + " at offset " + job.firstOffset()
                        + " (no walrelay headers) failed, not for an outage: " + e);
            }
            return;
        }
        boolean written = (Boolean) job.result;
        if (written) {
            loop.counters.parked.incrementAndGet();
            loop.metrics.parked(loop.counters);
        }
        LOG.warn("record without walrelay headers {} walrelay_consumer_parked ({} offset {})",
                written ? "parked in" : "delivered again, already parked (the same record) in", job.tp, job.firstOffset());
        p.committed(1);
        loop.storeOffset(job.tp, job.firstOffset());
    }

    private static void batchDone(ConsumerLoop loop, Job job) {
        PartitionState p = job.p;
        Object result = job.result;
        if (result instanceof BatchException.CorruptHwm || result instanceof BatchException.HandlerEndedTransaction) {
            loop.counters.errors.incrementAndGet();
            p.putBack(job.records);
            loop.stopPartition(job.tp, p, ((Exception) result).getMessage());
            return;
        }
        if (result instanceof Exception e) {
            loop.counters.errors.incrementAndGet();
            loop.metrics.failed(loop.counters);
            p.putBack(job.records);
            ErrorClass kind = ErrorClass.of(e, job.connGone);
            if (kind == ErrorClass.SHRINK) {
                contended(loop, job, e);
            } else if (kind == ErrorClass.OUTAGE) {
                outage(loop, job, e);
            } else if (e instanceof BatchException.HandlerFailed f) {
                handlerFailed(loop, job, f);
            } else {
                batchFailed(loop, job, e);
            }
            return;
        }
        BatchOutcome outcome = (BatchOutcome) result;
        loop.counters.processed.addAndGet(outcome.applied());
        loop.counters.duplicates.addAndGet(outcome.duplicates());
        loop.counters.gaps.addAndGet(outcome.gaps());
        if (outcome.parked()) {
            loop.counters.parked.incrementAndGet();
            LOG.warn("record parked in walrelay_consumer_parked after its last attempt ({} offset {})", job.tp,
                    job.lastOffset());
        }
        loop.metrics.committed(job.tp.topic(), job.tp.partition(), job.records.size(),
                (System.nanoTime() - job.started) / 1e9, outcome, loop.counters);
        p.learn(outcome.marks());
        p.committed(job.records.size());
        loop.storeOffset(job.tp, job.lastOffset());
    }

    private static void handlerFailed(ConsumerLoop loop, Job job, BatchException.HandlerFailed f) {
        int n = job.p.handlerFailed(String.valueOf(f.getCause()), f.index(), job.records.size(), loop.settings, job.started);
        LOG.warn("handler failed (attempt {} of {}, {} offset {}), batch of {} rolled back and retried: {}", n,
                loop.settings.retry().attempts(), job.tp,
                f.index() != null ? job.records.get(f.index()).offset() : null, job.records.size(), f.getCause());
    }

    private static void batchFailed(ConsumerLoop loop, Job job, Exception e) {
        if (job.step instanceof Step.Apply a && a.park() != null) {
            loop.stopPartition(job.tp, job.p, "parking record " + job.tp + " at offset " + job.lastOffset()
                    + " failed, not for an outage: " + e.getMessage());
            return;
        }
        int n = job.p.handlerFailed(e.getMessage(), null, job.records.size(), loop.settings, job.started);
        LOG.warn("the transaction of a batch failed, not for a database outage (attempt {} of {}, {} offsets {}..{}; "
                + "a batch of several is then applied one record per transaction to find the record): {}", n,
                loop.settings.retry().attempts(), job.tp, job.firstOffset(), job.lastOffset(), e.getMessage());
    }

    private static void contended(ConsumerLoop loop, Job job, Exception e) {
        Throwable cause = e instanceof BatchException.HandlerFailed ? e.getCause() : e;
        Integer n = job.p.contended(String.valueOf(cause), job.records.size(), loop.settings, job.started);
        LOG.warn("a batch failed for contention or for its size ({} offsets {}..{}), rolled back and retried {}: {}",
                job.tp, job.firstOffset(), job.lastOffset(), n == null
                        ? "in batches of " + job.records.size() / 2 + ", not counted"
                        : "(attempt " + n + " of " + loop.settings.retry().attempts() + " of the record)", cause);
    }

    private static void outage(ConsumerLoop loop, Job job, Exception e) {
        loop.pool.closeAll();
        int n = job.p.dbFailed(loop.settings, job.started);
        if ((n & (n - 1)) == 0) {
            LOG.warn("database unavailable, the batch will be retried on a new connection ({}; logged at 1, 2, 4, 8... "
                    + "failures, now {}): {}", job.tp, n, e.toString());
        }
    }
}
