package io.walrelay.consumer.conformance;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import io.walrelay.consumer.ConsumerLoop;
import io.walrelay.consumer.Counters;
import io.walrelay.consumer.Migration;
import io.walrelay.consumer.OnPoison;
import io.walrelay.consumer.Parked;
import io.walrelay.consumer.PartitionsStoppedException;
import io.walrelay.consumer.RetryPolicy;
import io.walrelay.consumer.Settings;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/** One scenario's database, topic, relays and consumers (test_conformance.py's World). */
final class World implements AutoCloseable {
    static final long AWAIT_MS = 60_000;
    static final Map<String, Set<String>[]> ACTIONS = new HashMap<>();

    @SuppressWarnings("unchecked")
    private static void action(String name, Set<String> required, Set<String> optional) {
        ACTIONS.put(name, new Set[] {required, optional});
    }

    static {
        action("produce", Set.of("source", "partitions", "seqs"),
                Set.of("prev_seq", "poison", "poison_at_commit", "fails", "headers", "behaviour", "times", "payload_bytes"));
        action("restart_relay", Set.of("source"), Set.of());
        action("replay_last", Set.of("source", "partitions", "count"), Set.of());
        action("produce_more", Set.of("source", "partitions", "count"), Set.of());
        action("produce_until_applied_by", Set.of("consumer", "source", "partitions", "per_round"), Set.of());
        action("start", Set.of("consumer", "handler"),
                Set.of("batch_delay_ms", "max_batch_records", "handler_timeout_ms", "max_batch_bytes", "on_poison"));
        action("stop", Set.of("consumer"), Set.of("stopped"));
        action("start_process", Set.of("consumer", "commit_interval_ms"), Set.of("instance_id"));
        action("kill_process", Set.of("consumer"), Set.of());
        action("await", Set.of(), Set.of("effects", "parked", "seen", "stopped", "within_ms"));
        action("expect_counters", Set.of("processed", "duplicates", "gaps", "parked"), Set.of());
        action("park_row", Set.of("source", "partition", "offset", "seq"), Set.of());
        action("redrive", Set.of("handler", "applied", "failed", "unusable"), Set.of());
    }

    private final JsonNode defaults;
    private final TestKafka kafka;
    /** The consumer group protocol of the scenario's consumers. */
    private final String protocol;
    final String url;
    final String group;
    final String topic;
    private final List<int[]> leftOut = new ArrayList<>();
    private final KafkaProducer<byte[], byte[]> producer;
    final Ledger ledger = new Ledger();
    private final Map<String, Running> consumers = new LinkedHashMap<>();
    private final Map<String, Process> processes = new LinkedHashMap<>();
    private final List<ConsumerLoop> loops = new ArrayList<>();

