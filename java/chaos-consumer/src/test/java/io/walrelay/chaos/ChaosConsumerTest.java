package io.walrelay.chaos;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** ChaosConsumer's Kafka configuration: its defaults and {@code --kafka} properties. */
class ChaosConsumerTest {
    private static final String SECRET = "s3cret-never-shown";

    @Test
    void kafkaPropertiesAddToAndOverrideTheDefaultsWithSecretsResolved() {
        Map<String, Object> kafka = ChaosConsumer.kafkaConfig("127.0.0.1:9093", "chaos-java", List.of(
                "security.protocol=SASL_SSL",
                "sasl.mechanism=OAUTHBEARER",
                "sasl.oauthbearer.client.credentials.client.secret=env:KAFKA_CLIENT_SECRET",
                "sasl.oauthbearer.scope=kafka orders",
                "session.timeout.ms=10000"), Map.of("KAFKA_CLIENT_SECRET", SECRET)::get);
        assertEquals("127.0.0.1:9093", kafka.get("bootstrap.servers"));
        assertEquals("chaos-java", kafka.get("group.id"));
        assertEquals("SASL_SSL", kafka.get("security.protocol"));
        assertEquals(SECRET, kafka.get("sasl.oauthbearer.client.credentials.client.secret"));
        assertEquals("kafka orders", kafka.get("sasl.oauthbearer.scope"));
        assertEquals("10000", kafka.get("session.timeout.ms"));
        assertEquals("1000", kafka.get("heartbeat.interval.ms"));
    }

    @Test
    void aPropertyWithoutAValueOrAMissingSecretIsRefusedWithoutShowingIt() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> ChaosConsumer.kafkaConfig(
                "b", "g", List.of("sasl.jaas.config:" + SECRET), n -> null));
        assertFalse(e.getMessage().contains(SECRET), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> ChaosConsumer.kafkaConfig(
                "b", "g", List.of("sasl.jaas.config=env:KAFKA_JAAS_CONFIG"), n -> null));
        assertTrue(e.getMessage().contains("environment variable KAFKA_JAAS_CONFIG is not set"), e.getMessage());
    }
}
