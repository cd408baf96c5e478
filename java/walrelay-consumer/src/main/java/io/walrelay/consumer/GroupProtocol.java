package io.walrelay.consumer;

import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;

/**
 * The consumer group protocol a configuration asks for
 * ({@code group.protocol}), and the client settings that Kafka 4's
 * {@code consumer} protocol (KIP-848) does not take: under it the session
 * timeout and heartbeat interval are the group's (broker side) and the
 * broker assigns the partitions.
 *
 * <p>The loop leaves {@code group.protocol} to the caller: the client's
 * default, {@code classic}, works with every broker and lets a restarted
 * static member take its partitions back at once.
 */
public enum GroupProtocol {
    /** The classic protocol (the client's default). */
    CLASSIC,
    /** Kafka 4's consumer group protocol (KIP-848). */
    CONSUMER;

    /** Client settings refused with {@code group.protocol=consumer}, and what to do instead. */
    static final Map<String, String> NOT_WITH_CONSUMER_PROTOCOL = notWithConsumerProtocol();

    private static Map<String, String> notWithConsumerProtocol() {
        Map<String, String> m = new LinkedHashMap<>();
        m.put("session.timeout.ms", "the session timeout is the group's under this protocol: set the group's "
                + "consumer.session.timeout.ms (kafka-configs --entity-type groups), or the brokers' "
                + "group.consumer.session.timeout.ms, and remove session.timeout.ms");
        m.put("heartbeat.interval.ms", "the heartbeat interval is the group's under this protocol: set the group's "
                + "consumer.heartbeat.interval.ms, or the brokers' group.consumer.heartbeat.interval.ms, "
                + "and remove heartbeat.interval.ms");
        m.put("partition.assignment.strategy", "the broker assigns the partitions under this protocol: remove it, "
                + "and set group.remote.assignor (uniform or range) if you need another assignor than the broker's "
                + "default");
        return Map.copyOf(m);
    }

    /**
     * The protocol of {@code kafka} ({@code classic} when unset).
     *
     * @throws IllegalArgumentException with {@code group.protocol=consumer}
     *     and a client setting it does not take, naming what to set instead
     */
    public static GroupProtocol of(Map<String, Object> kafka) {
        Object p = kafka.get("group.protocol");
        if (p == null || !p.toString().toLowerCase(Locale.ROOT).equals("consumer")) {
            return CLASSIC;
        }
        for (String key : new String[] {"session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"}) {
            if (kafka.containsKey(key)) {
                throw new IllegalArgumentException("the Kafka setting " + key
                        + " is not allowed with group.protocol=consumer: " + NOT_WITH_CONSUMER_PROTOCOL.get(key));
            }
        }
        return CONSUMER;
    }
}