    World(JsonNode scenario, JsonNode defaults, TestKafka kafka, TestPostgres postgres, String protocol) throws Exception {
        this.defaults = defaults;
        this.kafka = kafka;
        this.protocol = protocol;
        String suffix = UUID.randomUUID().toString().substring(0, 8);
        String name = scenario.get("name").asText();
        group = name + "-" + suffix;
        topic = "conformance-" + name + "-" + suffix;
        JsonNode expect = scenario.get("expect");
        for (JsonNode p : expect.get("parked")) {
            leftOut.add(new int[] {p.get("partition").asInt(), p.get("seq").asInt()});
        }
        for (JsonNode p : expect.path("not_applied")) {
            leftOut.add(new int[] {p.get("partition").asInt(), p.get("seq").asInt()});
        }
        kafka.createTopic(topic, defaults.get("partitions").asInt());
        url = postgres.createDatabase();
        try (Connection c = DriverManager.getConnection(url); Statement st = c.createStatement()) {
            Migration.migrate(c);
            st.execute("CREATE TABLE effects (event_key text NOT NULL, partition int NOT NULL, consumer text NOT NULL)");
            st.execute("CREATE TABLE commit_check (id int, CONSTRAINT commit_check_unique UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)");
        }
        Map<String, Object> p = new HashMap<>();
        p.put("bootstrap.servers", kafka.bootstrap());
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("linger.ms", "2");
        producer = new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static void checkFields(String what, JsonNode obj, Set<String> required, Set<String> optional) {
        Set<String> have = new HashSet<>();
        obj.fieldNames().forEachRemaining(have::add);
        Set<String> missing = new HashSet<>(required);
        missing.removeAll(have);
        Set<String> unknown = new HashSet<>(have);
        unknown.removeAll(required);
        unknown.removeAll(optional);
        if (!missing.isEmpty() || !unknown.isEmpty()) {
            throw new AssertionError(what + ": missing fields " + missing + ", unknown fields " + unknown);
        }
    }

    /** Refuses unknown actions and fields; returns the action. */
    static String checkAction(JsonNode step) {
        String action = step.path("do").asText();
        Set<String>[] fields = ACTIONS.get(action);
        if (fields == null) {
            throw new AssertionError("unknown action \"" + action + "\": this runner knows " + new TreeMap<>(ACTIONS).keySet());
        }
        Set<String> optional = new HashSet<>(fields[1]);
        optional.add("do");
        checkFields("action " + action, step, fields[0], optional);
        return action;
    }

    private static List<Integer> ints(JsonNode array) {
        List<Integer> out = new ArrayList<>();
        array.forEach(n -> out.add(n.asInt()));
        return out;
    }

    private static List<Integer> range(int first, int last) {
        List<Integer> out = new ArrayList<>();
        for (int i = first; i <= last; i++) {
            out.add(i);
        }
        return out;
    }

    void step(JsonNode step) throws Exception {
        switch (checkAction(step)) {
            case "produce" -> produce(step);
            case "restart_relay" -> ledger.restart(step.get("source").asText());
            case "replay_last" -> {
                for (int p : ints(step.get("partitions"))) {
                    String source = step.get("source").asText();
                    send(ledger.plan(source, List.of(p), ledger.tail(source, p, step.get("count").asInt()), null));
                }
            }
            case "produce_more" -> produceMore(step.get("source").asText(), ints(step.get("partitions")), step.get("count").asInt());
            case "produce_until_applied_by" -> produceUntilAppliedBy(step);
            case "start" -> start(step);
            case "stop" -> consumers.remove(step.get("consumer").asText()).stop(step.get("stopped"));
            case "start_process" -> startProcess(step);
            case "kill_process" -> killProcess(step.get("consumer").asText());
            case "await" -> {
                long began = System.nanoTime();
                awaitCounts(step.has("effects") ? resolve(step.get("effects")) : null,
                        step.has("parked") ? step.get("parked").asInt() : null,
                        step.has("seen") ? step.get("seen").asInt() : null,
                        step.has("stopped") ? step.get("stopped").asInt() : null,
                        step.has("within_ms") ? step.get("within_ms").asLong() : AWAIT_MS);
                if (step.has("within_ms")) {
                    // The measured time, for docs/operations.md's numbers.
                    System.out.println(group + " (" + protocol + " protocol): reached after "
                            + (System.nanoTime() - began) / 1_000_000 + " ms");
                }
            }
            case "expect_counters" -> {
                Counters c = countersSum();
                List<Long> want = List.of(step.get("processed").asLong(), step.get("duplicates").asLong(),
                        step.get("gaps").asLong(), step.get("parked").asLong());
                List<Long> got = List.of(c.processed.get(), c.duplicates.get(), c.gaps.get(), c.parked.get());
                assertEquals(want, got, "counters (processed, duplicates, gaps, parked)");
            }
            case "park_row" -> parkRow(step);
            case "redrive" -> redrive(step);
            default -> fail("unreachable");
        }
    }

    private void produce(JsonNode step) throws Exception {
        List<Ledger.Planned> planned = ledger.plan(step.get("source").asText(), ints(step.get("partitions")),
                range(step.get("seqs").get(0).asInt(), step.get("seqs").get(1).asInt()),
                step.has("prev_seq") ? step.get("prev_seq").asInt() : null);
        String behaviour = step.has("behaviour") ? step.get("behaviour").asText() : null;
        assertTrue(behaviour == null || Handlers.BEHAVIOURS.contains(behaviour), "unknown behaviour " + behaviour);
        assertTrue(behaviour == null || !(step.has("poison") || step.has("poison_at_commit") || step.has("fails")),
                "behaviour excludes poison, poison_at_commit and fails");
        for (Ledger.Planned p : planned) {
            p.poison = step.path("poison").asBoolean(false);
            p.atCommit = step.path("poison_at_commit").asBoolean(false);
            p.fails = step.path("fails").asInt(0);
            p.headers = step.path("headers").asText("full");
            p.behaviour = behaviour;
            p.times = step.path("times").asInt(1);
            p.payloadBytes = step.has("payload_bytes") ? step.get("payload_bytes").asInt() : null;
            if ("noop".equals(behaviour)) {
                ledger.noop.add(p.key);
            }
        }
        send(planned);
    }

    private void send(List<Ledger.Planned> planned) throws Exception {
        List<java.util.concurrent.Future<?>> sent = new ArrayList<>();
        for (Ledger.Planned r : planned) {
            assertTrue(r.headers.equals("full") || r.headers.equals("lean"), "unknown header set " + r.headers);
            ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(topic, r.partition, bytes(r.key), r.payload());
            rec.headers().add("idempotency-key", bytes(r.key)).add("walrelay-source", bytes(r.source));
            if (r.headers.equals("full")) {
                rec.headers().add("walrelay-prev-key", bytes(r.prev));
            } else if (r.prev.isEmpty()) {
                rec.headers().add("walrelay-prev", new byte[0]);
            } else {
                String compact = Long.toHexString(Long.parseUnsignedLong(r.prev.substring(0, 16), 16)) + "/"
                        + Long.toHexString(Long.parseUnsignedLong(r.prev.substring(16), 16));
                rec.headers().add("walrelay-prev", bytes(compact));
            }
            sent.add(producer.send(rec));
        }
        producer.flush();
        for (var f : sent) {
            f.get(30, TimeUnit.SECONDS);
        }
    }

    private static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private void produceMore(String source, List<Integer> partitions, int n) throws Exception {
        for (int p : partitions) {
            Integer last = ledger.last(source, p);
            int start = last == null ? 1 : last + 1;
            send(ledger.plan(source, List.of(p), range(start, start + n - 1), null));
        }
    }

    private void produceUntilAppliedBy(JsonNode step) throws Exception {
        String who = step.get("consumer").asText();
        for (int round = 0; round < 200; round++) {
            produceMore(step.get("source").asText(), ints(step.get("partitions")), step.get("per_round").asInt());
            if (count("SELECT count(*) FROM effects WHERE consumer = '" + who.replace("'", "''") + "'") > 0) {
                return;
            }
            awaitCounts(ledger.expectedEffects(leftOut).size(), null, null, null, AWAIT_MS);
        }
        fail("consumer " + who + " applied nothing in 200 rounds");
    }

    private Settings settings(JsonNode step) {
        JsonNode retry = defaults.get("retry");
        Settings s = Settings.DEFAULT
                .withMaxBatchRecords(step.has("max_batch_records") ? step.get("max_batch_records").asInt()
                        : defaults.get("max_batch_records").asInt())
                .withCommitInterval(Duration.ofMillis(defaults.get("commit_interval_ms").asLong()))
                .withRetry(new RetryPolicy(retry.get("attempts").asInt(), Duration.ofMillis(retry.get("base_ms").asLong()),
                        Duration.ofMillis(retry.get("cap_ms").asLong())))
                .withOnPoison("stop".equals(step.path("on_poison").asText(defaults.get("on_poison").asText()))
                        ? OnPoison.STOP : OnPoison.PARK);
        if (step.has("max_batch_bytes")) {
            s = s.withMaxBatchBytes(step.get("max_batch_bytes").asLong());
        }
        if (step.has("handler_timeout_ms")) {
            s = s.withHandlerTimeout(Duration.ofMillis(step.get("handler_timeout_ms").asLong()));
        }
        return s;
    }

    private void start(JsonNode step) {
        String name = step.get("consumer").asText();
        String handler = step.get("handler").asText();
        long delay = step.path("batch_delay_ms").asLong(0);
        assertTrue(!consumers.containsKey(name), "consumer " + name + " is already running");
        assertTrue(handler.equals("batch") || handler.equals("record"), "unknown handler " + handler);
        Map<String, Object> config = new HashMap<>();
        config.put("bootstrap.servers", kafka.bootstrap());
        config.put("group.id", group);
        Servers.groupSettings(config, true, protocol);
        config.put("reconnect.backoff.ms", "20");
        config.put("reconnect.backoff.max.ms", "500");
        ConsumerLoop loop = new ConsumerLoop(config, List.of(topic), TestPostgres.dataSource(url), settings(step));
        loops.add(loop);
        consumers.put(name, new Running(loop, handler.equals("batch")
                ? () -> loop.runBatches((conn, b) -> Handlers.apply(conn, b, name, delay, true))
                : () -> loop.run((conn, d) -> Handlers.apply(conn, List.of(d), name, delay, true))));
    }

    private void startProcess(JsonNode step) throws Exception {
        String name = step.get("consumer").asText();
        assertTrue(!processes.containsKey(name), "consumer process " + name + " is already running");
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        List<String> argv = new ArrayList<>(List.of(java, "-Xmx256m", "-XX:+UseSerialGC", "-cp",
                System.getProperty("java.class.path"), ConsumerProcess.class.getName(), kafka.bootstrap(), topic, url, group,
                name, step.get("commit_interval_ms").asText()));
        if (step.has("instance_id")) {
            argv.add(step.get("instance_id").asText() + "-" + group);
        }
        ProcessBuilder pb = new ProcessBuilder(argv).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.appendTo(processLog(name)));
        pb.environment().put("WALRELAY_GROUP_PROTOCOL", protocol);
        Process p = pb.start();
        processes.put(name, p);
        awaitReady(name, p);
    }

