package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;

class BatchPlanTest {
    static String k(long seq) {
        return Keys.of(0x100 + seq, 0);
    }

    static RecordMeta m(String source, long seq, Long prev) {
        return new RecordMeta(k(seq), source, null, null, prev == null ? null : k(prev));
    }

    @Test
    void duplicatesInsideABatchAndAcrossSources() {
        BatchPlan plan = BatchPlan.of(Map.of("a", k(2)), List.of(m("a", 1, null), m("a", 3, 2L), m("b", 1, null),
                m("a", 2, null), m("a", 4, 3L), m("b", 1, null)));
        assertEquals(List.of(1, 2, 4), plan.apply());
        assertEquals(3, plan.duplicates());
        assertEquals(Map.of("a", k(4), "b", k(1)), plan.raised());
        assertEquals(0, plan.gaps().size());
    }

    @Test
    void gapsAreFoundButNotAgainstTheInitialMark() {
        BatchPlan plan = BatchPlan.of(Map.of("a", k(2)), List.of(m("a", 5, 4L), m("b", 9, 8L)));
        assertEquals(List.of(0, 1), plan.apply());
        assertEquals(1, plan.gaps().size());
        assertEquals(new BatchPlan.Gap(0, "a", k(2), k(4)), plan.gaps().get(0));
    }

    @Test
    void sourcesAreSorted() {
        assertEquals(List.of("a", "b"), BatchPlan.sources(List.of(m("b", 1, null), m("a", 1, null), m("b", 2, null))));
    }

    @Test
    void oneSourceIsOneLock() {
        assertEquals(List.of("a"), BatchPlan.sources(List.of(m("a", 1, null), m("a", 2, null))));
        assertEquals(List.of(), BatchPlan.sources(List.of()));
    }

    /**
     * The plan keeps the running mark of the current source in a local: it
     * must decide exactly as the plain rule (a map lookup and update per
     * record), sources interleaved or not, in the order sources were raised.
     */
    @Test
    void theSameDecisionsAsThePlainRule() {
        Random random = new Random(40);
        for (int round = 0; round < 2000; round++) {
            int n = random.nextInt(12);
            int sourceCount = 1 + random.nextInt(3);
            List<RecordMeta> records = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                long seq = random.nextInt(10);
                Long prev = random.nextInt(3) == 0 ? null : (long) random.nextInt(10);
                records.add(m("s" + random.nextInt(sourceCount), seq, prev));
            }
            Map<String, String> marks = new LinkedHashMap<>();
            if (random.nextBoolean()) {
                marks.put("s0", k(random.nextInt(6)));
            }
            BatchPlan plan = BatchPlan.of(marks, records);
            BatchPlan plain = plainRule(marks, records);
            assertEquals(plain, plan, records.toString());
            assertEquals(List.copyOf(plain.raised().keySet()), List.copyOf(plan.raised().keySet()));
            assertEquals(new ArrayList<>(new TreeSet<>(records.stream().map(RecordMeta::source).toList())),
                    BatchPlan.sources(records));
        }
    }

    /** The rule as docs/consumer.md states it, one map update per record. */
    private static BatchPlan plainRule(Map<String, String> marks, List<RecordMeta> records) {
        List<Integer> apply = new ArrayList<>();
        List<BatchPlan.Gap> gaps = new ArrayList<>();
        Map<String, String> raised = new LinkedHashMap<>();
        int duplicates = 0;
        for (int i = 0; i < records.size(); i++) {
            RecordMeta meta = records.get(i);
            String running = raised.getOrDefault(meta.source(), marks.getOrDefault(meta.source(), Keys.INITIAL));
            if (meta.key().compareTo(running) <= 0) {
                duplicates++;
                continue;
            }
            if (meta.prevKey() != null && !running.equals(Keys.INITIAL) && meta.prevKey().compareTo(running) > 0) {
                gaps.add(new BatchPlan.Gap(i, meta.source(), running, meta.prevKey()));
            }
            apply.add(i);
            raised.put(meta.source(), meta.key());
        }
        return new BatchPlan(apply, duplicates, gaps, raised);
    }

    @Test
    void keys() throws Exception {
        assertEquals("00000000000001050000000000000001", Keys.of(0x105, 1));
        assertEquals(RecordMetaTest.PREV, Keys.fromCompact("1531f10/1532000"));
    }
}
