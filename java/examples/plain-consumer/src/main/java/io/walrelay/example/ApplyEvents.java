package io.walrelay.example;

import io.walrelay.consumer.ConsumerLoop;
import io.walrelay.consumer.Delivery;
import io.walrelay.consumer.KafkaSecrets;
import io.walrelay.consumer.Migration;
import io.walrelay.consumer.OnPoison;
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
import org.postgresql.ds.PGSimpleDataSource;

/**
 * An example plain-Java service (no framework) that applies walrelay events
 * to its own table exactly once: each new record becomes one row of
 * {@code java_applied_events}, written by the batch handler in the
 * transaction that raises the partition's high-water mark. The table has no
 * unique constraint on purpose: a record applied twice would show as two rows.
 *
 * <pre>
 * java -cp target/classes:$(cat target/classpath.txt) io.walrelay.example.ApplyEvents \
 *     --bootstrap kafka:9092 --jdbc-url 'jdbc:postgresql://db/app?user=app' --group billing --topic orders \
 *     [--instance-id ID] [--commit-interval-ms 1000] [--pool-size 4] [--max-batch-records 1000] \
 *     [--max-batch-bytes 4194304] [--handler-timeout-ms N] [--on-poison stop|park] [--kafka k=v ...]
 * </pre>
 *
 * <p>The settings' flags take the Rust example's names ({@code apply_events});
 * left out, each keeps the library's default ({@link Settings#DEFAULT}: no
 * handler timeout, stop on a poison record).
 *
 * <p>{@code --kafka k=v} (repeatable; {@code --kafka-property} is the same
 * flag) adds any kafka-clients property: TLS, SASL, an OAuth login. The value
 * of a secret property ({@code sasl.jaas.config}, passwords,
 * {@code sasl.oauthbearer.client.credentials.client.secret}: see
 * {@link KafkaSecrets}) may be {@code env:NAME} or {@code file:/path}, so that
 * it never appears on the command line. An OAuth (OIDC client credentials)
 * login also needs the token endpoint allowed by a JVM system property, given
 * before the class name:
 *
 * <pre>
 * KAFKA_CLIENT_SECRET=... java -Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=https://idp.example.com/oauth2/token \
 *     -cp target/classes:$(cat target/classpath.txt) io.walrelay.example.ApplyEvents ... \
 *     --kafka security.protocol=SASL_SSL --kafka sasl.mechanism=OAUTHBEARER \
 *     --kafka sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler \
 *     --kafka sasl.oauthbearer.token.endpoint.url=https://idp.example.com/oauth2/token \
 *     --kafka 'sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;' \
 *     --kafka sasl.oauthbearer.client.credentials.client.id=billing \
 *     --kafka sasl.oauthbearer.client.credentials.client.secret=env:KAFKA_CLIENT_SECRET \
 *     --kafka sasl.oauthbearer.scope=kafka
 * </pre>
 *
 * <p>SIGTERM stops it cleanly (the batches in flight finish, offsets are
 * committed, the group is left) and it prints its counters. It prints
 * {@code started} once its SIGTERM hook is in place, and its counters whenever
 * they change (checked every 50 ms), so a log shows what a process killed -9
 * had done (how many redelivered records its marks dropped).
 */
public final class ApplyEvents {
    static final String SCHEMA = "CREATE TABLE IF NOT EXISTS java_applied_events ("
            + "event_id text NOT NULL, payload text NOT NULL, kafka_partition int NOT NULL, "
            + "kafka_offset bigint NOT NULL)";
    static final String INSERT = "INSERT INTO java_applied_events (event_id, payload, kafka_partition, kafka_offset) "
            + "SELECT * FROM unnest(?::text[], ?::text[], ?::int4[], ?::int8[])";

    private ApplyEvents() {}

    /** The library's settings from the flags given, its defaults for the others. */
    static Settings settings(Map<String, String> opts) {
        Settings s = Settings.DEFAULT.withCommitInterval(
                Duration.ofMillis(Long.parseLong(opts.getOrDefault("--commit-interval-ms", "1000"))));
        if (opts.containsKey("--pool-size")) {
            s = s.withPoolSize(Integer.parseInt(opts.get("--pool-size")));
        }
        if (opts.containsKey("--max-batch-records")) {
            s = s.withMaxBatchRecords(Integer.parseInt(opts.get("--max-batch-records")));
        }
        if (opts.containsKey("--max-batch-bytes")) {
            s = s.withMaxBatchBytes(Long.parseLong(opts.get("--max-batch-bytes")));
        }
        if (opts.containsKey("--handler-timeout-ms")) {
            s = s.withHandlerTimeout(Duration.ofMillis(Long.parseLong(opts.get("--handler-timeout-ms"))));
        }
        String poison = opts.getOrDefault("--on-poison", "stop");
        return switch (poison) {
            case "stop" -> s.withOnPoison(OnPoison.STOP);
            case "park" -> s.withOnPoison(OnPoison.PARK);
            default -> throw new IllegalArgumentException("--on-poison takes stop or park, not " + poison);
        };
    }

