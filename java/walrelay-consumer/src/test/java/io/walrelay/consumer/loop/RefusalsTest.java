package io.walrelay.consumer.loop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Optional;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class RefusalsTest {
    private static final long SECOND = TimeUnit.SECONDS.toNanos(1);

    @Test
    void retriesBackOffToTheCapAndWarningsAreRateLimited() {
        Refusals r = new Refusals();
        long t0 = 1_000 * SECOND;
        Refusals.Retry first = r.refused(t0, "m-1", "in use");
        assertEquals(Refusals.FIRST_RETRY_MILLIS, first.waitMillis());
        String text = first.log().orElseThrow();
        assertTrue(text.contains("m-1") && text.contains("consumer.session.timeout.ms"), text);
        Refusals.Retry second = r.refused(t0 + SECOND, "m-1", "in use");
        assertEquals(Refusals.RETRY_CAP_MILLIS, second.waitMillis());
        assertEquals(Optional.empty(), second.log());
        Refusals.Retry later = r.refused(t0 + Refusals.LOG_EVERY_NANOS + SECOND, "m-1", "in use");
        String again = later.log().orElseThrow();
        assertTrue(again.contains("3 attempts over 31s"), again);
    }

    @Test
    void joiningReportsTheWaitAndStartsOver() {
        Refusals r = new Refusals();
        long t0 = 1_000 * SECOND;
        assertEquals(Optional.empty(), r.joined(t0));
        r.refused(t0, "m", "x");
        r.refused(t0 + SECOND / 4, "m", "x");
        assertEquals(2, r.count());
        assertEquals(Optional.of(2000L), r.joined(t0 + 2 * SECOND));
        assertEquals(0, r.count());
        Refusals.Retry next = r.refused(t0 + 3 * SECOND, "m", "x");
        assertEquals(Refusals.FIRST_RETRY_MILLIS, next.waitMillis());
        assertTrue(next.log().isPresent(), "a new run of refusals is logged at once");
    }
}
