package io.walrelay.consumer.conformance;

import io.walrelay.consumer.Delivery;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The scenarios' handlers (conformance/README.md, "Handler semantics"): one
 * {@code effects} row per record, poison records refused, and the records'
 * misbehaviours played.
 */
final class Handlers {
    static final String INSERT_EFFECT = "INSERT INTO effects (event_key, partition, consumer) VALUES (?, ?, ?)";
    static final String COMMIT_POISON = "INSERT INTO commit_check (id) VALUES (1), (1)";
    static final String CONTEND = "DO $$BEGIN RAISE EXCEPTION 'contention' USING ERRCODE = '40001'; END$$";
    static final Set<String> BEHAVIOURS = Set.of("swallow", "savepoint", "raise", "noop", "slow", "self_commit",
            "self_rollback", "contend");
    /** How often each flaky or misbehaving record did so, per topic and key. */
    private static final Map<String, Integer> FLAKY = new ConcurrentHashMap<>();
    private static final Map<String, Integer> MISBEHAVED = new ConcurrentHashMap<>();

    private Handlers() {}

    private record Sql(String text, boolean ignoreError) {}

    private static String text(Delivery d) {
        return d.payload() == null ? "" : new String(d.payload(), StandardCharsets.UTF_8);
    }

    /** The handlers' side effect; a batch with a poison record fails while {@code poisonFails}. */
    static void apply(Connection conn, List<Delivery> batch, String consumer, long delayMs, boolean poisonFails)
            throws Exception {
        List<Sql> before = new ArrayList<>();
        List<Sql> after = new ArrayList<>();
        Set<String> noop = new HashSet<>();
        if (poisonFails) {
            refusePoison(batch);
            String raise = misbehaviour(batch, before, after, noop);
            if (raise != null) {
                throw new IllegalStateException(raise);
            }
        }
        try (Statement st = conn.createStatement()) {
            if (poisonFails && batch.stream().anyMatch(d -> text(d).startsWith("commit-poison"))) {
                st.execute(COMMIT_POISON);
            }
            if (delayMs > 0) {
                st.execute("SELECT pg_sleep(" + (delayMs / 1000.0) + ")");
            }
            run(st, before);
        }
        try (PreparedStatement ps = conn.prepareStatement(INSERT_EFFECT)) {
            int rows = 0;
            for (Delivery d : batch) {
                if (!noop.contains(d.key())) {
                    ps.setString(1, d.key());
                    ps.setInt(2, d.position().partition());
                    ps.setString(3, consumer);
                    ps.addBatch();
                    rows++;
                }
            }
            if (rows > 0) {
                ps.executeBatch();
            }
        }
        try (Statement st = conn.createStatement()) {
            run(st, after);
        }
    }

    private static void run(Statement st, List<Sql> statements) throws SQLException {
        for (Sql s : statements) {
            try {
                st.execute(s.text());
            } catch (SQLException e) {
                if (!s.ignoreError()) {
                    throw e;
                }
            }
        }
    }

    private static void refusePoison(List<Delivery> batch) {
        for (Delivery d : batch) {
            String v = text(d);
            if (v.startsWith("poison")) {
                throw new IllegalArgumentException("poison: cannot apply " + d.key());
            }
            if (v.startsWith("flaky ")) {
                int n = Integer.parseInt(v.split(" ")[1]);
                String k = d.position().topic() + "/" + d.key();
                int failed = FLAKY.getOrDefault(k, 0);
                if (failed < n) {
                    FLAKY.put(k, failed + 1);
                    throw new IllegalArgumentException("flaky: failure " + (failed + 1) + " of " + n + " of " + d.key());
                }
            }
        }
    }

    /** Fills in the statements before and after the effects; returns the error to raise, if any. */
    private static String misbehaviour(List<Delivery> batch, List<Sql> before, List<Sql> after, Set<String> noop) {
        String raise = null;
        for (Delivery d : batch) {
            String[] words = text(d).split(" ");
            String behaviour = words[0].replace('-', '_');
            if (!BEHAVIOURS.contains(behaviour)) {
                continue;
            }
            switch (behaviour) {
                case "savepoint" -> {
                    before.add(new Sql("SAVEPOINT s", false));
                    before.add(new Sql("SELECT 1/0", true));
                    before.add(new Sql("ROLLBACK TO SAVEPOINT s", false));
                }
                case "noop" -> noop.add(d.key());
                case "self_commit" -> after.add(new Sql("COMMIT", false));
                case "self_rollback" -> after.add(new Sql("ROLLBACK", false));
                default -> {
                    if (misbehaves(d, Integer.parseInt(words[1]))) {
                        switch (behaviour) {
                            case "raise" -> raise = "raise: the handler raised on " + d.key();
                            case "contend" -> before.add(new Sql(CONTEND, false));
                            case "slow" -> before.add(new Sql("SELECT pg_sleep(30)", false));
                            default -> after.add(new Sql("SELECT 1/0", true));
                        }
                    }
                }
            }
        }
        return raise;
    }

    private static boolean misbehaves(Delivery d, int times) {
        String k = d.position().topic() + "/" + d.key();
        synchronized (MISBEHAVED) {
            int done = MISBEHAVED.getOrDefault(k, 0);
            if (done >= times) {
                return false;
            }
            MISBEHAVED.put(k, done + 1);
            return true;
        }
    }
}
