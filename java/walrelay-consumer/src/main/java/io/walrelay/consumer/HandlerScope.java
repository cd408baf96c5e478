package io.walrelay.consumer;

import java.sql.Connection;

/**
 * Runs each handler call; the place where a framework makes the batch's
 * connection and transaction its own (the Spring module binds it to the
 * application's DataSource, so JdbcTemplate and {@code @Transactional}
 * join the batch's transaction).
 */
@FunctionalInterface
public interface HandlerScope {
    /** Calls the handler directly. */
    HandlerScope DIRECT = (conn, call) -> call.run();

    void run(Connection conn, Call call) throws Exception;

    /** One handler call. */
    @FunctionalInterface
    interface Call {
        void run() throws Exception;
    }
}
