package io.walrelay.consumer;

import java.util.AbstractList;
import java.util.Arrays;
import java.util.RandomAccess;

/**
 * Indexes of a batch's records as a read-only {@link java.util.List} kept in
 * an {@code int[]}: a {@link BatchPlan} lists up to a batch's worth of them
 * per transaction, and a list of boxed integers allocates one object per
 * index above 127. Boxed only when read through {@link #get}.
 */
final class Indexes extends AbstractList<Integer> implements RandomAccess {
    private int[] values;
    private int size;

    Indexes(int capacity) {
        values = new int[Math.max(capacity, 1)];
    }

    /** Appends {@code index} while the plan is being made (before the list is handed out). */
    void append(int index) {
        if (size == values.length) {
            values = Arrays.copyOf(values, size * 2);
        }
        values[size++] = index;
    }

    /** The index at {@code i}, unboxed. */
    int at(int i) {
        if (i < 0 || i >= size) {
            throw new IndexOutOfBoundsException("index " + i + " of " + size);
        }
        return values[i];
    }

    @Override
    public Integer get(int i) {
        return at(i);
    }

    @Override
    public int size() {
        return size;
    }
}
