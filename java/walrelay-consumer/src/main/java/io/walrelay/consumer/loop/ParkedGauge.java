package io.walrelay.consumer.loop;

import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code walrelay_consumer_parked_records}: the group's rows in the
 * dead-letter table, read when the loop starts and every 10 s on a
 * connection of its own ({@code sql/consumer/parked_count.sql}).
 */
final class ParkedGauge implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");
    private final ScheduledExecutorService timer;

    private ParkedGauge(ScheduledExecutorService timer) {
        this.timer = timer;
    }

    static ParkedGauge start(ConnectionPool pool, BatchLayer layer, String group, LoopMetrics metrics) {
        ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "walrelay-parked-gauge");
            t.setDaemon(true);
            return t;
        });
        timer.scheduleWithFixedDelay(() -> read(pool, layer, group, metrics), 0, 10, TimeUnit.SECONDS);
        return new ParkedGauge(timer);
    }

    private static void read(ConnectionPool pool, BatchLayer layer, String group, LoopMetrics metrics) {
        ConnectionPool.Lease lease = null;
        boolean keep = false;
        try {
            lease = pool.take();
            metrics.parkedRecords(layer.parkedRows(lease.conn(), group));
            keep = true;
        } catch (Exception e) {
            LOG.debug("reading walrelay_consumer_parked's count: {}", e.toString());
        } finally {
            if (lease != null) {
                pool.give(lease, keep);
            }
        }
    }

    @Override
    public void close() {
        timer.shutdownNow();
    }
}
