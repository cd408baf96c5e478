package io.walrelay.consumer;

import java.sql.SQLException;
import java.sql.SQLTransientConnectionException;
import java.util.IdentityHashMap;
import java.util.Set;

/**
 * What a failed batch's error means for its retry (the Rust crate's
 * {@code outage.rs}, Python's {@code outage.py}: the same rule).
 *
 * <ul>
 *   <li>{@link #OUTAGE}: the database is unreachable or going away: retried
 *       for as long as it lasts, on new connections, not counted (no
 *       SQLSTATE and the connection is gone or was never opened, class 08,
 *       53 but 53200, 58, 57P01/57P02/57P03);
 *   <li>{@link #SHRINK}: contention or a batch too large (53200, 40P01,
 *       40001, 55P03, 57014): retried in batches of half the size, counted
 *       only at one record;
 *   <li>{@link #BATCH}: anything else: an attempt of the retry policy.
 * </ul>
 * The SQLSTATE is the first {@link SQLException}'s in the error's cause chain.
 */
public enum ErrorClass {
    OUTAGE, SHRINK, BATCH;

    private static final Set<String> SHRINK_STATES = Set.of("53200", "40P01", "40001", "55P03", "57014");
    private static final Set<String> OUTAGE_STATES = Set.of("57P01", "57P02", "57P03");
    private static final Set<String> OUTAGE_CLASSES = Set.of("08", "53", "58");

    /** The class of an error with SQLSTATE {@code state}. */
    public static ErrorClass ofState(String state) {
        if (SHRINK_STATES.contains(state)) {
            return SHRINK;
        }
        if (OUTAGE_STATES.contains(state) || (state.length() >= 2 && OUTAGE_CLASSES.contains(state.substring(0, 2)))) {
            return OUTAGE;
        }
        return BATCH;
    }

    /** The class of {@code error}, which failed a batch whose connection is gone when {@code connGone}. */
    public static ErrorClass of(Throwable error, boolean connGone) {
        if (connGone) {
            return OUTAGE;
        }
        if (error instanceof BatchException.HandlerFailed && error.getCause() instanceof BatchException.HandlerTimedOut) {
            return BATCH;
        }
        SQLException db = databaseError(error);
        if (db == null) {
            return BATCH;
        }
        String state = db.getSQLState();
        if (state == null || state.isEmpty()) {
            return db instanceof SQLTransientConnectionException ? OUTAGE : BATCH;
        }
        return ofState(state);
    }

    /** The first SQLException of the cause chain. */
    static SQLException databaseError(Throwable error) {
        IdentityHashMap<Throwable, Boolean> seen = new IdentityHashMap<>();
        for (Throwable t = error; t != null && seen.put(t, Boolean.TRUE) == null; t = t.getCause()) {
            if (t instanceof SQLException e) {
                return e;
            }
        }
        return null;
    }
}
