package io.walrelay.consumer;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
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
        byte[] key = null, source = null, lsn = null, commitLsn = null, prevKey = null, prev = null;
        int seen = 0;
        List<String> others = null;
        for (Header h : headers) {
            String name = h.key();
            int bit = knownBit(name);
            if (bit == 0) {
                if (Headers.isReserved(name)) {
                    others = noteOther(others, name);
                }
                continue;
            }
            if ((seen & bit) != 0) {
                throw MetaException.duplicate(name);
            }
            seen |= bit;
            byte[] v = h.value();
            switch (bit) {
                case KEY_BIT -> key = v;
                case SOURCE_BIT -> source = v;
                case LSN_BIT -> lsn = v;
                case COMMIT_BIT -> commitLsn = v;
                case PREV_KEY_BIT -> prevKey = v;
                case PREV_BIT -> prev = v;
                default -> { }
            }
        }
        boolean hasKey = (seen & KEY_BIT) != 0, hasSource = (seen & SOURCE_BIT) != 0, hasLsn = (seen & LSN_BIT) != 0,
                hasCommit = (seen & COMMIT_BIT) != 0, hasPrevKey = (seen & PREV_KEY_BIT) != 0,
                hasPrev = (seen & PREV_BIT) != 0;
        String keyText = required(Headers.IDEMPOTENCY_KEY, hasKey ? key : null);
        String parsedKey = parseKey(Headers.IDEMPOTENCY_KEY, keyText);
        String sourceText = required(Headers.SOURCE, hasSource ? source : null);
        if (sourceText.isEmpty()) {
            throw new MetaException(MetaException.Kind.EMPTY_SOURCE, Headers.SOURCE, "the \"" + Headers.SOURCE
                    + "\" header is empty: walrelay always names the source (cluster/database/slot, or "
                    + "relay.source_id)");
        }
        String previous = null;
        if (hasPrevKey && hasPrev) {
            throw MetaException.twoPreviousKeys();
        } else if (hasPrev) {
            String text = optional(Headers.PREV, prev);
            if (text != null && !text.isEmpty()) {
                try {
                    previous = Keys.fromCompact(text);
                } catch (Keys.KeyFormatException e) {
                    throw MetaException.bad(MetaException.Kind.BAD_KEY, Headers.PREV, text, e.getMessage());
                }
            }
        } else {
            String text = optional(Headers.PREV_KEY, hasPrevKey ? prevKey : null);
            if (text != null && !text.isEmpty()) {
                previous = parseKey(Headers.PREV_KEY, text);
            }
        }
        return new RecordMeta(parsedKey, sourceText,
                parseLsn(Headers.LSN, optional(Headers.LSN, hasLsn ? lsn : null)),
                parseLsn(Headers.COMMIT_LSN, optional(Headers.COMMIT_LSN, hasCommit ? commitLsn : null)),
                previous);
    }

    private static final int KEY_BIT = 1, SOURCE_BIT = 2, LSN_BIT = 4, COMMIT_BIT = 8, PREV_KEY_BIT = 16,
            PREV_BIT = 32, XID_BIT = 64, COMMIT_TIME_BIT = 128, LAYOUT_BIT = 256;

    /**
     * The bit of a reserved name walrelay writes, spelled exactly as it does,
     * or 0. Duplicates of these are found with a bit set, so a record of
     * either header set is parsed without allocating a list of names.
     */
    private static int knownBit(String name) {
        return switch (name) {
            case Headers.IDEMPOTENCY_KEY -> KEY_BIT;
            case Headers.SOURCE -> SOURCE_BIT;
            case Headers.LSN -> LSN_BIT;
            case Headers.COMMIT_LSN -> COMMIT_BIT;
            case Headers.PREV_KEY -> PREV_KEY_BIT;
            case Headers.PREV -> PREV_BIT;
            case Headers.XID -> XID_BIT;
            case Headers.COMMIT_TIME -> COMMIT_TIME_BIT;
            case Headers.LAYOUT -> LAYOUT_BIT;
            default -> 0;
        };
    }

    /**
     * Notes a reserved name walrelay does not write (or a known one in another
     * case), refused when seen before; the list is made only for such a record.
     */
    private static List<String> noteOther(List<String> others, String name) throws MetaException {
        List<String> list = others == null ? new ArrayList<>(4) : others;
        if (list.contains(name)) {
            throw MetaException.duplicate(name);
        }
        list.add(name);
        return list;
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
