package io.walrelay.consumer.conformance;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.List;
import java.util.UUID;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * A throwaway PostgreSQL cluster (trust authentication, fsync off), from
 * {@code $WALRELAY_PG_BIN} or /usr/lib/postgresql/15/bin (else the newest
 * installed), as the Python tests' conftest.py makes it; each scenario gets
 * a database of its own. Public for walrelay-consumer-spring's tests (this
 * module's test-jar).
 */
public final class TestPostgres implements AutoCloseable {
    final int port;
    private final Path dir;
    private final Path bin;

    public TestPostgres() throws IOException {
        bin = pgBin();
        dir = Files.createTempDirectory("walrelay-java-pg-");
        Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwx------"));
        if ("root".equals(System.getProperty("user.name"))) {
            Servers.run(List.of("chown", "postgres:postgres", dir.toString()), dir);
        }
        Path data = dir.resolve("data");
        Servers.run(Servers.asServerUser(List.of(bin.resolve("initdb").toString(), "-D", data.toString(), "-U",
                "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")), dir);
        int chosen = 0;
        for (int attempt = 0; attempt < 8 && chosen == 0; attempt++) {
            int p = Servers.freePort();
            String conf = "\nlisten_addresses = '" + Servers.HOST + "'\nport = " + p + "\nunix_socket_directories = '"
                    + dir + "'\nmax_connections = 60\nshared_buffers = '32MB'\nfsync = off\n";
            Files.writeString(data.resolve("postgresql.auto.conf"), conf);
            try {
                Servers.run(Servers.asServerUser(List.of(bin.resolve("pg_ctl").toString(), "start", "-D", data.toString(),
                        "-l", dir.resolve("log").toString(), "-w", "-t", "60")), dir);
                chosen = p;
            } catch (IllegalStateException e) {
                if (!Servers.tail(dir.resolve("log")).contains("could not bind")) {
                    throw e;
                }
            }
        }
        if (chosen == 0) {
            throw new IllegalStateException("PostgreSQL did not start: " + Servers.tail(dir.resolve("log")));
        }
        port = chosen;
    }

    static Path pgBin() {
        String env = System.getenv("WALRELAY_PG_BIN");
        if (env != null && !env.isEmpty()) {
            return Path.of(env);
        }
        Path debian = Path.of("/usr/lib/postgresql/15/bin");
        if (Files.isRegularFile(debian.resolve("initdb"))) {
            return debian;
        }
        try (var dirs = Files.list(Path.of("/usr/lib/postgresql"))) {
            return dirs.filter(d -> d.getFileName().toString().matches("\\d+"))
                    .filter(d -> Files.isRegularFile(d.resolve("bin/initdb")))
                    .max((a, b) -> Integer.compare(Integer.parseInt(a.getFileName().toString()),
                            Integer.parseInt(b.getFileName().toString())))
                    .map(d -> d.resolve("bin"))
                    .orElseThrow();
        } catch (IOException | RuntimeException e) {
            throw new IllegalStateException("no PostgreSQL server binaries: set WALRELAY_PG_BIN or run "
                    + "scripts/install-postgres.sh", e);
        }
    }

    public String url(String database) {
        return "jdbc:postgresql://" + Servers.HOST + ":" + port + "/" + database + "?user=postgres";
    }

    /** A fresh database; returns its JDBC URL. */
    public String createDatabase() {
        String name = "j" + UUID.randomUUID().toString().replace("-", "").substring(0, 12);
        try (Connection c = DriverManager.getConnection(url("postgres")); Statement st = c.createStatement()) {
            st.execute("CREATE DATABASE " + name);
        } catch (SQLException e) {
            throw new IllegalStateException(e);
        }
        return url(name);
    }

    public static PGSimpleDataSource dataSource(String url) {
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setUrl(url);
        return ds;
    }

    @Override
    public void close() {
        try {
            Servers.run(Servers.asServerUser(List.of(bin.resolve("pg_ctl").toString(), "stop", "-D",
                    dir.resolve("data").toString(), "-m", "immediate")), dir);
        } catch (RuntimeException ignored) {
            // Already gone.
        }
        Servers.run(List.of("rm", "-rf", dir.toString()), Path.of("/"));
    }
}
