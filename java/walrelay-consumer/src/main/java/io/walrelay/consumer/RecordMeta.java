package io.walrelay.consumer;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.apache.kafka.common.header.Header;

/**
 * The walrelay metadata of one record, parsed from its headers (the Rust
 * crate's {@code RecordMeta}).
 *
 * @param key the idempotency key, 32 lowercase hex digits
 * @param source where the key sequence comes from ({@code walrelay-source})
 * @param lsn the event's LSN ({@code walrelay-lsn}), or null
 * @param commitLsn the commit record's start ({@code walrelay-commit-lsn}), or null
 * @param prevKey the key sent before this one to the same partition in the
 *     same relay session, or null for a session's first record
 */
public record RecordMeta(String key, String source, Long lsn, Long commitLsn, String prevKey) {

    /**
     * Parses the walrelay headers out of a record's headers, in record order.
     * Other headers are ignored. A reserved name ({@code idempotency-key} or
     * any {@code walrelay-*}) present twice is refused, and so is a record
     * carrying both forms of the previous key.
     */
    public static RecordMeta fromHeaders(Iterable<Header> headers) throws MetaException {
        return of(HeaderScan.of(headers), null);
    }

    /**
     * The meta of a scanned record. {@code sourceHint}, the previous record's
     * source in the same partition (or null), is returned as the source when
     * the header says the same: one source string per partition instead of
     * one per record, its hash computed once for the lookups every batch
     * makes by source.
     */
    static RecordMeta of(HeaderScan scan, String sourceHint) throws MetaException {
        return of(scan, sourceHint, null);
    }

    /**
     * {@link #of(HeaderScan, String)} with the hint's header bytes too
     * ({@code sourceHintBytes}, or null): the header's bytes equal to them
     * name the same source (one comparison of arrays instead of one per
     * character of the text).
     */
    static RecordMeta of(HeaderScan scan, String sourceHint, byte[] sourceHintBytes) throws MetaException {
        if (scan.error != null) {
            throw scan.error;
        }
        byte[] key = scan.key, source = scan.source, lsn = scan.lsn, commitLsn = scan.commitLsn,
                prevKey = scan.prevKey, prev = scan.prev;
        boolean hasKey = scan.has(HeaderScan.KEY), hasSource = scan.has(HeaderScan.SOURCE),
                hasLsn = scan.has(HeaderScan.LSN), hasCommit = scan.has(HeaderScan.COMMIT_LSN),
                hasPrevKey = scan.has(HeaderScan.PREV_KEY), hasPrev = scan.has(HeaderScan.PREV);
        // The relay's own form first (KeyBytes); the general path for the rest and for every refusal.
        String parsedKey = hasKey ? KeyBytes.hex(key) : null;
        if (parsedKey == null) {
            parsedKey = parseKey(Headers.IDEMPOTENCY_KEY, required(Headers.IDEMPOTENCY_KEY, hasKey ? key : null));
        }
        String sourceText = hasSource && sourceHint != null
                && (sourceHintBytes != null ? Arrays.equals(source, sourceHintBytes) : sameAscii(source, sourceHint))
                ? sourceHint : required(Headers.SOURCE, hasSource ? source : null);
        if (sourceText.isEmpty()) {
            throw new MetaException(MetaException.Kind.EMPTY_SOURCE, Headers.SOURCE, "the \"" + Headers.SOURCE
                    + "\" header is empty: walrelay always names the source (cluster/database/slot, or "
                    + "relay.source_id)");
        }
        String previous = null;
        if (hasPrevKey && hasPrev) {
            throw MetaException.twoPreviousKeys();
        } else if (hasPrev) {
            previous = prev == null || prev.length == 0 ? null : KeyBytes.compact(prev);
            String text = previous != null ? null : optional(Headers.PREV, prev);
            if (text != null && !text.isEmpty()) {
                try {
                    previous = Keys.fromCompact(text);
                } catch (Keys.KeyFormatException e) {
                    throw MetaException.bad(MetaException.Kind.BAD_KEY, Headers.PREV, text, e.getMessage());
                }
            }
        } else {
            previous = hasPrevKey ? KeyBytes.hex(prevKey) : null;
            String text = previous != null ? null : optional(Headers.PREV_KEY, hasPrevKey ? prevKey : null);
            if (text != null && !text.isEmpty()) {
                previous = parseKey(Headers.PREV_KEY, text);
            }
        }
        return new RecordMeta(parsedKey, sourceText,
                parseLsn(Headers.LSN, optional(Headers.LSN, hasLsn ? lsn : null)),
                parseLsn(Headers.COMMIT_LSN, optional(Headers.COMMIT_LSN, hasCommit ? commitLsn : null)),
                previous);
    }

    /** Whether {@code bytes} are the ASCII text of {@code text}. */
    private static boolean sameAscii(byte[] bytes, String text) {
        if (bytes == null || text == null || bytes.length != text.length()) {
            return false;
        }
        for (int i = 0; i < bytes.length; i++) {
            if (bytes[i] != text.charAt(i) || bytes[i] < 0) {
                return false;
            }
        }
        return true;
    }

    @Override
    public String toString() {
        return "key " + key + " from " + source;
    }

    private static String required(String name, byte[] value) throws MetaException {
        if (value == null) {
            throw MetaException.missing(name);
        }
        return text(name, value);
    }

    private static String optional(String name, byte[] value) throws MetaException {
        return value == null ? null : text(name, value);
    }

    private static String text(String name, byte[] value) throws MetaException {
        boolean ascii = true;
        for (byte b : value) {
            if (b < 0) {
                ascii = false;
                break;
            }
        }
        if (ascii) {
            return new String(value, StandardCharsets.US_ASCII);
        }
        try {
            return StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(value)).toString();
        } catch (CharacterCodingException e) {
            throw new MetaException(MetaException.Kind.NOT_UTF8, name,
                    "the \"" + name + "\" header is not UTF-8 (walrelay writes ASCII)");
        }
    }

    private static String parseKey(String name, String text) throws MetaException {
        try {
            return Keys.parseHex(text);
        } catch (Keys.KeyFormatException e) {
            throw MetaException.bad(MetaException.Kind.BAD_KEY, name, text, e.getMessage());
        }
    }

    /** {@code HIGH/LOW}, 1-8 hex digits per half, as PostgreSQL's pg_lsn. */
    static Long parseLsn(String name, String text) throws MetaException {
        if (text == null || text.isEmpty()) {
            return null;
        }
        int slash = text.indexOf('/');
        if (slash < 0) {
            throw MetaException.bad(MetaException.Kind.BAD_LSN, name, text, "no '/' between the halves");
        }
        long high = lsnHalf(name, text, text.substring(0, slash));
        long low = lsnHalf(name, text, text.substring(slash + 1));
        return (high << 32) | low;
    }

    private static long lsnHalf(String name, String text, String half) throws MetaException {
        if (half.isEmpty() || half.length() > 8) {
            throw MetaException.bad(MetaException.Kind.BAD_LSN, name, text, "each half has 1 to 8 hex digits");
        }
        for (int i = 0; i < half.length(); i++) {
            if (Character.digit(half.charAt(i), 16) < 0 || half.charAt(i) > 'f') {
                throw MetaException.bad(MetaException.Kind.BAD_LSN, name, text, "invalid hex digit '" + half.charAt(i) + "'");
            }
        }
        return Long.parseLong(half, 16);
    }
}