    static final String USAGE = "usage: ApplyEvents --bootstrap HOST:PORT --jdbc-url URL --group G --topic T "
            + "[--topic T ...] [--instance-id ID] [--commit-interval-ms N] [--pool-size N] "
            + "[--max-batch-records N] [--max-batch-bytes N] [--handler-timeout-ms N] [--on-poison stop|park] "
            + "[--kafka k=v ...] (a secret property's value may be env:NAME or file:/path)";

    /**
     * One {@code --kafka k=v} into {@code kafka} (a later one wins); an
     * argument without {@code =} is shown in the error only if it does not
     * look like a secret.
     */
    static void putKafkaProperty(Map<String, Object> kafka, String pair) {
        int eq = pair.indexOf('=');
        if (eq <= 0 || pair.substring(0, eq).isBlank()) {
            String shown = KafkaSecrets.isSecret(pair) ? "(not shown: it may hold a secret)" : "'" + pair + "'";
            throw new IllegalArgumentException("--kafka takes k=v (a kafka-clients property), not " + shown);
        }
        kafka.put(pair.substring(0, eq).trim(), pair.substring(eq + 1));
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new HashMap<>();
        Map<String, Object> kafka = new HashMap<>();
        List<String> topics = new ArrayList<>();
        try {
            for (int i = 0; i + 1 < args.length; i += 2) {
                String name = args[i];
                String value = args[i + 1];
                switch (name) {
                    case "--topic" -> topics.add(value);
                    case "--kafka", "--kafka-property" -> putKafkaProperty(kafka, value);
                    default -> opts.put(name, value);
                }
            }
            // env: and file: references of secret properties, read now.
            kafka = KafkaSecrets.resolve(kafka);
        } catch (IllegalArgumentException e) {
            System.err.println("ApplyEvents: " + e.getMessage());
            System.exit(2);
        }
        if (args.length % 2 != 0 || topics.isEmpty() || !opts.keySet().containsAll(
                List.of("--bootstrap", "--jdbc-url", "--group"))) {
            System.err.println(USAGE);
            System.exit(2);
        }
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setUrl(opts.get("--jdbc-url"));
        try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
            Migration.migrate(c);
            st.execute(SCHEMA);
        }
        kafka.put("bootstrap.servers", opts.get("--bootstrap"));
        kafka.put("group.id", opts.get("--group"));
        if (opts.containsKey("--instance-id")) {
            kafka.put("group.instance.id", opts.get("--instance-id"));
        }
        Settings settings = settings(opts);
        ConsumerLoop loop = new ConsumerLoop(kafka, topics, ds, settings);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            loop.stop();
            try {
                main.join(30_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        System.out.println("started");
        Thread reporter = new Thread(() -> {
            String last = "";
            while (true) {
                String now = "counters " + loop.counters();
                if (!now.equals(last)) {
                    System.out.println(now);
                    last = now;
                }
                try {
                    Thread.sleep(50);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "counters");
        reporter.setDaemon(true);
        reporter.start();
        loop.runBatches(ApplyEvents::apply);
        System.out.println("stopped " + loop.counters());
        System.out.flush();
        // A clean stop exits 0; the JVM's own exit after SIGTERM would be 143.
        Runtime.getRuntime().halt(0);
    }

    /** The handler: one multi-row insert per batch, in the batch's transaction. */
    static void apply(Connection conn, List<Delivery> batch) throws Exception {
        int n = batch.size();
        String[] ids = new String[n];
        String[] payloads = new String[n];
        Integer[] partitions = new Integer[n];
        Long[] offsets = new Long[n];
        for (int i = 0; i < n; i++) {
            Delivery d = batch.get(i);
            ids[i] = d.key();
            byte[] p = d.payload();
            payloads[i] = p == null ? "" : new String(p, StandardCharsets.UTF_8);
            partitions[i] = d.position().partition();
            offsets[i] = d.record().offset();
        }
        try (PreparedStatement ps = conn.prepareStatement(INSERT)) {
            ps.setArray(1, conn.createArrayOf("text", ids));
            ps.setArray(2, conn.createArrayOf("text", payloads));
            ps.setArray(3, conn.createArrayOf("int4", partitions));
            ps.setArray(4, conn.createArrayOf("int8", offsets));
            ps.executeUpdate();
        }
    }
}
