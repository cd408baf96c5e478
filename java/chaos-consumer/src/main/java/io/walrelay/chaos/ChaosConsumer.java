package io.walrelay.chaos;

import io.walrelay.consumer.ConsumerLoop;
import io.walrelay.consumer.Delivery;
import io.walrelay.consumer.KafkaSecrets;
import io.walrelay.consumer.Migration;
import io.walrelay.consumer.Settings;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * The chaos harness's Java consumer (crates/walrelay-chaos, {@code --java}):
 * the library's batch loop applying every record to {@code chaos_applied_java},
 * exactly once by its high-water mark, as the Rust consumer applies to
 * {@code chaos_applied} and the Python one to {@code chaos_applied_py}: the
 * same columns, no unique constraint, so a record applied twice shows up as
 * two rows, in application order.
 *
 * <p>Started, killed ({@code kill -9}) and restarted by the harness, with the
 * Python consumer's arguments ({@code --dsn} in libpq's key=value form):
 *
 * <pre>
 * java -cp target/classes:$(cat target/classpath.txt) io.walrelay.chaos.ChaosConsumer \
 *     --bootstrap B --dsn 'host=H port=P user=U dbname=D' --group G --topic T [--topic T ...] [--kafka k=v ...]
 * </pre>
 *
 * <p>{@code --kafka k=v} (repeatable; {@code --kafka-property} is the same
 * flag) adds a kafka-clients property, or overrides one of its defaults
 * below: TLS, SASL, an OAuth login, as the example consumer
 * ({@code ApplyEvents}) takes them, a secret property's value possibly
 * {@code env:NAME} or {@code file:/path} ({@link KafkaSecrets}).
 *
 * <p>SIGTERM stops it cleanly (exit 0).
 */
public final class ChaosConsumer {
    static final String SCHEMA = "CREATE TABLE IF NOT EXISTS chaos_applied_java ("
            + "seq bigserial PRIMARY KEY, event text NOT NULL, topic text NOT NULL, "
            + "kafka_partition int NOT NULL, kafka_offset bigint NOT NULL, idempotency_key text NOT NULL)";
    static final String INSERT = "INSERT INTO chaos_applied_java "
            + "(event, topic, kafka_partition, kafka_offset, idempotency_key) "
            + "SELECT e, t, p, o, k FROM unnest(?::text[], ?::text[], ?::int4[], ?::int8[], ?::text[]) "
            + "WITH ORDINALITY AS u(e, t, p, o, k, n) ORDER BY n";
    private static final Pattern EVENT = Pattern.compile("\"e\"\\s*:\\s*\"([^\"]*)\"");

