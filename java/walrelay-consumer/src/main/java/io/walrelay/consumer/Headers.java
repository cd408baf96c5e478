package io.walrelay.consumer;

/**
 * The names of walrelay's record headers (docs/contract.md, docs/relay.md),
 * the same as the Rust crate's {@code walrelay_contract::header}.
 */
public final class Headers {
    /** The 128-bit idempotency key, 32 hex digits. */
    public static final String IDEMPOTENCY_KEY = "idempotency-key";
    /** Where the key sequence comes from: cluster, database and slot. */
    public static final String SOURCE = "walrelay-source";
    /** The LSN the server reported for the event (full header set). */
    public static final String LSN = "walrelay-lsn";
    /** The start of the transaction's commit record (full header set). */
    public static final String COMMIT_LSN = "walrelay-commit-lsn";
    /** The previous key in the partition, 32 hex digits (full header set). */
    public static final String PREV_KEY = "walrelay-prev-key";
    /** The previous key in the compact form {@code HIGH/LOW} (lean header set). */
    public static final String PREV = "walrelay-prev";
    /** The transaction id (full header set). */
    public static final String XID = "walrelay-xid";
    /** The commit time (full header set). */
    public static final String COMMIT_TIME = "walrelay-commit-time";
    /** The header set's layout version. */
    public static final String LAYOUT = "walrelay-layout";
    /** Every header starting with this is walrelay's. */
    public static final String RESERVED_PREFIX = "walrelay-";

    private Headers() {}

    /**
     * Whether a header name belongs to walrelay ({@code idempotency-key} and
     * every {@code walrelay-*}, in any case): an application never sets one.
     */
    public static boolean isReserved(String name) {
        return name.equalsIgnoreCase(IDEMPOTENCY_KEY)
                || name.regionMatches(true, 0, RESERVED_PREFIX, 0, RESERVED_PREFIX.length());
    }
}
