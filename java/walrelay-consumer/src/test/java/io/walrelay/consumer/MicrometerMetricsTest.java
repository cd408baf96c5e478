package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import io.walrelay.consumer.loop.Phase;
import org.junit.jupiter.api.Test;

class MicrometerMetricsTest {
    @Test
    void micrometerGetsTheRustCratesNames() {
        SimpleMeterRegistry registry = new SimpleMeterRegistry();
        Counters counters = new Counters();
        MicrometerMetrics m = new MicrometerMetrics(registry, counters);
        m.phaseSeconds(Phase.HANDLER, 1.5);
        m.phaseSeconds(Phase.HANDLER, 0.5);
        m.lag("t", 2, 5);
        counters.processed.addAndGet(7);
        assertEquals(2.0, registry.get("walrelay_consumer_partition_seconds").tag("phase", "handler").counter().count());
        assertEquals(0.0, registry.get("walrelay_consumer_partition_seconds").tag("phase", "pool").counter().count());
        assertEquals(5.0, registry.get("walrelay_consumer_lag_records").tags("topic", "t", "partition", "2").gauge().value());
        assertEquals(7.0, registry.get("walrelay_consumer_records_applied").functionCounter().count(),
                "the totals are read from the loop's counters");
    }
}
