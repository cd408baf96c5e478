package io.walrelay.consumer;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.postgresql.core.BaseConnection;

/**
 * Bounds each handler call ({@link Settings#handlerTimeout()}): when a call's
 * time is up, the statement running on its connection is cancelled and the
 * worker thread interrupted; the call is then a failed attempt and its
 * connection is discarded. A handler blocked outside the database and deaf
 * to interrupts is declared timed out only when it returns.
 */
final class HandlerWatchdog implements AutoCloseable {
    private final long timeoutMillis;
    private final ScheduledExecutorService timer;

    HandlerWatchdog(long timeoutMillis) {
        this.timeoutMillis = timeoutMillis;
        ScheduledThreadPoolExecutor t = new ScheduledThreadPoolExecutor(1, r -> {
            Thread thread = new Thread(r, "walrelay-handler-watchdog");
            thread.setDaemon(true);
            return thread;
        });
        t.setRemoveOnCancelPolicy(true);
        this.timer = t;
    }

    long timeoutMillis() {
        return timeoutMillis;
    }

    /** Starts timing one call on {@code conn}, on the calling thread. */
    Watch watch(Connection conn) {
        return new Watch(conn, Thread.currentThread());
    }

    @Override
    public void close() {
        timer.shutdownNow();
    }

    /** One timed call. */
    final class Watch {
        private final AtomicBoolean fired = new AtomicBoolean();
        private final AtomicBoolean done = new AtomicBoolean();
        private final ScheduledFuture<?> task;

        Watch(Connection conn, Thread worker) {
            task = timer.schedule(() -> {
                if (done.get()) {
                    return;
                }
                fired.set(true);
                try {
                    conn.unwrap(BaseConnection.class).cancelQuery();
                } catch (SQLException ignored) {
                    // The connection is discarded anyway.
                }
                if (!done.get()) {
                    worker.interrupt();
                }
            }, timeoutMillis, TimeUnit.MILLISECONDS);
        }

        void close() {
            done.set(true);
            task.cancel(false);
            if (fired.get()) {
                Thread.interrupted();
            }
        }

        boolean timedOut() {
            return fired.get();
        }
    }
}
