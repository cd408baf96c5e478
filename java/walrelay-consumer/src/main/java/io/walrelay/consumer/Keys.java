package io.walrelay.consumer;

import java.util.Arrays;
import java.util.Locale;

/**
 * Idempotency keys as text: 32 lowercase hex digits, so that string order is
 * numeric order (docs/contract.md). Keys are kept as {@link String}s.
 */
public final class Keys {
    /** The mark of a new row: below every real key. */
    public static final String INITIAL = "00000000000000000000000000000000";

    private Keys() {}

    /**
     * Parses 32 hex digits (either case) into the canonical lowercase form. A
     * key already in that form is returned as it is: this runs once per
     * consumed record, so it allocates nothing in the common case.
     */
    public static String parseHex(String text) throws KeyFormatException {
        if (text.length() != 32) {
            throw new KeyFormatException("expected 32 hex digits, got " + text.length() + " characters");
        }
        boolean lower = true;
        for (int i = 0; i < 32; i++) {
            char c = text.charAt(i);
            if (!isHex(c)) {
                throw new KeyFormatException("invalid hex digit '" + c + "' at " + i);
            }
            lower &= c < 'A' || c > 'F';
        }
        return lower ? text : text.toLowerCase(Locale.ROOT);
    }

    /**
     * Parses the compact form {@code HIGH/LOW} (each half 1-16 hex digits, no
     * leading zeros needed), as the lean header set's {@code walrelay-prev}.
     * The 32 digits are written into one buffer (no substrings or
     * concatenations: this runs once per consumed record).
     */
    public static String fromCompact(String text) throws KeyFormatException {
        int slash = text.indexOf('/');
        if (slash < 0) {
            throw new KeyFormatException("not HIGH/LOW");
        }
        char[] digits = new char[32];
        half(text, 0, slash, digits, 0);
        half(text, slash + 1, text.length(), digits, 16);
        return new String(digits);
    }

    /** Writes {@code text[from, to)} lowercased and left-padded with zeros into {@code out[at, at + 16)}. */
    private static void half(String text, int from, int to, char[] out, int at) throws KeyFormatException {
        int len = to - from;
        if (len < 1 || len > 16) {
            throw new KeyFormatException("a half of HIGH/LOW must have 1 to 16 hex digits");
        }
        int pad = 16 - len;
        Arrays.fill(out, at, at + pad, '0');
        for (int i = 0; i < len; i++) {
            char c = text.charAt(from + i);
            if (!isHex(c)) {
                throw new KeyFormatException("invalid hex digit '" + c + "' in HIGH/LOW");
            }
            out[at + pad + i] = c >= 'A' && c <= 'F' ? (char) (c + ('a' - 'A')) : c;
        }
    }

    /** An ASCII hex digit, either case (what {@code Character.digit(c, 16)} accepts below {@code 'g'}). */
    private static boolean isHex(char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    }

    /** The key of two 64-bit halves, 32 lowercase hex digits. */
    public static String of(long high, long low) {
        return String.format("%016x%016x", high, low);
    }

    /** Why a text is not a key. */
    public static final class KeyFormatException extends Exception {
        private static final long serialVersionUID = 1L;

        KeyFormatException(String reason) {
            super(reason);
        }
    }
}
