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
     * local while the source stays the same and written to {@code raised} when
     * it changes and at the end (the map's order is still the order in which
     * sources were first raised).
     */
    public static BatchPlan of(Map<String, String> marks, List<RecordMeta> records) {
        Indexes apply = new Indexes(records.size());
        List<Gap> gaps = new ArrayList<>(0);
        Map<String, String> raised = new LinkedHashMap<>(2);
        int duplicates = 0;
        String current = null;
        String running = null;
        boolean dirty = false;
        for (int i = 0; i < records.size(); i++) {
            RecordMeta meta = records.get(i);
            String source = meta.source();
            if (!source.equals(current)) {
                if (dirty) {
                    raised.put(current, running);
                }
                current = source;
                dirty = false;
                running = raised.get(source);
                if (running == null) {
                    running = marks.getOrDefault(source, Keys.INITIAL);
                }
            }
            String key = meta.key();
            if (key.compareTo(running) <= 0) {
                duplicates++;
                continue;
            }
            String prev = meta.prevKey();
            if (prev != null && !running.equals(Keys.INITIAL) && prev.compareTo(running) > 0) {
                gaps.add(new Gap(i, source, running, prev));
            }
            apply.append(i);
            if (!dirty) {
                raised.put(source, key);
            }
            running = key;
            dirty = true;
        }
        if (dirty) {
            raised.put(current, running);
        }
        return new BatchPlan(apply, duplicates, gaps, raised);
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
