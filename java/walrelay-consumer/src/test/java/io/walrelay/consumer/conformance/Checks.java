package io.walrelay.consumer.conformance;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/** A scenario's final checks (conformance/README.md, "Final checks"). */
final class Checks {
    private Checks() {}

    static void check(World w, JsonNode expect) throws Exception {
        World.checkFields("expect", expect, Set.of("effects", "marks", "parked"), Set.of("not_applied"));
        List<int[]> leftOut = new ArrayList<>();
        for (JsonNode n : expect.path("not_applied")) {
            World.checkFields("not_applied", n, Set.of("partition", "seq"), Set.of());
            leftOut.add(new int[] {n.get("partition").asInt(), n.get("seq").asInt()});
        }
        for (JsonNode p : expect.get("parked")) {
            World.checkFields("parked", p, Set.of("partition", "seq"), Set.of("attempts"));
            leftOut.add(new int[] {p.get("partition").asInt(), p.get("seq").asInt()});
        }
        Map<String, Integer> effects = new HashMap<>();
        Set<List<String>> marks = new HashSet<>();
        List<List<Object>> parked = new ArrayList<>();
        try (Connection c = DriverManager.getConnection(w.url)) {
            try (ResultSet rs = c.createStatement().executeQuery("SELECT event_key, count(*) FROM effects GROUP BY event_key")) {
                while (rs.next()) {
                    effects.put(rs.getString(1), rs.getInt(2));
                }
            }
            try (PreparedStatement ps = c.prepareStatement("SELECT partition, source, hwm FROM walrelay_consumer_hwm "
                    + "WHERE consumer_group = ? AND topic = ?")) {
                ps.setString(1, w.group);
                ps.setString(2, w.topic);
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        marks.add(List.of(Integer.toString(rs.getInt(1)), rs.getString(2), rs.getString(3)));
                    }
                }
            }
            try (ResultSet rs = c.createStatement().executeQuery("SELECT partition, idempotency_key, attempts FROM "
                    + "walrelay_consumer_parked ORDER BY partition, kafka_offset, id")) {
                while (rs.next()) {
                    parked.add(List.of(rs.getInt(1), rs.getString(2), rs.getInt(3)));
                }
            }
        }
        List<String> twice = effects.entrySet().stream().filter(e -> e.getValue() > 1).map(Map.Entry::getKey).toList();
        assertTrue(twice.isEmpty(), "applied more than once: " + twice);
        int total = effects.values().stream().mapToInt(Integer::intValue).sum();
        JsonNode want = expect.get("effects");
        Set<String> wantKeys = w.ledger.expectedEffects(leftOut);
        int wantTotal = want.isTextual() ? wantKeys.size() : want.asInt();
        assertEquals(wantTotal, total, "effects rows");
        Set<String> missing = new TreeSet<>(wantKeys);
        missing.removeAll(effects.keySet());
        Set<String> unexpected = new TreeSet<>(effects.keySet());
        unexpected.removeAll(wantKeys);
        assertTrue(missing.isEmpty() && unexpected.isEmpty(), "effects: missing " + missing + ", unexpected " + unexpected);
        if (!expect.get("marks").isNull()) {
            Set<List<String>> wantMarks = new HashSet<>();
            for (JsonNode m : expect.get("marks")) {
                World.checkFields("mark", m, Set.of("partition", "source", "seq"), Set.of());
                int partition = m.get("partition").asInt();
                Integer seq = m.get("seq").isTextual() && m.get("seq").asText().equals("last")
                        ? w.ledger.last(m.get("source").asText(), partition) : Integer.valueOf(m.get("seq").asInt());
                assertTrue(seq != null, "nothing produced for mark " + m);
                wantMarks.add(List.of(Integer.toString(partition), m.get("source").asText(), Ledger.key(partition, seq)));
            }
            assertEquals(wantMarks, marks, "marks");
        }
        List<List<Object>> wantParked = new ArrayList<>();
        for (JsonNode p : expect.get("parked")) {
            int partition = p.get("partition").asInt();
            wantParked.add(List.of(partition, Ledger.key(partition, p.get("seq").asInt()),
                    p.has("attempts") ? p.get("attempts").asInt() : -1));
        }
        boolean matches = parked.size() == wantParked.size();
        for (int i = 0; matches && i < parked.size(); i++) {
            List<Object> g = parked.get(i), x = wantParked.get(i);
            matches = g.get(0).equals(x.get(0)) && g.get(1).equals(x.get(1)) && ((Integer) x.get(2) == -1 || g.get(2).equals(x.get(2)));
        }
        assertTrue(matches, "parked (partition, key, attempts): expected " + wantParked + ", got " + parked);
    }
}
