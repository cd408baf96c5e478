package io.walrelay.consumer.conformance;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

/**
 * One combined (broker and controller) KRaft node of Apache Kafka on free
 * ports, from {@code $WALRELAY_KAFKA_HOME} or target/tools/kafka-4.1.1
 * (scripts/install-kafka.sh), configured as the Python tests' brokers.py
 * and the Rust test kit configure theirs.
 */
public final class TestKafka implements AutoCloseable {
    static final String VERSION = "4.1.1";
    final int port;
    private final Path dir;
    private final Servers.Watched process;

    public TestKafka() throws IOException {
        Path home = home();
        String java = System.getenv("JAVA_HOME") != null ? Path.of(System.getenv("JAVA_HOME"), "bin", "java").toString() : "java";
        List<String> jvm = List.of("-XX:+UseSerialGC", "-Djava.awt.headless=true",
                "-Dlog4j2.configurationFile=" + home.resolve("config/log4j2.properties"), "-cp", home.resolve("libs") + "/*");
        dir = Files.createTempDirectory("walrelay-java-kafka-");
        Path log = dir.resolve("kafka.log");
        for (int attempt = 0; attempt < 4; attempt++) {
            int broker = Servers.freePort();
            int controller = Servers.freePort();
            Path props = dir.resolve("server.properties");
            Files.writeString(props, properties(broker, controller, dir.resolve("data")));
            List<String> format = new ArrayList<>(List.of(java, "-Xmx256m"));
            format.addAll(jvm);
            format.addAll(List.of("kafka.tools.StorageTool", "format", "--ignore-formatted", "-t", clusterId(), "-c", props.toString()));
            Servers.run(format, dir);
            List<String> start = new ArrayList<>(List.of(java, "-Xms64m", "-Xmx512m"));
            start.addAll(jvm);
            start.addAll(List.of("kafka.Kafka", props.toString()));
            Servers.Watched w = new Servers.Watched(start, dir, log);
            if (awaitMetadata(bootstrap(broker), w.process, 90_000)) {
                port = broker;
                process = w;
                return;
            }
            w.kill();
            Files.createDirectories(dir);
        }
        throw new IllegalStateException("Apache Kafka did not start; its log ended:\n" + Servers.tail(log));
    }

    static Path home() {
        String env = System.getenv("WALRELAY_KAFKA_HOME");
        Path home = env != null && !env.isEmpty() ? Path.of(env) : Servers.repo().resolve("target/tools/kafka-" + VERSION);
        if (!home.isAbsolute()) {
            home = Servers.repo().resolve(home);
        }
        if (!Files.isRegularFile(home.resolve("config/log4j2.properties"))) {
            throw new IllegalStateException("Apache Kafka is not installed at " + home
                    + ": run scripts/install-kafka.sh (or set WALRELAY_KAFKA_HOME to the directory it printed)");
        }
        return home;
    }

    static String clusterId() {
        byte[] raw = new byte[16];
        ThreadLocalRandom.current().nextBytes(raw);
        raw[0] &= 0x7f;
        return Base64.getUrlEncoder().withoutPadding().encodeToString(raw);
    }

    static String properties(int broker, int controller, Path data) {
        Map<String, String> s = new java.util.LinkedHashMap<>();
        s.put("process.roles", "broker,controller");
        s.put("node.id", "1");
        s.put("controller.quorum.voters", "1@" + Servers.HOST + ":" + controller);
        s.put("listeners", "PLAINTEXT://" + Servers.HOST + ":" + broker + ",CONTROLLER://" + Servers.HOST + ":" + controller);
        s.put("advertised.listeners", "PLAINTEXT://" + Servers.HOST + ":" + broker);
        s.put("controller.listener.names", "CONTROLLER");
        s.put("inter.broker.listener.name", "PLAINTEXT");
        s.put("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT");
        s.put("log.dirs", data.toString());
        s.put("offsets.topic.replication.factor", "1");
        s.put("transaction.state.log.replication.factor", "1");
        s.put("transaction.state.log.min.isr", "1");
        s.put("share.coordinator.state.topic.replication.factor", "1");
        s.put("share.coordinator.state.topic.min.isr", "1");
        s.put("group.initial.rebalance.delay.ms", "0");
        // The consumer protocol's session and heartbeat are the broker's:
        // 3 s and 1 s, as docs/operations.md says to set for a static member
        // restarted under the same instance id to apply again within 5 s.
        s.put("group.consumer.min.session.timeout.ms", "3000");
        s.put("group.consumer.session.timeout.ms", "3000");
        s.put("group.consumer.min.heartbeat.interval.ms", "1000");
        s.put("group.consumer.heartbeat.interval.ms", "1000");
        StringBuilder out = new StringBuilder();
        s.forEach((k, v) -> out.append(k).append('=').append(v).append('\n'));
        return out.toString();
    }

    static String bootstrap(int port) {
        return Servers.HOST + ":" + port;
    }

    public String bootstrap() {
        return bootstrap(port);
    }

    private static boolean awaitMetadata(String bootstrap, Process p, long millis) {
        long deadline = System.currentTimeMillis() + millis;
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("request.timeout.ms", "2000");
        props.put("default.api.timeout.ms", "2000");
        try (Admin admin = Admin.create(props)) {
            while (System.currentTimeMillis() < deadline) {
                if (!p.isAlive()) {
                    return false;
                }
                try {
                    if (!admin.describeCluster().nodes().get(2, TimeUnit.SECONDS).isEmpty()) {
                        return true;
                    }
                } catch (Exception e) {
                    Thread.sleep(100);
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return false;
    }

    public void createTopic(String name, int partitions) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap());
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(List.of(new NewTopic(name, partitions, (short) 1))).all().get(20, TimeUnit.SECONDS);
            long deadline = System.currentTimeMillis() + 20_000;
            while (System.currentTimeMillis() < deadline) {
                TopicDescription d = describeOrNull(admin, name);
                if (d != null && d.partitions().size() == partitions && d.partitions().stream().allMatch(p -> p.leader() != null)) {
                    return;
                }
                Thread.sleep(50);
            }
        }
        throw new IllegalStateException("topic " + name + " did not get " + partitions + " partitions with leaders");
    }

    /**
     * The topic's description, or null while the broker answering has not yet seen the topic's metadata: right
     * after CreateTopics a KRaft broker may still answer UNKNOWN_TOPIC_OR_PARTITION for it.
     */
    private static TopicDescription describeOrNull(Admin admin, String name) throws Exception {
        try {
            return admin.describeTopics(Set.of(name)).allTopicNames().get(5, TimeUnit.SECONDS).get(name);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof UnknownTopicOrPartitionException) {
                return null;
            }
            throw e;
        }
    }

    @Override
    public void close() {
        process.kill();
    }
}
