package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

class GroupProtocolTest {
    @Test
    void classicIsTheDefaultAndTakesTheClientSessionSettings() {
        assertEquals(GroupProtocol.CLASSIC, GroupProtocol.of(Map.of("session.timeout.ms", "6000")));
        assertEquals(GroupProtocol.CLASSIC,
                GroupProtocol.of(Map.of("group.protocol", "classic", "heartbeat.interval.ms", "1000")));
        assertEquals(GroupProtocol.CONSUMER,
                GroupProtocol.of(Map.of("group.protocol", "CONSUMER", "group.instance.id", "a")));
    }

    @Test
    void theConsumerProtocolRefusesEachClientSideGroupSettingNamingTheFix() {
        Map<String, String> fixes = Map.of(
                "session.timeout.ms", "consumer.session.timeout.ms",
                "heartbeat.interval.ms", "consumer.heartbeat.interval.ms",
                "partition.assignment.strategy", "group.remote.assignor");
        fixes.forEach((key, fix) -> {
            Map<String, Object> config = new HashMap<>(Map.of("group.protocol", "consumer", key, "1"));
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> GroupProtocol.of(config));
            assertTrue(e.getMessage().contains(key + " is not allowed with group.protocol=consumer"), e.getMessage());
            assertTrue(e.getMessage().contains(fix), e.getMessage());
        });
    }

    @Test
    void theLoopRefusesSuchAConfigurationWhenBuilt() {
        Map<String, Object> kafka = Map.of("bootstrap.servers", "x", "group.id", "g", "group.protocol", "consumer",
                "session.timeout.ms", "6000");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> new ConsumerLoop(kafka, java.util.List.of("t"), null, Settings.DEFAULT));
        assertTrue(e.getMessage().contains("session.timeout.ms"), e.getMessage());
    }
}
