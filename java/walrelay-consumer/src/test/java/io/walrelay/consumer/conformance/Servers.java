package io.walrelay.consumer.conformance;

import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Process helpers for the throwaway servers of the Java tests, started the
 * way the Python tests start them (python/tests/conftest.py, brokers.py):
 * each with a watchdog shell that kills it and removes its directory when
 * this JVM's end of the pipe on its stdin closes, however the JVM ended.
 */
final class Servers {
    static final String HOST = "127.0.0.1";
    static final String WATCHDOG = "read -r _; kill -9 \"$1\" 2>/dev/null; rm -rf \"$2\"";

    private Servers() {}

    /**
     * The consumer group protocols the scenarios are played with, one after
     * the other on the same servers: {@code $WALRELAY_GROUP_PROTOCOL},
     * {@code classic} (the default), {@code consumer} (Kafka 4's, KIP-848)
     * or both, comma-separated.
     */
    static List<String> groupProtocols() {
        List<String> out = new ArrayList<>();
        for (String p : System.getenv().getOrDefault("WALRELAY_GROUP_PROTOCOL", "classic").split(",")) {
            String name = p.trim();
            if (!name.equals("classic") && !name.equals("consumer")) {
                throw new IllegalArgumentException("WALRELAY_GROUP_PROTOCOL lists classic or consumer, not " + name);
            }
            out.add(name);
        }
        return out;
    }

    /**
     * The group settings of every consumer of the suite under
     * {@code protocol}: short session timeouts so that a killed member's
     * partitions move within seconds. The classic protocol takes them from
     * the client; the consumer protocol refuses them there and takes them
     * from the broker ({@link TestKafka}'s {@code group.consumer.*}).
     */
    static void groupSettings(java.util.Map<String, Object> config, boolean sessionTimeout, String protocol) {
        config.put("group.protocol", protocol);
        if (protocol.equals("classic")) {
            config.put("heartbeat.interval.ms", "1000");
            if (sessionTimeout) {
                config.put("session.timeout.ms", "6000");
            }
        }
    }

    /** The repository's root (the surefire property {@code walrelay.repo}). */
    static Path repo() {
        return Path.of(System.getProperty("walrelay.repo", "../..")).toAbsolutePath().normalize();
    }

    static int freePort() {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getByName(HOST))) {
            return s.getLocalPort();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Runs a command to its end; fails with its output unless it exits 0. */
    static String run(List<String> argv, Path dir) {
        try {
            Process p = new ProcessBuilder(argv).directory(dir.toFile()).redirectErrorStream(true).start();
            p.getOutputStream().close();
            String out = new String(p.getInputStream().readAllBytes());
            if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
                throw new IllegalStateException(argv + " failed: " + out);
            }
            return out;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    /** {@code argv} as the PostgreSQL server's user when running as root (initdb and postgres refuse root). */
    static List<String> asServerUser(List<String> argv) {
        if (!"root".equals(System.getProperty("user.name"))) {
            return argv;
        }
        List<String> out = new ArrayList<>(List.of("runuser", "-u", "postgres", "--"));
        out.addAll(argv);
        return out;
    }

    /** A long-running server process and its watchdog. */
    static final class Watched {
        final Process process;
        private final Process watchdog;
        private final OutputStream pipe;

        Watched(List<String> argv, Path dir, Path log) throws IOException {
            ProcessBuilder pb = new ProcessBuilder(argv).directory(dir.toFile()).redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()));
            pb.environment().remove("KAFKA_OPTS");
            pb.environment().remove("KAFKA_HEAP_OPTS");
            process = pb.start();
            process.getOutputStream().close();
            watchdog = new ProcessBuilder("sh", "-c", WATCHDOG, "walrelay-java-watchdog",
                    Long.toString(process.pid()), dir.toString()).start();
            pipe = watchdog.getOutputStream();
        }

        void kill() {
            process.destroyForcibly();
            try {
                process.waitFor(30, TimeUnit.SECONDS);
                pipe.close();
                watchdog.waitFor(30, TimeUnit.SECONDS);
            } catch (IOException | InterruptedException ignored) {
                // Best effort at the end of the tests.
            }
        }
    }

    static String tail(Path log) {
        try {
            List<String> lines = Files.readAllLines(log);
            return String.join("\n", lines.subList(Math.max(0, lines.size() - 40), lines.size()));
        } catch (IOException e) {
            return "(no log)";
        }
    }
}
