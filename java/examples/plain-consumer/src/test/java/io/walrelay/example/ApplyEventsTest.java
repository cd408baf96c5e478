package io.walrelay.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.walrelay.consumer.OnPoison;
import io.walrelay.consumer.Settings;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** ApplyEvents's flags: the library's settings, and {@code --kafka} properties. */
class ApplyEventsTest {
    private static final String SECRET = "s3cret-never-shown";

    @Test
    void theSettingsFlagsSetTheLibrarysSettings() {
        Settings s = ApplyEvents.settings(Map.of("--pool-size", "2", "--max-batch-records", "50",
                "--max-batch-bytes", "65536", "--handler-timeout-ms", "1500", "--on-poison", "park",
                "--commit-interval-ms", "2000"));
        assertEquals(2, s.poolSize());
        assertEquals(50, s.maxBatchRecords());
        assertEquals(65536, s.maxBatchBytes());
        assertEquals(Duration.ofMillis(1500), s.handlerTimeout());
        assertEquals(OnPoison.PARK, s.onPoison());
        assertEquals(Duration.ofSeconds(2), s.commitInterval());
        Settings defaults = ApplyEvents.settings(Map.of());
        assertEquals(Settings.DEFAULT.poolSize(), defaults.poolSize());
        assertNull(defaults.handlerTimeout());
    }

    @Test
    void kafkaPropertiesTakeTheFirstEqualsSign() {
        Map<String, Object> kafka = new HashMap<>();
        ApplyEvents.putKafkaProperty(kafka, "sasl.jaas.config=" + jaas());
        ApplyEvents.putKafkaProperty(kafka, "sasl.oauthbearer.scope=kafka orders");
        assertEquals(jaas(), kafka.get("sasl.jaas.config"));
        assertEquals("kafka orders", kafka.get("sasl.oauthbearer.scope"));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> ApplyEvents.putKafkaProperty(kafka, "sasl.oauthbearer.client.credentials.client.secret:" + SECRET));
        assertFalse(e.getMessage().contains(SECRET), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> ApplyEvents.putKafkaProperty(kafka, "linger.ms"));
        assertTrue(e.getMessage().contains("'linger.ms'"), e.getMessage());
    }

    static String jaas() {
        return "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId=\"billing\" "
                + "clientSecret=\"" + SECRET + "\" scope=\"kafka\";";
    }
}
