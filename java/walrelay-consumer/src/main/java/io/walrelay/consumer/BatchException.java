package io.walrelay.consumer;

import java.sql.SQLException;
import java.util.List;

/**
 * Why a batch was not committed. In every case its transaction was rolled
 * back (or never committed): no side effect and no mark moved, except for
 * {@link HandlerEndedTransaction}, where the handler itself committed.
 */
public class BatchException extends Exception {
    private static final long serialVersionUID = 1L;

    BatchException(String message, Throwable cause) {
        super(message, cause);
    }

    /** The handler threw. {@link #index()} is the failing record's index in the batch when known. */
    public static final class HandlerFailed extends BatchException {
        private static final long serialVersionUID = 1L;
        private final Integer index;

        HandlerFailed(Throwable error, Integer index) {
            super("the handler failed (rolled back; the high-water marks are unchanged): " + error, error);
            this.index = index;
        }

        /** The failing record's index in the batch, or null when unknown. */
        public Integer index() {
            return index;
        }
    }

    /**
     * The handler ended the batch's transaction itself (COMMIT or ROLLBACK):
     * atomicity was broken; the loop stops the partition whatever its policy.
     */
    public static final class HandlerEndedTransaction extends BatchException {
        private static final long serialVersionUID = 1L;

        HandlerEndedTransaction(Position position, List<Delivery> records, Throwable cause) {
            super(message(position, records), cause);
        }

        private static String message(Position p, List<Delivery> records) {
            long first = records.get(0).record().offset();
            long last = records.get(records.size() - 1).record().offset();
            StringBuilder keys = new StringBuilder();
            for (int i = 0; i < Math.min(5, records.size()); i++) {
                keys.append(i == 0 ? "" : ", ").append(records.get(i).key());
            }
            String more = records.size() > 5 ? " and " + (records.size() - 5) + " more" : "";
            return "the handler ended the transaction of records " + p.topic() + "/" + p.partition()
                    + " offsets " + first + ".." + last + " (keys " + keys + more + ") itself: it ran COMMIT "
                    + "or ROLLBACK, so atomicity was broken (part of the side effects may be committed "
                    + "without the high-water marks, and would be applied again). The partition is "
                    + "stopped: fix the handler (it must not commit or roll back; the loop commits), "
                    + "check these records' side effects by hand, then restart";
        }
    }

    /** A database error of the batch's own statements or of its COMMIT. */
    public static final class DatabaseFailed extends BatchException {
        private static final long serialVersionUID = 1L;

        DatabaseFailed(SQLException error) {
            super("database error while applying a batch (rolled back): " + error.getMessage(), error);
        }
    }

    /** A stored mark is not a key (the table's CHECK prevents it unless changed). */
    public static final class CorruptHwm extends BatchException {
        private static final long serialVersionUID = 1L;

        CorruptHwm(String source, String value, String reason) {
            super("the stored high-water mark \"" + value + "\" of source \"" + source
                    + "\" is not a 32-hex-digit key: " + reason, null);
        }
    }

    /** A mark row disappeared between creating and locking (or raising) it. */
    public static final class RowVanished extends BatchException {
        private static final long serialVersionUID = 1L;

        RowVanished(String source) {
            super("the high-water mark row of source \"" + source + "\" vanished between creating and "
                    + "locking it (deleted concurrently, or not READ COMMITTED)", null);
        }
    }

    /** Parking a record wrote no row (or several): the batch is not committed. */
    public static final class NotParked extends BatchException {
        private static final long serialVersionUID = 1L;

        NotParked(Position p, long offset, String key, int rows) {
            super("parking record " + p.topic() + "/" + p.partition() + " at offset " + offset + " (key "
                    + key + ") wrote " + rows + " rows of walrelay_consumer_parked instead of 1, so the "
                    + "batch was rolled back (its mark would have moved past a record neither applied nor "
                    + "parked): check the table's unique indexes (run the migration again)", null);
        }
    }

    /**
     * The handler returned, but one of its statements had failed and aborted
     * the transaction (an error it caught without a savepoint): COMMIT would
     * have rolled its effects back while the offset moved on. The cause of a
     * {@link HandlerFailed}: a failed attempt.
     */
    public static final class HandlerSwallowedError extends Exception {
        private static final long serialVersionUID = 1L;

        HandlerSwallowedError() {
            super("the handler's transaction was aborted by an error it did not return (a failed "
                    + "statement whose error the handler swallowed): rolled back, the high-water marks are "
                    + "unchanged; use a savepoint around a statement that may fail, or let the error propagate");
        }
    }

    /** A handler call ran past {@link Settings#handlerTimeout()}: a failed attempt; its connection is discarded. */
    public static final class HandlerTimedOut extends Exception {
        private static final long serialVersionUID = 1L;

        HandlerTimedOut(long millis) {
            super("the handler call ran past its timeout of " + millis + " ms: its statement was cancelled, "
                    + "the batch rolled back and its connection discarded");
        }
    }
}
