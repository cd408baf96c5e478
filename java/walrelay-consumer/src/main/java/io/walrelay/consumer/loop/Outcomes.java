package io.walrelay.consumer.loop;

import io.walrelay.consumer.BatchException;
import io.walrelay.consumer.BatchOutcome;
import io.walrelay.consumer.ErrorClass;
import io.walrelay.consumer.OnPoison;
import io.walrelay.consumer.Parked;
import io.walrelay.consumer.Settings;
import java.util.List;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What follows from a job's outcome, on the loop's thread: store the offset
 * of a committed batch, or retry, or stop the partition (Python's
 * {@code loop_core/outcome.py}, the Rust crate's {@code consumer_loop/failure.rs}).
 * It changes its partition's {@link PartitionState}, and the loop only
 * through {@link Effects}; it counts through {@link Tally}.
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
    private final Settings settings;
    private final Tally tally;
    private final Effects effects;

    Outcomes(Settings settings, Tally tally, Effects effects) {
        this.settings = settings;
        this.tally = tally;
        this.effects = effects;
    }

    /** Records at the front of {@code p} that its cached marks cover: done without a transaction. */
    void skipped(TopicPartition tp, PartitionState p, List<Queued> taken) {
        tally.skipped(taken.size());
        p.committed(taken.size());
        effects.storeOffset(tp, taken.get(taken.size() - 1).offset());
    }

    /** Acts on a finished job that still owns its partition ({@link InFlight} decides that). */
    void finish(Job job) {
        if (job.step instanceof Step.ParkUnkeyed) {
            unkeyedDone(job);
        } else {
            batchDone(job);
        }
    }

    private void unkeyedDone(Job job) {
        PartitionState p = job.p;
        if (job.result instanceof Parked.OffsetReusedException e) {
            p.putBack(job.records);
            effects.stopPartition(job.tp, p, e.getMessage());
            return;
        }
        if (job.result instanceof Exception e) {
            p.putBack(job.records);
            if (ErrorClass.of(e, job.connGone) != ErrorClass.BATCH) {
                outage(job, e);
            } else {
                effects.stopPartition(job.tp, p, "parking record " + job.tp + " at offset " + job.firstOffset()
                        + " (no walrelay headers) failed, not for an outage: " + e);
            }
            return;
        }
        boolean written = (Boolean) job.result;
        tally.parkedUnkeyed(written);
        LOG.warn("record without walrelay headers {} walrelay_consumer_parked ({} offset {})",
                written ? "parked in" : "delivered again, already parked (the same record) in", job.tp, job.firstOffset());
        p.committed(1);
        effects.storeOffset(job.tp, job.firstOffset());
    }

    private void batchDone(Job job) {
        PartitionState p = job.p;
        Object result = job.result;
        if (result instanceof BatchException.CorruptHwm || result instanceof BatchException.HandlerEndedTransaction) {
            tally.fatal();
            p.putBack(job.records);
            effects.stopPartition(job.tp, p, ((Exception) result).getMessage());
            return;
        }
        if (result instanceof Exception e) {
            tally.failed();
            p.putBack(job.records);
            ErrorClass kind = ErrorClass.of(e, job.connGone);
            if (kind == ErrorClass.SHRINK) {
                contended(job, e);
            } else if (kind == ErrorClass.OUTAGE) {
                outage(job, e);
            } else if (e instanceof BatchException.HandlerFailed f) {
                handlerFailed(job, f);
            } else {
                batchFailed(job, e);
            }
            return;
        }
        BatchOutcome outcome = (BatchOutcome) result;
        if (outcome.parked()) {
            LOG.warn("record parked in walrelay_consumer_parked after its last attempt ({} offset {})", job.tp,
                    job.lastOffset());
        }
        tally.committed(job.tp, job.records.size(), job.started, outcome);
        p.learn(outcome.marks());
        p.committed(job.records.size());
        effects.storeOffset(job.tp, job.lastOffset());
    }

    private void handlerFailed(Job job, BatchException.HandlerFailed f) {
        int n = job.p.handlerFailed(String.valueOf(f.getCause()), f.index(), job.records.size(), settings, job.started);
        LOG.warn("handler failed (attempt {} of {}, {} offset {}), batch of {} rolled back and retried: {}", n,
                settings.retry().attempts(), job.tp,
                f.index() != null ? job.records.get(f.index()).offset() : null, job.records.size(), f.getCause());
    }

    private void batchFailed(Job job, Exception e) {
        if (job.step instanceof Step.Apply a && a.park() != null) {
            effects.stopPartition(job.tp, job.p, "parking record " + job.tp + " at offset " + job.lastOffset()
                    + " failed, not for an outage: " + e.getMessage());
            return;
        }
        int n = job.p.handlerFailed(e.getMessage(), null, job.records.size(), settings, job.started);
        LOG.warn("the transaction of a batch failed, not for a database outage (attempt {} of {}, {} offsets {}..{}; "
                + "a batch of several is then applied one record per transaction to find the record): {}", n,
                settings.retry().attempts(), job.tp, job.firstOffset(), job.lastOffset(), e.getMessage());
    }

    private void contended(Job job, Exception e) {
        Throwable cause = e instanceof BatchException.HandlerFailed ? e.getCause() : e;
        Integer n = job.p.contended(String.valueOf(cause), job.records.size(), settings, job.started);
        LOG.warn("a batch failed for contention or for its size ({} offsets {}..{}), rolled back and retried {}: {}",
                job.tp, job.firstOffset(), job.lastOffset(), n == null
                        ? "in batches of " + job.records.size() / 2 + ", not counted"
                        : "(attempt " + n + " of " + settings.retry().attempts() + " of the record)", cause);
    }

    private void outage(Job job, Exception e) {
        effects.replaceConnections();
        int n = job.p.dbFailed(settings, job.started);
        if ((n & (n - 1)) == 0) {
            LOG.warn("database unavailable, the batch will be retried on a new connection ({}; logged at 1, 2, 4, 8... "
                    + "failures, now {}): {}", job.tp, n, e.toString());
        }
    }
}
