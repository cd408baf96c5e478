package io.walrelay.consumer;

import java.sql.Connection;
import java.util.List;

/**
 * How a batch calls its handler: once with the new records (a batch
 * handler) or once per new record (a per-record handler), each call inside
 * the {@link HandlerScope} and under the {@link HandlerWatchdog} when the
 * loop has a handler timeout.
 */
abstract class HandlerCalls {
    /** A handler's failure inside a batch, with the failing record's index among the new records if known. */
    static final class Failed extends Exception {
        private static final long serialVersionUID = 1L;
        final Throwable error;
        final Integer index;

        Failed(Throwable error, Integer index) {
            super(error);
            this.error = error;
            this.index = index;
        }
    }

    abstract void run(Connection conn, List<Delivery> fresh) throws Failed;

    static HandlerCalls perBatch(BatchHandler handler, HandlerScope scope, HandlerWatchdog watchdog) {
        return new HandlerCalls() {
            @Override
            void run(Connection conn, List<Delivery> fresh) throws Failed {
                call(conn, scope, watchdog, () -> handler.apply(conn, fresh), fresh.size() == 1 ? 0 : null);
            }
        };
    }

    static HandlerCalls perRecord(RecordHandler handler, HandlerScope scope, HandlerWatchdog watchdog) {
        return new HandlerCalls() {
            @Override
            void run(Connection conn, List<Delivery> fresh) throws Failed {
                for (int i = 0; i < fresh.size(); i++) {
                    Delivery d = fresh.get(i);
                    call(conn, scope, watchdog, () -> handler.apply(conn, d), i);
                }
            }
        };
    }

    private static void call(Connection conn, HandlerScope scope, HandlerWatchdog watchdog, HandlerScope.Call call,
            Integer index) throws Failed {
        HandlerWatchdog.Watch watch = watchdog == null ? null : watchdog.watch(conn);
        Throwable error = null;
        try {
            scope.run(conn, call);
        } catch (Exception | AssertionError e) {
            error = e;
        } finally {
            if (watch != null) {
                watch.close();
            }
        }
        if (watch != null && watch.timedOut()) {
            BatchException.HandlerTimedOut timedOut = new BatchException.HandlerTimedOut(watchdog.timeoutMillis());
            if (error != null) {
                timedOut.addSuppressed(error);
            }
            throw new Failed(timedOut, index);
        }
        if (error != null) {
            throw new Failed(error, index);
        }
    }
}
