package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import java.util.Map;
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
    void keys() throws Exception {
        assertEquals("00000000000001050000000000000001", Keys.of(0x105, 1));
        assertEquals(RecordMetaTest.PREV, Keys.fromCompact("1531f10/1532000"));
    }
}
