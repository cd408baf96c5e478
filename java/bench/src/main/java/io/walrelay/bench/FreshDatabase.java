package io.walrelay.bench;

import io.walrelay.consumer.Migration;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.Statement;

/**
 * Creates an empty database for one timed run of {@code run-ab.sh}, with
 * the tables {@link BenchConsumer} writes: {@code applied_events} (the
 * effect), {@code inbox} (the careful reference's) and the library's own
 * (its migration). Prints the new database's JDBC URL.
 *
 * <pre>
 * java -cp CP io.walrelay.bench.FreshDatabase SERVER_JDBC_URL NAME
 * </pre>
 *
 * <p>{@code SERVER_JDBC_URL} names the {@code postgres} database and ends with
 * its query string ({@code ?user=...}); the new one replaces that name.
 */
public final class FreshDatabase {
    private FreshDatabase() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: FreshDatabase SERVER_JDBC_URL NAME");
            System.exit(2);
        }
        String server = args[0];
        String name = args[1];
        try (Connection c = DriverManager.getConnection(server); Statement st = c.createStatement()) {
            st.execute("DROP DATABASE IF EXISTS " + name);
            st.execute("CREATE DATABASE " + name);
        }
        String url = server.replaceFirst("/postgres(\\?|$)", "/" + name + "$1");
        try (Connection c = DriverManager.getConnection(url); Statement st = c.createStatement()) {
            st.execute("CREATE TABLE applied_events (event_id text NOT NULL, payload text NOT NULL)");
            st.execute("CREATE TABLE inbox (event_id text PRIMARY KEY)");
            Migration.migrate(c);
        }
        System.out.println(url);
    }
}
