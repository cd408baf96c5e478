package io.walrelay.consumer.spring;

import io.walrelay.consumer.BatchHandler;
import io.walrelay.consumer.ConsumerLoop;
import io.walrelay.consumer.Migration;
import io.walrelay.consumer.PartitionsStoppedException;
import io.walrelay.consumer.RecordHandler;
import io.walrelay.consumer.Settings;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.List;
import java.util.Map;
import javax.sql.DataSource;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.springframework.context.SmartLifecycle;

/**
 * A walrelay consumer as a Spring bean: started with the application
 * context (migrating the consumers' tables first), stopped cleanly with it.
 * Handlers run in {@link SpringTransactionScope}, so a service writes its
 * effects with its {@code JdbcTemplate} in the transaction that raises the
 * marks.
 *
 * <pre>{@code
 * @Bean
 * WalrelayConsumer orders(DataSource ds, JdbcTemplate jdbc) {
 *     return WalrelayConsumer.batches(kafka, List.of("orders"), ds, Settings.DEFAULT,
 *             (conn, batch) -> jdbc.batchUpdate("INSERT ...", rows(batch)));
 * }
 * }</pre>
 */
public final class WalrelayConsumer implements SmartLifecycle {
    private static final Logger LOG = LoggerFactory.getLogger(WalrelayConsumer.class);
    private final ConsumerLoop loop;
    private final DataSource dataSource;
    private final Body body;
    private volatile Thread thread;
    private volatile Exception failure;

    private interface Body {
        void run(ConsumerLoop loop) throws PartitionsStoppedException;
    }

    private WalrelayConsumer(Map<String, Object> kafka, List<String> topics, DataSource dataSource, Settings settings,
            Body body) {
        this.dataSource = dataSource;
        this.loop = new ConsumerLoop(kafka, topics, dataSource, settings)
                .withHandlerScope(new SpringTransactionScope(dataSource));
        this.body = body;
    }

    /** A consumer whose handler gets each batch's new records at once. */
    public static WalrelayConsumer batches(Map<String, Object> kafka, List<String> topics, DataSource dataSource,
            Settings settings, BatchHandler handler) {
        return new WalrelayConsumer(kafka, topics, dataSource, settings, l -> l.runBatches(handler));
    }

    /** A consumer whose handler gets one new record at a time. */
    public static WalrelayConsumer records(Map<String, Object> kafka, List<String> topics, DataSource dataSource,
            Settings settings, RecordHandler handler) {
        return new WalrelayConsumer(kafka, topics, dataSource, settings, l -> l.run(handler));
    }

    /** The loop, for its counters or a Micrometer registry ({@link ConsumerLoop#withMeterRegistry}). */
    public ConsumerLoop loop() {
        return loop;
    }

    /** What ended the loop (stopped partitions, a fatal Kafka error), or null. */
    public Exception failure() {
        return failure;
    }

    @Override
    public synchronized void start() {
        if (thread != null) {
            return;
        }
        try (Connection c = dataSource.getConnection()) {
            Migration.migrate(c);
        } catch (SQLException e) {
            throw new IllegalStateException("migrating walrelay's consumer tables failed", e);
        }
        Thread t = new Thread(() -> {
            try {
                body.run(loop);
            } catch (Exception e) {
                failure = e;
                LOG.error("the walrelay consumer loop ended: {}", e.getMessage(), e);
            }
        }, "walrelay-consumer");
        thread = t;
        t.start();
    }

    @Override
    public synchronized void stop() {
        Thread t = thread;
        if (t == null) {
            return;
        }
        loop.stop();
        try {
            t.join(60_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        thread = null;
    }

    @Override
    public boolean isRunning() {
        Thread t = thread;
        return t != null && t.isAlive();
    }
}
