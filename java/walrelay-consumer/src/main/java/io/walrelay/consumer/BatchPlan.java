package io.walrelay.consumer;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * Which records of a batch are new: the pure decision behind every batch
 * transaction (the Rust crate's {@code batch.rs}, Python's {@code batch.py}).
 *
 * <p>Walking the batch in order with a running mark per source (the stored
 * mark, then raised by every record taken): a key at or below it is a
 * duplicate, dropped; above it, new, applied, and the running mark becomes
 * its key. A new record whose previous key is above the running mark is also
 * a gap (still applied); a running mark at its initial value is never
 * compared, since new groups start mid-stream.
 *
 * @param apply indexes of the new records, in batch order
 * @param duplicates how many records were duplicates
 * @param gaps gaps revealed by new records
 * @param raised the marks after the batch, for every source whose mark rises
 */
public record BatchPlan(List<Integer> apply, int duplicates, List<Gap> gaps, Map<String, String> raised) {

    /**
     * A gap: the record the relay sent before record {@code index} was never processed.
     *
     * @param index the record's index in the batch
     * @param source its source
     * @param hwm the running mark it was compared with
     * @param prev its previous key, above the mark
     */
    public record Gap(int index, String source, String hwm, String prev) {}

    /**
     * Decides every record against {@code marks} (a missing source is at {@link Keys#INITIAL}).
     *
     * <p>A batch is nearly always one source, so the running mark is kept in a
     * field while the source stays the same and written to {@code raised} when
     * it changes and at the end (the map's order is still the order in which
     * sources were first raised).
     *
     * <p>The loop holds only what every record needs (two comparisons, an
     * index appended); a change of source, a gap and the map's writes are
     * methods of {@link Running} called once per run of a source or per gap.
     * The JIT then compiles a small loop: this method is compiled several
     * times early in a run (tiered, then on-stack replacement), and with the
     * maps inlined it was the costliest of walrelay's compilations.
     */
    public static BatchPlan of(Map<String, String> marks, List<RecordMeta> records) {
        Running run = new Running(marks, records.size());
        for (int i = 0; i < records.size(); i++) {
            RecordMeta meta = records.get(i);
            String source = meta.source();
            if (source != run.source && !source.equals(run.source)) {
                run.switchTo(source);
            }
            String key = meta.key();
            if (key.compareTo(run.mark) <= 0) {
                run.duplicates++;
                continue;
            }
            String prev = meta.prevKey();
            if (prev != null && prev.compareTo(run.mark) > 0) {
                run.gapUnlessInitial(i, prev);
            }
            run.apply.append(i);
            if (!run.dirty) {
                run.firstRaise(key);
            }
            run.mark = key;
        }
        return run.plan();
    }

    /** The state of {@link #of} while it walks a batch: the current source's running mark and what is decided. */
    private static final class Running {
        final Map<String, String> marks;
        final Indexes apply;
        final List<Gap> gaps = new ArrayList<>(0);
        final Map<String, String> raised = new LinkedHashMap<>(2);
        int duplicates;
        /** The current source (null before the first record) and its running mark. */
        String source;
        String mark;
        /** The current source's mark rose since it became current: {@code raised} is behind {@code mark}. */
        boolean dirty;

        Running(Map<String, String> marks, int size) {
            this.marks = marks;
            this.apply = new Indexes(size);
        }

        void switchTo(String next) {
            if (dirty) {
                raised.put(source, mark);
            }
            source = next;
            dirty = false;
            String r = raised.get(next);
            mark = r != null ? r : marks.getOrDefault(next, Keys.INITIAL);
        }

        /** A new record whose previous key is above the running mark: a gap, unless the mark is the initial one. */
        void gapUnlessInitial(int index, String prev) {
            if (!mark.equals(Keys.INITIAL)) {
                gaps.add(new Gap(index, source, mark, prev));
            }
        }

        /** The first new record of this run of the source: its entry in {@code raised} keeps the first-raised order. */
        void firstRaise(String key) {
            raised.put(source, key);
            dirty = true;
        }

        BatchPlan plan() {
            if (dirty) {
                raised.put(source, mark);
            }
            return new BatchPlan(apply, duplicates, gaps, raised);
        }
    }

    /** Whether nothing in the batch is new. */
    public boolean allDuplicates() {
        return apply.isEmpty();
    }

    /**
     * The distinct sources of a batch, sorted: the rows the batch locks
     * (the lock statement itself orders them on the server).
     */
    public static List<String> sources(List<RecordMeta> records) {
        if (records.isEmpty()) {
            return List.of();
        }
        String first = records.get(0).source();
        int i = 1;
        while (i < records.size() && records.get(i).source().equals(first)) {
            i++;
        }
        if (i == records.size()) {
            return List.of(first);
        }
        TreeSet<String> set = new TreeSet<>();
        set.add(first);
        for (; i < records.size(); i++) {
            set.add(records.get(i).source());
        }
        return new ArrayList<>(set);
    }
}