    /**
     * Waits until the consumer process says it is up: a scenario's deadline
     * ({@code within_ms}) times the consumer from there, not the JVM's start,
     * which took seconds on a loaded two-core machine.
     */
    private void awaitReady(String name, Process p) throws Exception {
        Path log = processLog(name).toPath();
        long deadline = System.currentTimeMillis() + 60_000;
        while (System.currentTimeMillis() < deadline) {
            if (java.nio.file.Files.readString(log).contains(ConsumerProcess.READY)) {
                return;
            }
            assertTrue(p.isAlive(), "consumer process " + name + " exited before it was ready: "
                    + java.nio.file.Files.readString(log));
            Thread.sleep(20);
        }
        fail("consumer process " + name + " was not ready within 60 s: " + java.nio.file.Files.readString(log));
    }

    /** Where a consumer process logs: target/conformance-processes/GROUP-NAME.log. */
    private java.io.File processLog(String name) throws java.io.IOException {
        Path dir = Path.of("target", "conformance-processes");
        java.nio.file.Files.createDirectories(dir);
        return dir.resolve(group + "-" + name + ".log").toFile();
    }

    private void killProcess(String name) throws Exception {
        Process p = processes.remove(name);
        assertTrue(p.isAlive(), "consumer process " + name + " exited on its own with " + (p.isAlive() ? "" : p.exitValue()));
        p.destroyForcibly();
        assertTrue(p.waitFor(30, TimeUnit.SECONDS), "not killed");
        assertEquals(137, p.exitValue(), "exit status of a SIGKILL");
    }

