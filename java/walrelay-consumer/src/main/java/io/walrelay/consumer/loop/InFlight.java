package io.walrelay.consumer.loop;

import io.walrelay.consumer.BatchOutcome;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Executor;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.TopicPartition;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The batches handed to the workers, at most one per partition, and the
 * queue they come back on. Only the loop's thread starts and collects them;
 * a worker only runs its {@link Job} and queues it. A collected job that
 * still owns its partition goes to {@link Outcomes}; one given up on (a
 * revocation that waited long enough, a lost partition) is only counted.
 */
final class InFlight {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    private final Map<TopicPartition, Job> jobs = new HashMap<>();
    private final LinkedBlockingQueue<Job> done = new LinkedBlockingQueue<>();
    private final Outcomes outcomes;
    private final Tally tally;
    private final StoppedPartitions stopped;
    /** With metrics: where the finished batches' time went; else null. */
    private final PhaseClock clock;

    InFlight(Outcomes outcomes, Tally tally, StoppedPartitions stopped, PhaseClock clock) {
        this.outcomes = outcomes;
        this.tally = tally;
        this.stopped = stopped;
        this.clock = clock;
    }

    int size() {
        return jobs.size();
    }

    /** Runs {@code job} on {@code workers}; when it is done it is queued and {@code wake} wakes the loop. */
    void start(Job job, Executor workers, ConnectionPool pool, BatchLayer layer, Runnable wake) {
        job.p.inFlight = true;
        jobs.put(job.tp, job);
        workers.execute(() -> {
            job.run(pool, layer);
            done.add(job);
            wake.run();
        });
    }

    /** Acts on every finished job. */
    void drain() {
        Job job;
        while ((job = done.poll()) != null) {
            finished(job);
        }
    }

    private void finished(Job job) {
        if (clock != null) {
            clock.job(job.connectingNanos, job.handlerNanos, job.totalNanos);
        }
        if (job.abandoned || jobs.get(job.tp) != job) {
            if (job.result instanceof BatchOutcome o) {
                tally.abandoned(o);
            }
            return;
        }
        jobs.remove(job.tp);
        job.p.inFlight = false;
        if (job.result instanceof BatchOutcome) {
            stopped.committed(job.tp);
        }
        outcomes.finish(job);
    }

    /** Waits up to {@code nanos} for every job in flight, acting on each; the rest are abandoned. */
    void finishAll(long nanos) {
        finish(jobs.keySet(), nanos);
    }

    /** Waits up to {@code nanos} for the jobs in flight of {@code which}, acting on each; the rest are abandoned. */
    void finish(Set<TopicPartition> which, long nanos) {
        long deadline = System.nanoTime() + nanos;
        drain();
        while (which.stream().anyMatch(jobs::containsKey)) {
            long left = deadline - System.nanoTime();
            Job job = null;
            try {
                job = left > 0 ? done.poll(left, TimeUnit.NANOSECONDS) : null;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            if (job == null) {
                abandon(new HashSet<>(which));
                return;
            }
            finished(job);
        }
    }

    /** Gives up on the jobs of {@code which}: they commit or roll back on their own, their offsets are not stored. */
    void abandon(Set<TopicPartition> which) {
        for (TopicPartition tp : which) {
            Job job = jobs.remove(tp);
            if (job != null) {
                job.abandoned = true;
                LOG.warn("abandoned the batch in flight of {} offsets {}..{}: it commits or rolls back on its own, "
                        + "its records are delivered again and the marks drop what it committed", tp,
                        job.firstOffset(), job.lastOffset());
            }
        }
    }
}
