package io.walrelay.consumer;

/**
 * Why a record's headers are not usable walrelay metadata: a required header
 * missing, a malformed value, a reserved header twice, or both forms of the
 * previous key. Such a record goes to the poison policy.
 */
public final class MetaException extends Exception {
    private static final long serialVersionUID = 1L;

    /** What is wrong. */
    public enum Kind { MISSING_HEADER, NOT_UTF8, EMPTY_SOURCE, BAD_KEY, DUPLICATE_HEADER, TWO_PREVIOUS_KEYS, BAD_LSN }

    private final Kind kind;
    private final String header;

    MetaException(Kind kind, String header, String message) {
        super(message);
        this.kind = kind;
        this.header = header;
    }

    /** What is wrong. */
    public Kind kind() {
        return kind;
    }

    /** The header concerned. */
    public String header() {
        return header;
    }

    static MetaException missing(String header) {
        return new MetaException(Kind.MISSING_HEADER, header, "the record has no \"" + header
                + "\" header: it was not produced by walrelay, or its headers were stripped by a proxy "
                + "or bridge on the way");
    }

    static MetaException duplicate(String header) {
        return new MetaException(Kind.DUPLICATE_HEADER, header, "the record carries the walrelay header \""
                + header + "\" more than once: walrelay writes each of its headers exactly once, so one "
                + "copy was added by someone else (an application header named like walrelay's, or a "
                + "proxy); the record is not trusted");
    }

    static MetaException twoPreviousKeys() {
        return new MetaException(Kind.TWO_PREVIOUS_KEYS, Headers.PREV, "the record carries both \""
                + Headers.PREV_KEY + "\" and \"" + Headers.PREV + "\": walrelay writes one of them (the "
                + "full or the lean header set), so one was added by someone else; the record is not "
                + "trusted");
    }

    static MetaException bad(Kind kind, String header, String value, String reason) {
        return new MetaException(kind, header, "the \"" + header + "\" header \"" + value + "\" is not "
                + (kind == Kind.BAD_LSN ? "an LSN" : "an idempotency key") + ": " + reason);
    }
}