    Counters countersSum() {
        Counters total = new Counters();
        for (ConsumerLoop l : loops) {
            Counters c = l.counters();
            total.processed.addAndGet(c.processed.get());
            total.duplicates.addAndGet(c.duplicates.get());
            total.gaps.addAndGet(c.gaps.get());
            total.parked.addAndGet(c.parked.get());
        }
        return total;
    }

    private int resolve(JsonNode n) {
        if (n.isTextual()) {
            assertEquals("all", n.asText(), "a count must be a number or \"all\"");
            return ledger.expectedEffects(leftOut).size();
        }
        return n.asInt();
    }

    long count(String sql) throws Exception {
        try (Connection c = DriverManager.getConnection(url); Statement st = c.createStatement();
                ResultSet rs = st.executeQuery(sql)) {
            rs.next();
            return rs.getLong(1);
        }
    }

    private void awaitCounts(Integer effects, Integer parked, Integer seen, Integer stopped, long withinMs) throws Exception {
        long deadline = System.currentTimeMillis() + withinMs;
        while (true) {
            long e = count("SELECT count(*) FROM effects");
            long p = count("SELECT count(*) FROM walrelay_consumer_parked");
            Counters c = countersSum();
            long s = c.processed.get() + c.duplicates.get() + c.parked.get();
            int st = loops.stream().mapToInt(ConsumerLoop::stoppedPartitions).sum();
            if ((effects == null || e >= effects) && (parked == null || p >= parked) && (seen == null || s >= seen)
                    && (stopped == null || st >= stopped)) {
                return;
            }
            if (System.currentTimeMillis() > deadline) {
                fail("timed out after " + withinMs + " ms waiting for effects " + effects + ", parked " + parked + ", seen "
                        + seen + ", stopped " + stopped + "; have effects " + e + ", parked " + p + ", seen " + s
                        + ", stopped " + st + " (" + c + ")");
            }
            Thread.sleep(50);
        }
    }

