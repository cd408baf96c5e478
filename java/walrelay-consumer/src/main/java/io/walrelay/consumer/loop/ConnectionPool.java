package io.walrelay.consumer.loop;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.ArrayDeque;
import javax.sql.DataSource;

/**
 * The loop's database connections, from the application's DataSource
 * (which may itself pool): at most one per batch in flight, plus one for the
 * loop's own reads. Each is in manual-commit mode. An outage closes them
 * all ({@link #closeAll}); connections in use at that moment are closed when
 * given back.
 */
final class ConnectionPool implements AutoCloseable {
    private final DataSource dataSource;
    private final ArrayDeque<Connection> idle = new ArrayDeque<>();
    private int generation;

    /** A connection taken from the pool, with the generation it belongs to. */
    record Lease(Connection conn, int generation) {}

    ConnectionPool(DataSource dataSource) {
        this.dataSource = dataSource;
    }

    Lease take() throws SQLException {
        int gen;
        synchronized (this) {
            gen = generation;
            Connection c = idle.pollFirst();
            if (c != null) {
                return new Lease(c, gen);
            }
        }
        Connection c = dataSource.getConnection();
        try {
            c.setAutoCommit(false);
        } catch (SQLException e) {
            closeQuietly(c);
            throw e;
        }
        return new Lease(c, gen);
    }

    /** Gives a connection back: kept only when {@code keep} and no outage closed the pool since. */
    void give(Lease lease, boolean keep) {
        synchronized (this) {
            if (keep && lease.generation() == generation) {
                idle.addFirst(lease.conn());
                return;
            }
        }
        closeQuietly(lease.conn());
    }

    /** Closes every idle connection, and every connection in use when it comes back. */
    void closeAll() {
        ArrayDeque<Connection> old;
        synchronized (this) {
            generation++;
            old = new ArrayDeque<>(idle);
            idle.clear();
        }
        old.forEach(ConnectionPool::closeQuietly);
    }

    @Override
    public void close() {
        closeAll();
    }

    static void closeQuietly(Connection c) {
        try {
            c.close();
        } catch (SQLException ignored) {
            // Closing a broken connection.
        }
    }
}
