package io.walrelay.consumer.conformance;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The consumer conformance suite, JVM side: every scenario of
 * conformance/scenarios.json (played by the Rust crate and the Python
 * package too) against a real PostgreSQL and Apache Kafka node this class
 * starts, one dynamic test per scenario and consumer group protocol
 * ({@code $WALRELAY_GROUP_PROTOCOL}: classic, consumer, or both), each in its
 * own database, topic and group. Unknown actions and fields are refused, so a scenario added there
 * fails here until it is implemented (conformance/README.md).
 */
@Tag("integration")
class ConformanceTest {
    static final JsonNode FILE = read();
    static TestPostgres postgres;
    static TestKafka kafka;

    static JsonNode read() {
        try {
            return new ObjectMapper().readTree(Servers.repo().resolve(Path.of("conformance", "scenarios.json")).toFile());
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    @BeforeAll
    static void servers() throws Exception {
        Assumptions.assumeFalse("skip".equals(System.getenv("WALRELAY_JAVA_CONFORMANCE")),
                "WALRELAY_JAVA_CONFORMANCE=skip");
        postgres = new TestPostgres();
        kafka = new TestKafka();
    }

    @AfterAll
    static void stopServers() {
        if (kafka != null) {
            kafka.close();
        }
        if (postgres != null) {
            postgres.close();
        }
    }

    @Test
    void theFileIsOneThisRunnerUnderstands() {
        World.checkFields("scenarios.json", FILE, Set.of("about", "key_format", "defaults", "scenarios"), Set.of());
        assertEquals("{0x100 + seq:016x}{partition:016x}", FILE.get("key_format").asText());
        World.checkFields("defaults", FILE.get("defaults"),
                Set.of("partitions", "max_batch_records", "commit_interval_ms", "retry", "on_poison"), Set.of());
        Set<String> names = new HashSet<>();
        for (JsonNode s : FILE.get("scenarios")) {
            World.checkFields("scenario " + s.path("name").asText(), s, Set.of("name", "doc", "steps", "expect"), Set.of("brokers"));
            assertTrue(names.add(s.get("name").asText()), "scenario names repeat: " + s.get("name"));
            for (JsonNode b : s.path("brokers")) {
                assertTrue(Set.of("kafka", "tansu").contains(b.asText()), "unknown broker " + b);
            }
        }
        AssertionError e = assertThrows(AssertionError.class,
                () -> World.checkAction(new ObjectMapper().readTree("{\"do\": \"teleport\"}")));
        assertTrue(e.getMessage().contains("unknown action \"teleport\""), e.getMessage());
        assertEquals("00000000000001050000000000000001", Ledger.key(1, 5));
    }

    @TestFactory
    Stream<DynamicTest> scenarios() {
        List<DynamicTest> tests = new ArrayList<>();
        // Each protocol of $WALRELAY_GROUP_PROTOCOL, on the same servers.
        for (String protocol : Servers.groupProtocols()) {
            for (JsonNode scenario : FILE.get("scenarios")) {
                tests.add(DynamicTest.dynamicTest(scenario.get("name").asText() + " (" + protocol + " protocol)",
                        () -> play(scenario, protocol)));
            }
        }
        return tests.stream();
    }

    private static void play(JsonNode scenario, String protocol) throws Exception {
        if (scenario.has("brokers")) {
            boolean kafkaListed = false;
            for (JsonNode b : scenario.get("brokers")) {
                kafkaListed |= b.asText().equals("kafka");
            }
            Assumptions.assumeTrue(kafkaListed, "played on " + scenario.get("brokers") + " only");
        }
        try (World world = new World(scenario, FILE.get("defaults"), kafka, postgres, protocol)) {
            int i = 0;
            for (JsonNode step : scenario.get("steps")) {
                i++;
                try {
                    world.step(step);
                } catch (AssertionError e) {
                    throw new AssertionError("step " + i + " " + step + ": " + e.getMessage(), e);
                }
            }
            world.assertNothingRunning();
            world.check(scenario.get("expect"));
        }
    }
}
