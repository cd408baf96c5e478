package io.walrelay.bench;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Fills a new topic with records shaped as the relay writes them by default
 * (the lean header set: {@code idempotency-key}, {@code walrelay-source},
 * {@code walrelay-layout}, {@code walrelay-prev}), for timing the Java
 * consumers without relaying real WAL first ({@code run-ab.sh}).
 *
 * <pre>
 * java -cp CP io.walrelay.bench.Fill BOOTSTRAP TOPIC PARTITIONS RECORDS [PAYLOAD_BYTES]
 * </pre>
 *
 * <p>Keys rise with the record's number across the topic, so they rise
 * strictly within each partition; each record's {@code walrelay-prev} is the
 * key sent before it to the same partition (empty for a partition's first),
 * so a consumer sees no gap. Records go round-robin over the partitions.
 */
public final class Fill {
    /** The keys' high 64 bits: a commit LSN's worth, as the relay's. */
    static final long HIGH = 0x16b374d848L;
    static final String SOURCE = "7312345678901234567/bench/walrelay_bench";
    static final String FINGERPRINT = "a1b2c3d4e5f60718";

    private Fill() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 4 && args.length != 5) {
            System.err.println("usage: Fill BOOTSTRAP TOPIC PARTITIONS RECORDS [PAYLOAD_BYTES]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        long records = Long.parseLong(args[3]);
        int payloadBytes = args.length == 5 ? Integer.parseInt(args[4]) : 200;
        createTopic(bootstrap, topic, partitions);
        produce(bootstrap, topic, partitions, records, payloadBytes);
        System.out.println("filled " + topic + " " + partitions + " " + records);
    }

    static void createTopic(String bootstrap, String topic, int partitions) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
        }
    }

    static void produce(String bootstrap, String topic, int partitions, long records, int payloadBytes)
            throws Exception {
        Map<String, Object> config = new HashMap<>();
        config.put("bootstrap.servers", bootstrap);
        config.put("acks", "all");
        config.put("linger.ms", "20");
        config.put("batch.size", String.valueOf(256 * 1024));
        config.put("enable.idempotence", "true");
        byte[] source = ascii(SOURCE);
        String[] prev = new String[partitions];
        Arrays.fill(prev, "");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(config, new ByteArraySerializer(),
                new ByteArraySerializer())) {
            for (long i = 0; i < records; i++) {
                int p = (int) (i % partitions);
                long low = i + 1;
                String key = String.format("%016x%016x", HIGH, low);
                List<org.apache.kafka.common.header.Header> headers = new ArrayList<>(4);
                headers.add(new RecordHeader("idempotency-key", ascii(key)));
                headers.add(new RecordHeader("walrelay-source", source));
                headers.add(new RecordHeader("walrelay-layout", ascii(p + "/" + partitions + "/" + FINGERPRINT)));
                headers.add(new RecordHeader("walrelay-prev", ascii(prev[p])));
                prev[p] = Long.toHexString(HIGH) + "/" + Long.toHexString(low);
                producer.send(new ProducerRecord<>(topic, p, null, ascii("order-" + (i % 1000)),
                        payload(i, payloadBytes), headers));
            }
            producer.flush();
        }
    }

    /** {@code n} bytes of JSON-ish text naming record {@code i}. */
    static byte[] payload(long i, int n) {
        StringBuilder s = new StringBuilder(n);
        s.append("{\"seq\":").append(i).append(",\"pad\":\"");
        while (s.length() < n - 2) {
            s.append('x');
        }
        s.append("\"}");
        return ascii(s.toString());
    }

    private static byte[] ascii(String s) {
        return s.getBytes(StandardCharsets.US_ASCII);
    }
}
