package io.walrelay.consumer.loop;

import io.walrelay.consumer.Keys;
import io.walrelay.consumer.OnPoison;
import io.walrelay.consumer.Position;
import io.walrelay.consumer.RecordMeta;
import io.walrelay.consumer.Settings;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.Set;

/**
 * One assigned partition's state and the pure decisions about it: what to
 * apply next, when to wait, what a failure means (the Rust crate's
 * {@code consumer_loop/partition.rs}, Python's {@code partition.py}). Only
 * the loop's thread touches it.
 *
 * <p>A batch only takes records from the front of the queue, and they leave
 * it only when their transaction committed, so the partition's order is
 * strict; a failed batch is retried as it was (or one record per
 * transaction to find the failing record, or in halves after contention).
 */
final class PartitionState {
    /** The failure of the batch at the front of the queue. */
    record Failing(int failures, String error, Integer index, int len) {}

    /** Batches capped at {@code max} records until {@code left} of the contended records committed. */
    record Shrink(int max, int left) {}

    final Position position;
    final ArrayDeque<Queued> queue = new ArrayDeque<>();
    long queuedBytes;
    /** Fetching is paused in Kafka. */
    boolean paused;
    /** Stopped by a poison record (the error), or null. */
    String stopped;
    /** Known marks per source (a lower bound of the stored ones). */
    final Map<String, String> marks = new HashMap<>();
    /** Sources whose mark rows exist. */
    final Set<String> known = new HashSet<>();
    Failing failing;
    /** Handler failures per record (by offset) of the records still queued. */
    final Map<Long, Integer> recordFailures = new HashMap<>();
    /** Database failures in a row (an outage: not counted as attempts). */
    int dbFailures;
    /** No batch before this moment (nanoTime), or null. */
    Long retryAt;
    /** Records left to apply one per transaction, to find the failing one. */
    int isolate;
    /** A batch of it is being applied. */
    boolean inFlight;
    Shrink shrink;

    PartitionState(Position position) {
        this.position = position;
    }

    /** The source of the last record queued with a meta: the hint for the next one's ({@link BatchLayer#read}). */
    final SourceHint lastSource = new SourceHint();
    /** When a poll last brought records of this partition ({@link System#nanoTime()}). */
    long lastArrival;
    /** Its next batch waits to be filled (set by the loop's dispatch): its phase is polling. */
    boolean filling;

    /**
     * How long a batch waits to be filled after the partition's last
     * arrival ({@link #mayFill}): a few polls' worth, so a partition that
     * stops receiving (the end of a backlog, a slow fetch) starts what it
     * has at once.
     */
    static final long FILL_WINDOW_NANOS = TimeUnit.MILLISECONDS.toNanos(5);

    void push(Queued q, long now) {
        queuedBytes += q.bytes;
        queue.addLast(q);
        lastArrival = now;
    }

    /**
     * Whether the batch of {@code take} records that {@link #nextStep} chose
     * may wait to be filled, if the consumer knows more records of the
     * partition beyond what it queued (the loop asks its lag only then).
     *
     * <p>Under a backlog a poll brings each partition a few hundred records at
     * a time, and a partition whose last batch just finished would otherwise
     * start on those: many small transactions, each paying its round trips
     * and its {@code COMMIT} in database CPU (the Rust crate's "filling",
     * docs/benchmarks.md). Only a batch that would take the whole queue and
     * is still below {@code maxBatchRecords} waits, never a full partition
     * (it is not read) or one retrying, isolating or shrinking after a
     * failure, and never longer than {@link #FILL_WINDOW_NANOS} after the
     * partition's last arrival.
     */
    boolean mayFill(Settings s, int take, long now) {
        return take == queue.size()
                && take < s.maxBatchRecords()
                && !isFull(s)
                && failing == null
                && isolate == 0
                && shrink == null
                && now - lastArrival < FILL_WINDOW_NANOS;
    }

    List<Queued> take(int n) {
        List<Queued> taken = new ArrayList<>(Math.min(n, queue.size()));
        for (int i = 0; i < n && !queue.isEmpty(); i++) {
            Queued q = queue.pollFirst();
            queuedBytes -= q.bytes;
            taken.add(q);
        }
        return taken;
    }

    void putBack(List<Queued> records) {
        for (int i = records.size() - 1; i >= 0; i--) {
            queuedBytes += records.get(i).bytes;
            queue.addFirst(records.get(i));
        }
    }

    /** Two batches queued, in records or in bytes: the partition is paused in Kafka. */
    boolean isFull(Settings s) {
        return queue.size() >= s.maxBatchRecords() * 2 || queuedBytes >= s.maxBatchBytes() * 2;
    }

    boolean shouldResume(Settings s) {
        return paused && stopped == null && queue.size() <= s.maxBatchRecords() && queuedBytes <= s.maxBatchBytes();
    }

    /**
     * What the partition waits for once the loop started what it could
     * (the Rust crate's {@code Partition::phase}): a ready batch that did not
     * start is waiting for a connection.
     */
    Phase phase(long now) {
        if (stopped != null) {
            return Phase.STOPPED;
        }
        if (inFlight) {
            return Phase.IN_FLIGHT;
        }
        if (queue.isEmpty()) {
            return paused ? Phase.PAUSED : Phase.POLLING;
        }
        if (retryAt != null && retryAt - now > 0) {
            return Phase.BACKOFF;
        }
        return filling ? Phase.POLLING : Phase.POOL;
    }

