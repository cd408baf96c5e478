package io.walrelay.consumer;

import java.nio.charset.StandardCharsets;

/**
 * Keys read straight from a header's bytes in the form the relay writes
 * them (lowercase ASCII hex): one pass over the bytes and one String per
 * key. This runs for every consumed record on the poll thread, which also
 * parses Kafka's fetches for every partition; in a JVM that has not
 * compiled it yet, a per-character loop calling {@code String.charAt} and a
 * digit test costs microseconds per record, a byte loop with a table
 * lookup a fraction of that.
 *
 * <p>Anything else (uppercase digits, wrong lengths, non-ASCII, garbage)
 * gives null, and {@link RecordMeta} then takes the general path (text,
 * then {@link Keys}), which accepts the other valid forms and words the
 * refusals: for every input where these answer, the general path gives
 * the same key.
 */
final class KeyBytes {
    /** {@code LOWER_HEX[b & 0xff]}: whether byte {@code b} is one of {@code 0-9a-f}. */
    private static final boolean[] LOWER_HEX = new boolean[256];

    static {
        for (char c = '0'; c <= '9'; c++) {
            LOWER_HEX[c] = true;
        }
        for (char c = 'a'; c <= 'f'; c++) {
            LOWER_HEX[c] = true;
        }
    }

    private KeyBytes() {}

    /** 32 lowercase hex digits as they are, or null. */
    static String hex(byte[] value) {
        if (value == null || value.length != 32) {
            return null;
        }
        for (int i = 0; i < 32; i++) {
            if (!LOWER_HEX[value[i] & 0xff]) {
                return null;
            }
        }
        // Latin-1 of ASCII: the bytes are the string's own (a copy, no decoding).
        return new String(value, StandardCharsets.ISO_8859_1);
    }

    /**
     * The compact form {@code HIGH/LOW} (each half 1-16 lowercase hex
     * digits) as 32 digits, each half left-padded with zeros, or null.
     */
    static String compact(byte[] value) {
        if (value == null) {
            return null;
        }
        int slash = -1;
        for (int i = 0; i < value.length; i++) {
            if (value[i] == '/') {
                slash = i;
                break;
            }
        }
        int lowLen = value.length - slash - 1;
        if (slash < 1 || slash > 16 || lowLen < 1 || lowLen > 16) {
            return null;
        }
        byte[] digits = new byte[32];
        if (!half(value, 0, slash, digits, 0) || !half(value, slash + 1, value.length, digits, 16)) {
            return null;
        }
        return new String(digits, StandardCharsets.ISO_8859_1);
    }

    /** Copies {@code value[from, to)} right-aligned into {@code out[at, at + 16)} after zeros; false on a non-digit. */
    private static boolean half(byte[] value, int from, int to, byte[] out, int at) {
        int pad = 16 - (to - from);
        for (int i = 0; i < pad; i++) {
            out[at + i] = '0';
        }
        for (int i = from, j = at + pad; i < to; i++, j++) {
            byte b = value[i];
            if (!LOWER_HEX[b & 0xff]) {
                return false;
            }
            out[j] = b;
        }
        return true;
    }
}
