package io.walrelay.consumer;

import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.common.header.Header;

/**
 * One pass over a record's headers: walrelay's values picked out, every
 * reserved name ({@code idempotency-key}, {@code walrelay-*}) refused when it
 * comes twice, and the headers' bytes counted for the partition's queue.
 * {@link RecordMeta} then parses the values.
 *
 * <p>It runs once per consumed record, so the names walrelay writes are told
 * apart by their length and one comparison (no hash of a name that is new
 * for every record), and duplicates of them are found with a bit set; a list
 * is made only for a reserved name walrelay does not write.
 */
final class HeaderScan {
    static final int KEY = 1, SOURCE = 2, LSN = 4, COMMIT_LSN = 8, PREV_KEY = 16, PREV = 32, XID = 64,
            COMMIT_TIME = 128, LAYOUT = 256;

    byte[] key, source, lsn, commitLsn, prevKey, prev;
    /** The bits of the known names seen (a name present with a null value counts as present). */
    int seen;
    /** Names and values, in bytes, of every header. */
    long bytes;
    /** The first refusal: a reserved name seen twice. The bytes are still counted after it. */
    MetaException error;
    private List<String> others;

    /** Scans every header of a record, in record order. */
    static HeaderScan of(Iterable<Header> headers) {
        HeaderScan scan = new HeaderScan();
        for (Header h : headers) {
            scan.add(h.key(), h.value());
        }
        return scan;
    }

    void add(String name, byte[] value) {
        bytes += name.length() + (value == null ? 0 : value.length);
        if (error != null) {
            return;
        }
        int bit = knownBit(name);
        if (bit == 0) {
            if (Headers.isReserved(name)) {
                noteOther(name);
            }
            return;
        }
        if ((seen & bit) != 0) {
            error = MetaException.duplicate(name);
            return;
        }
        seen |= bit;
        switch (bit) {
            case KEY -> key = value;
            case SOURCE -> source = value;
            case LSN -> lsn = value;
            case COMMIT_LSN -> commitLsn = value;
            case PREV_KEY -> prevKey = value;
            case PREV -> prev = value;
            default -> { }
        }
    }

    boolean has(int bit) {
        return (seen & bit) != 0;
    }

    /** A reserved name walrelay does not write (or a known one in another case). */
    private void noteOther(String name) {
        if (others == null) {
            others = new ArrayList<>(4);
        }
        if (others.contains(name)) {
            error = MetaException.duplicate(name);
        } else {
            others.add(name);
        }
    }

    /** The bit of a name walrelay writes, spelled exactly as it does, or 0. */
    static int knownBit(String name) {
        return switch (name.length()) {
            case 12 -> name.equals(Headers.LSN) ? LSN : name.equals(Headers.XID) ? XID : 0;
            case 13 -> name.equals(Headers.PREV) ? PREV : 0;
            case 15 -> name.equals(Headers.IDEMPOTENCY_KEY) ? KEY
                    : name.equals(Headers.SOURCE) ? SOURCE
                    : name.equals(Headers.LAYOUT) ? LAYOUT : 0;
            case 17 -> name.equals(Headers.PREV_KEY) ? PREV_KEY : 0;
            case 19 -> name.equals(Headers.COMMIT_LSN) ? COMMIT_LSN : 0;
            case 20 -> name.equals(Headers.COMMIT_TIME) ? COMMIT_TIME : 0;
            default -> 0;
        };
    }
}
