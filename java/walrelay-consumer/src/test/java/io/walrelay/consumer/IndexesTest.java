package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class IndexesTest {
    @Test
    void aListOfItsIndexesGrowingPastItsCapacity() {
        Indexes indexes = new Indexes(2);
        List<Integer> expected = new ArrayList<>();
        for (int i = 0; i < 1000; i += 3) {
            indexes.append(i);
            expected.add(i);
        }
        assertEquals(expected, indexes);
        assertEquals(indexes, expected);
        assertEquals(expected.hashCode(), indexes.hashCode());
        assertEquals(999, indexes.at(indexes.size() - 1));
        assertEquals(Integer.valueOf(999), indexes.get(indexes.size() - 1));
        assertEquals(List.of(), new Indexes(0));
    }

    @Test
    void readOnlyAndBounded() {
        Indexes indexes = new Indexes(4);
        indexes.append(7);
        assertThrows(UnsupportedOperationException.class, () -> indexes.add(8));
        assertThrows(UnsupportedOperationException.class, () -> indexes.remove(0));
        assertThrows(IndexOutOfBoundsException.class, () -> indexes.get(1));
        assertThrows(IndexOutOfBoundsException.class, () -> indexes.at(-1));
    }
}