    private void parkRow(JsonNode step) throws Exception {
        try (Connection c = DriverManager.getConnection(url); PreparedStatement ps = c.prepareStatement(
                "INSERT INTO walrelay_consumer_parked (consumer_group, topic, partition, kafka_offset, idempotency_key, "
                + "source, header_names, header_values, error, attempts) VALUES (?, ?, ?, ?, ?, ?, '{}', '{}', "
                + "'an earlier incarnation', 1)")) {
            ps.setString(1, group);
            ps.setString(2, topic);
            ps.setInt(3, step.get("partition").asInt());
            ps.setLong(4, step.get("offset").asLong());
            ps.setString(5, Ledger.key(step.get("partition").asInt(), step.get("seq").asInt()));
            ps.setString(6, step.get("source").asText());
            ps.executeUpdate();
        }
    }

    private void redrive(JsonNode step) throws Exception {
        boolean broken = switch (step.get("handler").asText()) {
            case "broken" -> true;
            case "fixed" -> false;
            default -> throw new AssertionError("unknown redrive handler " + step.get("handler"));
        };
        Parked.RedriveReport report;
        try (Connection c = DriverManager.getConnection(url)) {
            report = Parked.redrive(c, group, (conn, d) -> Handlers.apply(conn, List.of(d), "redrive", 0, broken));
        }
        assertEquals(List.of(step.get("applied").asInt(), step.get("failed").asInt(), step.get("unusable").asInt()),
                List.of(report.applied(), report.failed(), report.unusable()), "redrive (applied, failed, unusable)");
    }

    void assertNothingRunning() {
        assertTrue(consumers.isEmpty() && processes.isEmpty(), "the scenario leaves consumers running: "
                + consumers.keySet() + " " + processes.keySet() + " (end it with stop or kill_process)");
    }

    void check(JsonNode expect) throws Exception {
        Checks.check(this, expect);
    }

    @Override
    public void close() {
        for (Running r : consumers.values()) {
            r.loop.stop();
        }
        for (Process p : processes.values()) {
            p.destroyForcibly();
        }
        producer.close(Duration.ofSeconds(5));
    }

    /** An in-process loop on a thread of its own. */
    static final class Running {
        final ConsumerLoop loop;
        private final Thread thread;
        private volatile Throwable error;

        interface Body {
            void run() throws Exception;
        }

        Running(ConsumerLoop loop, Body body) {
            this.loop = loop;
            this.thread = new Thread(() -> {
                try {
                    body.run();
                } catch (Throwable e) {
                    error = e;
                }
            }, "conformance-loop");
            thread.setDaemon(true);
            thread.start();
        }

        void stop(JsonNode stopped) throws Exception {
            loop.stop();
            thread.join(AWAIT_MS);
            assertTrue(!thread.isAlive(), "the loop did not stop within " + AWAIT_MS + " ms");
            if (stopped == null) {
                if (error != null) {
                    throw new AssertionError("the loop ended with " + error, error);
                }
                return;
            }
            assertTrue(error instanceof PartitionsStoppedException, "the loop ended with " + error + ", not PartitionsStopped");
            Map<Integer, String> got = new TreeMap<>();
            for (var s : ((PartitionsStoppedException) error).stopped()) {
                got.put(s.partition(), s.error());
            }
            Set<Integer> want = new java.util.TreeSet<>();
            for (Iterator<JsonNode> it = stopped.elements(); it.hasNext();) {
                JsonNode w = it.next();
                checkFields("stopped", w, Set.of("partition", "error_contains"), Set.of());
                want.add(w.get("partition").asInt());
                String text = got.get(w.get("partition").asInt());
                assertTrue(text != null && text.contains(w.get("error_contains").asText()),
                        "the error of stopped partition " + w.get("partition") + " lacks " + w.get("error_contains") + ": " + text);
            }
            assertEquals(want, got.keySet(), "stopped partitions");
        }
    }
}