    private ChaosConsumer() {}

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new HashMap<>();
        List<String> topics = new ArrayList<>();
        List<String> properties = new ArrayList<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--topic" -> topics.add(args[i + 1]);
                case "--kafka", "--kafka-property" -> properties.add(args[i + 1]);
                default -> opts.put(args[i], args[i + 1]);
            }
        }
        if (args.length % 2 != 0 || topics.isEmpty()
                || !opts.keySet().containsAll(List.of("--bootstrap", "--dsn", "--group"))) {
            System.err.println("usage: ChaosConsumer --bootstrap HOST:PORT --dsn 'host=H port=P user=U dbname=D' "
                    + "--group G --topic T [--topic T ...] [--kafka k=v ...]");
            System.exit(2);
        }
        Map<String, Object> kafka = null;
        try {
            kafka = kafkaConfig(opts.get("--bootstrap"), opts.get("--group"), properties, System::getenv);
        } catch (IllegalArgumentException e) {
            System.err.println("ChaosConsumer: " + e.getMessage());
            System.exit(2);
        }
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setUrl(jdbcUrl(opts.get("--dsn")));
        ds.setApplicationName("walrelay-chaos-java");
        try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
            Migration.migrate(c);
            st.execute(SCHEMA);
        }
        // Offsets committed every two seconds, as the Rust consumer does: a
        // wide window between the database commit and the offset commit.
        ConsumerLoop loop = new ConsumerLoop(kafka, topics, ds,
                Settings.DEFAULT.withCommitInterval(Duration.ofSeconds(2)));
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            loop.stop();
            try {
                main.join(30_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        loop.runBatches(ChaosConsumer::apply);
        System.out.println("stopped " + loop.counters());
        System.out.flush();
        // A clean stop exits 0; the JVM's own exit after SIGTERM would be 143.
        Runtime.getRuntime().halt(0);
    }

    /**
     * The consumer's Kafka configuration: the harness's defaults (a short
     * session, quick reconnects), then the {@code --kafka k=v} properties
     * (which may override them), with the {@code env:}/{@code file:}
     * references of secret properties resolved from {@code environment} and
     * the files.
     *
     * @throws IllegalArgumentException a property without {@code =} (shown
     *     only if it does not look like a secret), or a reference that cannot
     *     be resolved
     */
    static Map<String, Object> kafkaConfig(String bootstrap, String group, List<String> properties,
            Function<String, String> environment) {
        Map<String, Object> kafka = new HashMap<>();
        kafka.put("bootstrap.servers", bootstrap);
        kafka.put("group.id", group);
        kafka.put("session.timeout.ms", "6000");
        kafka.put("heartbeat.interval.ms", "1000");
        kafka.put("reconnect.backoff.max.ms", "500");
        for (String pair : properties) {
            int eq = pair.indexOf('=');
            if (eq <= 0 || pair.substring(0, eq).isBlank()) {
                throw new IllegalArgumentException("--kafka takes k=v (a kafka-clients property), not "
                        + (KafkaSecrets.isSecret(pair) ? "(not shown: it may hold a secret)" : "'" + pair + "'"));
            }
            kafka.put(pair.substring(0, eq).trim(), pair.substring(eq + 1));
        }
        return KafkaSecrets.resolve(kafka, environment);
    }

    /** libpq's {@code host=H port=P user=U dbname=D} as a JDBC URL. */
    static String jdbcUrl(String dsn) {
        Map<String, String> kv = new HashMap<>();
        for (String pair : dsn.trim().split("\\s+")) {
            int eq = pair.indexOf('=');
            if (eq > 0) {
                kv.put(pair.substring(0, eq), pair.substring(eq + 1));
            }
        }
        String url = "jdbc:postgresql://" + kv.getOrDefault("host", "localhost") + ":"
                + kv.getOrDefault("port", "5432") + "/" + kv.getOrDefault("dbname", "postgres")
                + "?user=" + kv.getOrDefault("user", "postgres");
        return kv.containsKey("password") ? url + "&password=" + kv.get("password") : url;
    }

    /** The event id a payload carries: {@code {"e": id}} or the id itself. */
    static String eventId(byte[] payload) {
        String raw = payload == null ? "" : new String(payload, StandardCharsets.UTF_8);
        if (raw.startsWith("{")) {
            Matcher m = EVENT.matcher(raw);
            return m.find() ? m.group(1) : "?" + raw;
        }
        return raw;
    }

    /** The handler: one multi-row insert per batch, in the batch's transaction. */
    static void apply(Connection conn, List<Delivery> batch) throws Exception {
        int n = batch.size();
        String[] events = new String[n];
        String[] topics = new String[n];
        Integer[] partitions = new Integer[n];
        Long[] offsets = new Long[n];
        String[] keys = new String[n];
        for (int i = 0; i < n; i++) {
            Delivery d = batch.get(i);
            events[i] = eventId(d.payload());
            topics[i] = d.position().topic();
            partitions[i] = d.position().partition();
            offsets[i] = d.record().offset();
            keys[i] = d.key();
        }
        try (PreparedStatement ps = conn.prepareStatement(INSERT)) {
            ps.setArray(1, conn.createArrayOf("text", events));
            ps.setArray(2, conn.createArrayOf("text", topics));
            ps.setArray(3, conn.createArrayOf("int4", partitions));
            ps.setArray(4, conn.createArrayOf("int8", offsets));
            ps.setArray(5, conn.createArrayOf("text", keys));
            ps.executeUpdate();
        }
    }
}
