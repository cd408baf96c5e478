package io.walrelay.consumer.loop;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class PhaseClockTest {
    /** Records what the clock reports. */
    static final class Seen implements LoopMetrics {
        final Map<Phase, Double> seconds = new EnumMap<>(Phase.class);

        @Override
        public void phaseSeconds(Phase phase, double s) {
            seconds.merge(phase, s, Double::sum);
        }
    }

    static final long S = 1_000_000_000L;

    @Test
    void eachPartitionAddsOneSecondPerSecondToItsPhase() {
        Seen seen = new Seen();
        PhaseClock clock = new PhaseClock(seen, 0);
        PartitionState ready = PartitionStateTest.filled(1);
        PartitionState idle = PartitionStateTest.filled();
        PartitionState idle2 = PartitionStateTest.filled();
        clock.snapshot(List.of(ready, idle, idle2), 0);
        clock.tick(2 * S);
        assertEquals(Map.of(Phase.POOL, 2.0, Phase.POLLING, 4.0), seen.seconds);
        ready.inFlight = true;
        clock.snapshot(List.of(ready, idle), 2 * S);
        clock.tick(3 * S);
        assertEquals(1.0, seen.seconds.get(Phase.IN_FLIGHT));
        assertEquals(5.0, seen.seconds.get(Phase.POLLING));
        // The batch's own split: the rest of its run is commit time.
        clock.job(S / 4, S / 2, S);
        assertEquals(0.25, seen.seconds.get(Phase.CONNECTING));
        assertEquals(0.5, seen.seconds.get(Phase.HANDLER));
        assertEquals(0.25, seen.seconds.get(Phase.COMMIT));
    }
}
