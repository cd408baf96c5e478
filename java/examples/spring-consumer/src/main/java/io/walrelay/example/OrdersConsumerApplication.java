package io.walrelay.example;

import io.walrelay.consumer.Delivery;
import io.walrelay.consumer.OnPoison;
import io.walrelay.consumer.Settings;
import io.walrelay.consumer.spring.WalrelayConsumer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import javax.sql.DataSource;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.jdbc.core.JdbcTemplate;

/**
 * A Spring Boot service that applies a walrelay topic exactly once: one bean
 * (the consumer) and one method (the handler), which writes with the
 * application's JdbcTemplate inside the batch's transaction.
 *
 * <pre>
 * java -jar ... --spring.datasource.url=jdbc:postgresql://db/app?user=app \
 *     --walrelay.bootstrap-servers=kafka:9092 --walrelay.topic=orders --walrelay.group=billing \
 *     [--walrelay.instance-id=orders-0]
 * </pre>
 *
 * <p>{@code walrelay.instance-id} (or {@code WALRELAY_INSTANCE_ID}) makes the
 * service a static group member ({@code group.instance.id}): each running
 * instance needs its own id, stable across its restarts, such as a
 * StatefulSet pod's name (docs/consumer.md, "Static group membership").
 */
@SpringBootApplication
public class OrdersConsumerApplication {
    public static void main(String[] args) {
        SpringApplication.run(OrdersConsumerApplication.class, args);
    }

    @Bean
    WalrelayConsumer ordersConsumer(DataSource dataSource, JdbcTemplate jdbc,
            @Value("${walrelay.bootstrap-servers}") String bootstrap, @Value("${walrelay.topic}") String topic,
            @Value("${walrelay.group}") String group, @Value("${walrelay.consumer-name:spring}") String name,
            @Value("${walrelay.instance-id:}") String instanceId) {
        jdbc.execute("CREATE TABLE IF NOT EXISTS effects (event_key text NOT NULL, partition int NOT NULL, "
                + "consumer text NOT NULL)");
        Map<String, Object> kafka = new HashMap<>(Map.of("bootstrap.servers", bootstrap, "group.id", group,
                "session.timeout.ms", "6000", "heartbeat.interval.ms", "1000"));
        if (!instanceId.isBlank()) {
            kafka.put("group.instance.id", instanceId);
        }
        return WalrelayConsumer.batches(kafka, List.of(topic), dataSource,
                Settings.DEFAULT.withOnPoison(OnPoison.PARK), (conn, batch) -> apply(jdbc, batch, name));
    }

    /** The handler: one row per new record, in the transaction that raises the marks. */
    static void apply(JdbcTemplate jdbc, List<Delivery> batch, String name) {
        List<Object[]> rows = new ArrayList<>(batch.size());
        for (Delivery d : batch) {
            rows.add(new Object[] {d.key(), d.position().partition(), name});
        }
        jdbc.batchUpdate("INSERT INTO effects (event_key, partition, consumer) VALUES (?, ?, ?)", rows);
    }
}
