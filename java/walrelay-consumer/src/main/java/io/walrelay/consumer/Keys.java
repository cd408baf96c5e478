package io.walrelay.consumer;

import java.util.Locale;

/**
 * Idempotency keys as text: 32 lowercase hex digits, so that string order is
 * numeric order (docs/contract.md). Keys are kept as {@link String}s.
 */
public final class Keys {
    /** The mark of a new row: below every real key. */
    public static final String INITIAL = "00000000000000000000000000000000";

    private Keys() {}

    /** Parses 32 hex digits (either case) into the canonical lowercase form. */
    public static String parseHex(String text) throws KeyFormatException {
        if (text.length() != 32) {
            throw new KeyFormatException("expected 32 hex digits, got " + text.length() + " characters");
        }
        for (int i = 0; i < 32; i++) {
            if (Character.digit(text.charAt(i), 16) < 0 || text.charAt(i) > 'f') {
                throw new KeyFormatException("invalid hex digit '" + text.charAt(i) + "' at " + i);
            }
        }
        return text.toLowerCase(Locale.ROOT);
    }

    /**
     * Parses the compact form {@code HIGH/LOW} (each half 1-16 hex digits, no
     * leading zeros needed), as the lean header set's {@code walrelay-prev}.
     */
    public static String fromCompact(String text) throws KeyFormatException {
        int slash = text.indexOf('/');
        if (slash < 0) {
            throw new KeyFormatException("not HIGH/LOW");
        }
        return half(text.substring(0, slash)) + half(text.substring(slash + 1));
    }

    private static String half(String t) throws KeyFormatException {
        if (t.isEmpty() || t.length() > 16) {
            throw new KeyFormatException("a half of HIGH/LOW must have 1 to 16 hex digits");
        }
        for (int i = 0; i < t.length(); i++) {
            char c = t.charAt(i);
            if (Character.digit(c, 16) < 0 || c > 'f') {
                throw new KeyFormatException("invalid hex digit '" + c + "' in HIGH/LOW");
            }
        }
        return "0".repeat(16 - t.length()) + t.toLowerCase(Locale.ROOT);
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
