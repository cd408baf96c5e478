package io.walrelay.bench;

import io.walrelay.consumer.ConsumerLoop;
import io.walrelay.consumer.Delivery;
import io.walrelay.consumer.Settings;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongSupplier;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * The consumer bench's Java child: applies a relayed topic into
 * {@code applied_events} (the bench's side effect, one row per event), as the
 * bench's Rust and Python consumers do.
 *
 * <pre>
 * java -cp CP io.walrelay.bench.BenchConsumer BOOTSTRAP TOPIC JDBC_URL GROUP batch|limit|careful [LOOPS]
 * </pre>
 *
 * <p>{@code batch}: walrelay's {@link ConsumerLoop} with a batch handler (one
 * multi-row insert per batch). {@code limit} and {@code careful}: the
 * references of {@link PlainReference}, on plain kafka-clients and JDBC, with
 * {@code LOOPS} loops (one per partition; default 1).
 *
 * <p>It tells the bench on stdout what the Python children tell it:
 * {@code first} when the first record is handed over, {@code processed N}
 * whenever the count of committed records changed (checked every 2 ms), and
 * {@code stopped N} after SIGTERM stopped it cleanly (then it exits 0).
 */
public final class BenchConsumer {
    static final String EFFECTS = "INSERT INTO applied_events (event_id, payload) "
            + "SELECT * FROM unnest(?::text[], ?::text[])";

    private BenchConsumer() {}

    /** The Kafka settings every bench consumer uses (the Rust and Python ones too). */
    static Map<String, Object> kafka(String bootstrap, String group) {
        Map<String, Object> k = new HashMap<>();
        k.put("bootstrap.servers", bootstrap);
        k.put("group.id", group);
        k.put("auto.offset.reset", "earliest");
        k.put("session.timeout.ms", "6000");
        k.put("heartbeat.interval.ms", "1000");
        k.put("fetch.max.wait.ms", "5");
        return k;
    }

    static PGSimpleDataSource dataSource(String url) {
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setUrl(url);
        return ds;
    }

    /** Reports {@code processed N} every 2 ms when it changed, on a daemon thread. */
    static void reporter(LongSupplier processed) {
        Thread t = new Thread(() -> {
            long last = -1;
            while (true) {
                long n = processed.getAsLong();
                if (n != last) {
                    System.out.println("processed " + n);
                    System.out.flush();
                    last = n;
                }
                try {
                    Thread.sleep(2);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "reporter");
        t.setDaemon(true);
        t.start();
    }

    private static final AtomicBoolean FIRST = new AtomicBoolean();

    static void first() {
        if (FIRST.compareAndSet(false, true)) {
            System.out.println("first");
            System.out.flush();
        }
    }

    /** Stops {@code stop} on SIGTERM and waits for the main thread to finish. */
    static void onSigterm(Runnable stop) {
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop.run();
            try {
                main.join(60_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
    }

    /** The last line, then exit 0 (the JVM's own exit after SIGTERM would be 143). */
    static void stopped(long n) {
        System.out.println("stopped " + n);
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5 && args.length != 6) {
            System.err.println("usage: BenchConsumer BOOTSTRAP TOPIC JDBC_URL GROUP batch|limit|careful [LOOPS]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        String url = args[2];
        String group = args[3];
        int loops = args.length == 6 ? Integer.parseInt(args[5]) : 1;
        switch (args[4]) {
            case "batch" -> batch(bootstrap, topic, url, group);
            case "limit", "careful" -> new PlainReference(kafka(bootstrap, group), topic, url,
                    args[4].equals("careful"), loops).run();
            default -> {
                System.err.println("unknown mode " + args[4] + ": batch, limit or careful");
                System.exit(2);
            }
        }
    }

    /** walrelay's loop with the batch handler, the library's defaults. */
    static void batch(String bootstrap, String topic, String url, String group) throws Exception {
        ConsumerLoop loop = new ConsumerLoop(kafka(bootstrap, group), List.of(topic), dataSource(url),
                Settings.DEFAULT);
        AtomicLong processed = loop.counters().processed;
        reporter(processed::get);
        onSigterm(loop::stop);
        loop.runBatches(BenchConsumer::applyBatch);
        stopped(processed.get());
    }

    static void applyBatch(Connection conn, List<Delivery> batch) throws Exception {
        first();
        int n = batch.size();
        String[] ids = new String[n];
        String[] payloads = new String[n];
        for (int i = 0; i < n; i++) {
            Delivery d = batch.get(i);
            ids[i] = d.key();
            byte[] p = d.payload();
            payloads[i] = p == null ? "" : new String(p, StandardCharsets.UTF_8);
        }
        insertEffects(conn, ids, payloads);
    }

    /** The side effect of every consumer: one multi-row insert. */
    static void insertEffects(Connection conn, String[] ids, String[] payloads) throws Exception {
        try (PreparedStatement ps = conn.prepareStatement(EFFECTS)) {
            ps.setArray(1, conn.createArrayOf("text", ids));
            ps.setArray(2, conn.createArrayOf("text", payloads));
            ps.executeUpdate();
        }
    }
}