    /** Raises the cached marks. */
    void learn(Map<String, String> committed) {
        for (Map.Entry<String, String> e : committed.entrySet()) {
            known.add(e.getKey());
            marks.merge(e.getKey(), e.getValue(), (a, b) -> a.compareTo(b) >= 0 ? a : b);
        }
    }

    /** Whether the mark rows of every source of the first {@code take} records are known to exist. */
    boolean knowsSources(int take) {
        Iterator<Queued> it = queue.iterator();
        // The records of a partition share one source string (SourceHint): looked up once per run of it.
        String checked = null;
        for (int i = 0; i < take && it.hasNext(); i++) {
            Queued q = it.next();
            if (q.meta == null) {
                return false;
            }
            String source = q.meta.source();
            if (source != checked) {
                if (!known.contains(source)) {
                    return false;
                }
                checked = source;
            }
        }
        return true;
    }

    Step nextStep(Settings s, long now) {
        if (stopped != null || inFlight || queue.isEmpty()) {
            return new Step.Idle();
        }
        if (retryAt != null && retryAt - now > 0) {
            return new Step.WaitUntil(retryAt);
        }
        Queued front = queue.peekFirst();
        if (front.meta == null) {
            String error = "record " + position.topic() + "/" + position.partition() + " at offset " + front.offset()
                    + ": " + front.metaError.getMessage();
            return s.onPoison() == OnPoison.PARK ? new Step.ParkUnkeyed(error) : new Step.Stop(error);
        }
        int take = 0;
        long size = 0;
        for (Queued q : queue) {
            if (q.meta == null || take == s.maxBatchRecords() || (take > 0 && size + q.bytes > s.maxBatchBytes())) {
                break;
            }
            take++;
            size += q.bytes;
        }
        if (isolate > 0) {
            take = 1;
        }
        if (shrink != null) {
            take = Math.min(take, shrink.max());
        }
        Failing f = failing;
        if (f != null && f.failures() >= s.retry().attempts()) {
            Integer poison = f.index() != null ? f.index() : (f.len() <= 1 ? Integer.valueOf(0) : null);
            if (poison != null) {
                return poisonStep(s, f, poison);
            }
            take = 1;
        }
        return allDuplicates(take) ? new Step.Skip(take) : new Step.Apply(take, null);
    }

    private Step poisonStep(Settings s, Failing f, int poison) {
        long offset = poison < queue.size() ? get(poison).offset() : -1;
        String error = "record " + position.topic() + "/" + position.partition() + " at offset " + offset + " failed "
                + f.failures() + " times: " + f.error();
        if (s.onPoison() == OnPoison.PARK) {
            return new Step.Apply(poison + 1, new Park(f.error(), f.failures()));
        }
        if (poison > 0) {
            return new Step.Apply(poison, null);
        }
        return new Step.Stop(error);
    }

    private Queued get(int index) {
        Iterator<Queued> it = queue.iterator();
        for (int i = 0; i < index; i++) {
            it.next();
        }
        return it.next();
    }

    private boolean allDuplicates(int take) {
        Map<String, String> running = new HashMap<>(2);
        Iterator<Queued> it = queue.iterator();
        for (int i = 0; i < take; i++) {
            RecordMeta m = it.next().meta;
            String mark = running.getOrDefault(m.source(), marks.getOrDefault(m.source(), Keys.INITIAL));
            if (m.key().compareTo(mark) > 0) {
                return false;
            }
        }
        return true;
    }

    /** After a committed batch of {@code take} records. */
    void committed(int take) {
        Failing f = failing;
        if (f != null && f.index() != null && f.index() >= take) {
            failing = new Failing(f.failures(), f.error(), f.index() - take, Math.max(f.len() - take, 0));
        } else {
            failing = null;
        }
        dbFailures = 0;
        retryAt = null;
        isolate = Math.max(isolate - take, 0);
        if (shrink != null) {
            int left = shrink.left() - take;
            shrink = left > 0 ? new Shrink(shrink.max(), left) : null;
        }
        Long first = queue.isEmpty() ? null : queue.peekFirst().offset();
        recordFailures.keySet().removeIf(o -> first == null || o < first);
    }

    /**
     * After a handler failure of a batch of {@code n} records, put back at the
     * front ({@code index}: the failing record, when known). Returns the
     * failures that count: the record's own when known, else the batch's in a row.
     */
    int handlerFailed(String error, Integer index, int n, Settings s, long now) {
        if (index == null && n == 1) {
            index = 0;
        }
        int failures;
        if (index != null && index < queue.size()) {
            failures = recordFailures.merge(get(index).offset(), 1, Integer::sum);
        } else {
            failures = (failing != null && failing.index() == null ? failing.failures() : 0) + 1;
        }
        if (failures >= s.retry().attempts() && index == null && n > 1) {
            isolate = n;
            failing = null;
            retryAt = null;
            return failures;
        }
        failing = new Failing(failures, error, index, n);
        retryAt = now + s.retry().backoffNanos(failures);
        return failures;
    }

    /** After contention or a batch too large: halves without counting; at one record, an attempt (returned). */
    Integer contended(String error, int n, Settings s, long now) {
        if (n <= 1) {
            return handlerFailed(error, 0, 1, s, now);
        }
        int left = shrink == null ? n : Math.max(shrink.left(), n);
        shrink = new Shrink(Math.max(n / 2, 1), left);
        retryAt = now + s.retry().backoffNanos(1);
        return null;
    }

    /** After a database outage: retried until it works, with backoff, not counted. */
    int dbFailed(Settings s, long now) {
        dbFailures++;
        retryAt = now + s.retry().backoffNanos(dbFailures);
        return dbFailures;
    }
}
