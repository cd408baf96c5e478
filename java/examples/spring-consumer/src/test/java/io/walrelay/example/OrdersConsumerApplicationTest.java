package io.walrelay.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import io.walrelay.consumer.conformance.TestKafka;
import io.walrelay.consumer.conformance.TestPostgres;
import io.walrelay.consumer.spring.WalrelayConsumer;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.WebApplicationType;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * The example service as a user runs it: the Spring Boot application with
 * its one bean, against a real PostgreSQL and Apache Kafka node. It applies
 * a topic of walrelay records (with replayed copies, as after a relay
 * crash) exactly once, stops cleanly with its context, and a second start
 * picks up the new records from its marks without applying any again.
 */
@Tag("integration")
class OrdersConsumerApplicationTest {
    private static final String TOPIC = "orders";
    private static final int PARTITIONS = 2;
    private static TestPostgres pg;
    private static TestKafka kafka;

    @BeforeAll
    static void startServers() throws Exception {
        pg = new TestPostgres();
        kafka = new TestKafka();
        kafka.createTopic(TOPIC, PARTITIONS);
    }

    @AfterAll
    static void stopServers() {
        if (kafka != null) {
            kafka.close();
        }
        if (pg != null) {
            pg.close();
        }
    }

    /** Event {@code i}'s idempotency key (commit LSN high, position low: increasing in i). */
    static String key(int i) {
        return String.format("%016x%016x", 0x1000L + i, 0x1000L + i);
    }

    /** Events {@code from..to} as the relay writes them: partition i % 2, each naming its predecessor. */
    static void publish(KafkaProducer<byte[], byte[]> producer, int from, int to) throws Exception {
        for (int i = from; i < to; i++) {
            int partition = i % PARTITIONS;
            byte[] k = key(i).getBytes(StandardCharsets.US_ASCII);
            ProducerRecord<byte[], byte[]> r = new ProducerRecord<>(TOPIC, partition, k, ("order " + i).getBytes());
            r.headers().add("idempotency-key", k).add("walrelay-source", "db/slot".getBytes());
            if (i >= PARTITIONS) {
                r.headers().add("walrelay-prev-key", key(i - PARTITIONS).getBytes(StandardCharsets.US_ASCII));
            } else {
                r.headers().add("walrelay-prev", new byte[0]);
            }
            producer.send(r).get();
        }
    }

    static KafkaProducer<byte[], byte[]> producer() {
        Properties p = new Properties();
        p.put("bootstrap.servers", kafka.bootstrap());
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static ConfigurableApplicationContext start(String url) {
        SpringApplication app = new SpringApplication(OrdersConsumerApplication.class);
        app.setWebApplicationType(WebApplicationType.NONE);
        return app.run("--spring.datasource.url=" + url, "--walrelay.bootstrap-servers=" + kafka.bootstrap(),
                "--walrelay.topic=" + TOPIC, "--walrelay.group=billing");
    }

    static long query(String url, String sql) throws SQLException {
        try (Connection c = DriverManager.getConnection(url); Statement st = c.createStatement();
                ResultSet rs = st.executeQuery(sql)) {
            rs.next();
            return rs.getLong(1);
        }
    }

    static void awaitEffects(String url, long n) throws Exception {
        long deadline = System.currentTimeMillis() + 90_000;
        long seen = -1;
        while (System.currentTimeMillis() < deadline) {
            seen = query(url, "SELECT count(*) FROM effects");
            if (seen >= n) {
                return;
            }
            Thread.sleep(100);
        }
        throw new AssertionError("the service applied " + seen + " of " + n + " events in 90 s");
    }

    static Map<Integer, String> marks(String url) throws SQLException {
        Map<Integer, String> out = new HashMap<>();
        try (Connection c = DriverManager.getConnection(url); Statement st = c.createStatement();
                ResultSet rs = st.executeQuery("SELECT partition, hwm FROM walrelay_consumer_hwm "
                        + "WHERE consumer_group = 'billing' AND topic = 'orders' AND source = 'db/slot'")) {
            while (rs.next()) {
                out.put(rs.getInt(1), rs.getString(2));
            }
        }
        return out;
    }

    @Test
    void theServiceAppliesEveryEventOnceAcrossReplaysAndARestart() throws Exception {
        String url = pg.createDatabase();
        try (KafkaProducer<byte[], byte[]> producer = producer()) {
            publish(producer, 0, 300);
            // A relay replay after a crash: the first 100 again (same keys).
            publish(producer, 0, 100);
            try (ConfigurableApplicationContext context = start(url)) {
                awaitEffects(url, 300);
                // The replayed copies come after the originals in each
                // partition: once the marks reach the last keys, all were seen.
                awaitMarks(url, 299);
                assertNull(context.getBean(WalrelayConsumer.class).failure());
            }
            assertEquals(300, query(url, "SELECT count(*) FROM effects"));
            assertEquals(300, query(url, "SELECT count(DISTINCT event_key) FROM effects"));

            // Restarted: the marks, not the offsets alone, keep replays out.
            publish(producer, 300, 340);
            publish(producer, 250, 340);
            try (ConfigurableApplicationContext context = start(url)) {
                awaitEffects(url, 340);
                awaitMarks(url, 339);
                assertNull(context.getBean(WalrelayConsumer.class).failure());
            }
        }
        assertEquals(340, query(url, "SELECT count(*) FROM effects"));
        assertEquals(340, query(url, "SELECT count(DISTINCT event_key) FROM effects"));
        List<Long> perPartition = new ArrayList<>();
        for (int p = 0; p < PARTITIONS; p++) {
            perPartition.add(query(url, "SELECT count(*) FROM effects WHERE partition = " + p));
        }
        assertEquals(List.of(170L, 170L), perPartition);
    }

    /** Waits until partition marks stand at the keys of events {@code last - 1} and {@code last}. */
    static void awaitMarks(String url, int last) throws Exception {
        Map<Integer, String> want = Map.of(last % PARTITIONS, key(last), (last - 1) % PARTITIONS, key(last - 1));
        long deadline = System.currentTimeMillis() + 90_000;
        Map<Integer, String> seen = Map.of();
        while (System.currentTimeMillis() < deadline) {
            seen = marks(url);
            if (seen.equals(want)) {
                return;
            }
            Thread.sleep(100);
        }
        throw new AssertionError("marks " + seen + ", expected " + want);
    }
}
