package io.walrelay.consumer.conformance;

import io.walrelay.consumer.ConsumerLoop;
import io.walrelay.consumer.Settings;
import java.sql.PreparedStatement;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * A consumer service as a separate process, for the scenarios that kill it
 * (python/tests/consumer_process.py's twin): applies records into
 * {@code effects} with the batch handler.
 *
 * <pre>java ... ConsumerProcess BOOTSTRAP TOPIC JDBC_URL GROUP NAME COMMIT_INTERVAL_MS [INSTANCE_ID]</pre>
 */
public final class ConsumerProcess {
    private ConsumerProcess() {}

    /** The line printed once the JVM is up and the loop is built, before it joins the group. */
    static final String READY = "consumer process ready";

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], url = args[2], group = args[3], name = args[4];
        long interval = Long.parseLong(args[5]);
        Map<String, Object> kafka = new HashMap<>();
        kafka.put("bootstrap.servers", bootstrap);
        kafka.put("group.id", group);
        // The protocol of the scenario that started it (World.startProcess).
        Servers.groupSettings(kafka, args.length <= 6, Servers.groupProtocols().get(0));
        if (args.length > 6) {
            kafka.put("group.instance.id", args[6]);
        }
        ConsumerLoop loop = new ConsumerLoop(kafka, List.of(topic), TestPostgres.dataSource(url),
                Settings.DEFAULT.withCommitInterval(Duration.ofMillis(interval)));
        Runtime.getRuntime().addShutdownHook(new Thread(loop::stop));
        // Started: World.startProcess waits for this line, so that a scenario's
        // deadlines time the consumer, not the JVM's start.
        System.out.println(READY);
        System.out.flush();
        loop.runBatches((conn, batch) -> {
            try (PreparedStatement ps = conn.prepareStatement(Handlers.INSERT_EFFECT)) {
                for (var d : batch) {
                    ps.setString(1, d.key());
                    ps.setInt(2, d.position().partition());
                    ps.setString(3, name);
                    ps.addBatch();
                }
                ps.executeBatch();
            }
        });
        System.out.println("stopped cleanly");
    }
}
